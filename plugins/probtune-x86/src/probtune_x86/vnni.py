"""AVX-512 VNNI: 8-bit products summed in int32, 16 outputs x 4 terms per instruction (``vpdpbusd``).

A reduction ``C[..., j] += int32(A[..., k]) * int32(B[..., k, ..., j])``
with ``A`` unsigned and ``B`` signed 8-bit (a quantized convolution in NHWC
or matrix product) maps onto ``vpdpbusd``: 16 int32 lanes of ``j``, each
adding the dot product of four consecutive ``k`` of ``A`` (one 32-bit
broadcast) with four of ``B``. ``vnni-dot-product`` splits ``j`` by 16 and
``k`` by 4, tiles the other loops as multi-level tiling does (sampled
perfect tiles, structure ``SSRSRS``, the write-back under a sampled tile),
and marks the 16 x 4 nest for the intrinsic (``rewrite-cpu-tensorize``
replaces it). ``B`` is copied into the blocked layout the instruction reads,
``[..., j // 16, k // 4, j % 16, k % 4]`` (``rewrite-vnni-layout``): for a
model's constant weight the copy is made once, when the model is compiled.

A block of other types or extents (a depthwise convolution, whose sum runs
over no channel; 3 input channels) is left to multi-level tiling.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

from probtune.plugin import (
    REDUCTION,
    SPATIAL,
    BlockRV,
    LoopRV,
    Schedule,
    SpaceContext,
    at_root,
    indexing_dims,
    last_line,
    loop_kinds,
    sblock_names,
)
from probtune_cpu.llvm_features import llvm_target_has
from probtune_cpu.multi_level_tiling import WRITE_BACK_DEPTH_KEY, order_levels, write_back_per_tile
from probtune_cpu.tensorize import TENSORIZE_KEY

__all__ = [
    "VNNI_INTRINSIC",
    "VNNI_LAYOUT_KEY",
    "VNNI_LLVM_NAME",
    "RewriteVNNILayout",
    "VNNIDotProduct",
    "VNNIPlan",
    "blocked_layout",
    "register_vnni_intrinsic",
    "vnni_plan",
]

LANES, DEPTH = 16, 4
"""``vpdpbusd`` on zmm registers: 16 int32 sums, each of 4 products of bytes."""

VNNI_LLVM_NAME = "llvm.x86.avx512.vpdpbusd.512"
"""LLVM's name of ``vpdpbusd`` on zmm registers."""

VNNI_INTRINSIC = "probtune_x86.vnni_u8s8_16x4"
"""The tensor intrinsic's name in TVM's table (:func:`register_vnni_intrinsic`)."""

VNNI_LAYOUT_KEY = "probtune_x86.vnni_layout"
"""Block annotation on ``B``'s copy: the dimension of ``k`` times 16 plus the dimension of ``j``, to be blocked."""


@functools.cache
def register_vnni_intrinsic() -> str:
    """Register the intrinsic (TVM's own description; ``vpdpbusd`` as this LLVM declares it, on bytes) once."""
    from tvm.s_tir import TensorIntrin
    from tvm.s_tir.tensor_intrin.x86 import dot_product_16x4_u8i8i32_desc
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def vpdpbusd(
        A: T.Buffer((4,), "uint8", offset_factor=1),  # type: ignore[valid-type]
        B: T.Buffer((16, 4), "int8", offset_factor=1),  # type: ignore[valid-type]
        C: T.Buffer((16,), "int32", offset_factor=1),  # type: ignore[valid-type]
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            a = T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "uint8x4"), dtype="int32"), 16), dtype="int8x64")
            C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(VNNI_LLVM_NAME),
                C.vload([0], dtype="int32x16"),
                a,
                B.vload([0, 0], dtype="int8x64"),
                dtype="int32x16",
            )

    if TensorIntrin.get(VNNI_INTRINSIC, allow_missing=True) is None:
        TensorIntrin.register(VNNI_INTRINSIC, dot_product_16x4_u8i8i32_desc, vpdpbusd)
    return VNNI_INTRINSIC


@dataclass(frozen=True)
class VNNIPlan:
    """How a block maps onto ``vpdpbusd``."""

    a: int  # read index of the unsigned operand
    b: int  # read index of the signed one
    lanes_loop: int  # index among the block's loops of j
    depth_loop: int  # ... and of k
    b_dims: tuple[int, int]  # dimensions of B indexed by k and j


def _operand(value: tirx.PrimExpr, dtype: str) -> tirx.Buffer | None:
    """The buffer ``value`` loads from, when it is ``int32(load)`` of a ``dtype`` buffer."""
    if isinstance(value, tirx.Cast) and isinstance(value.value, TensorLoad) and str(value.value.source.dtype) == dtype:
        return value.value.source
    return None


def _byte_operands(sblock: s_tir.SBlock) -> tuple[int, int] | None:
    """Read indices of A and B when the block is ``C = C + int32(A) * int32(B)``, A unsigned and B signed bytes."""
    store = sblock.body
    if sblock.init is None or not isinstance(store, tirx.BufferStore) or str(store.buffer.dtype) != "int32":
        return None
    value = store.value
    if not (isinstance(value, tirx.Add) and isinstance(value.a, TensorLoad) and value.a.source.same_as(store.buffer)):
        return None
    if not isinstance(value.b, tirx.Mul):
        return None
    a, b = _operand(value.b.a, "uint8"), _operand(value.b.b, "int8")
    reads = [region.source for region in sblock.reads]
    a_index = next((i for i, s in enumerate(reads) if a is not None and s.same_as(a)), None)
    b_index = next((i for i, s in enumerate(reads) if b is not None and s.same_as(b)), None)
    return None if a_index is None or b_index is None else (a_index, b_index)


def vnni_plan(raw: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> VNNIPlan | None:
    """How the block maps onto ``vpdpbusd``, or None where it does not.

    ``j``, the innermost spatial loop, must index only the output's last
    dimension and one of B's; ``k``, the innermost reduction loop, only A's
    last dimension and another of B's; their extents whole multiples of 16 and 4.
    """
    sblock = raw.get(block)
    operands = _byte_operands(sblock)
    loops = raw.get_loops(block)
    kinds = loop_kinds(raw, block, loops)
    if operands is None or SPATIAL not in kinds or REDUCTION not in kinds:
        return None
    a, b = operands
    j = max(i for i, kind in enumerate(kinds) if kind == SPATIAL)
    k = max(i for i, kind in enumerate(kinds) if kind == REDUCTION)
    extents = [raw.get(loop).extent for loop in loops]
    if any(not isinstance(e, tirx.IntImm) for e in extents) or int(extents[j]) % LANES or int(extents[k]) % DEPTH:
        return None
    along_j, along_k = indexing_dims(raw, block, loops[j]), indexing_dims(raw, block, loops[k])
    if (
        along_j.get(("write", 0)) != [len(sblock.writes[0].region) - 1]
        or ("read", a) in along_j
        or along_k.get(("read", a)) != [len(sblock.reads[a].region) - 1]
        or len(along_j.get(("read", b), [])) != 1
        or len(along_k.get(("read", b), [])) != 1
        or not all(isinstance(r.min, tirx.Var) and int(r.extent) == 1 for r in sblock.reads[b].region)
    ):
        return None
    return VNNIPlan(a, b, j, k, (along_k[("read", b)][0], along_j[("read", b)][0]))


@dataclass(frozen=True)
class VNNIDotProduct:
    """Tile a u8 x s8 -> int32 reduction around ``vpdpbusd`` (see the module docstring).

    Only where the target's CPU has VNNI (its ``mcpu``, asked of LLVM): in another target's space it does nothing.
    """

    name: str = "vnni-dot-product"
    structure: str = "SSRSRS"
    max_innermost_factor: int = 16
    write_back_levels: tuple[int, ...] = (1, 2)

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> None:
        raw, block_rv = sch.tvm, sch.resolve(block)
        if not at_root(raw, block_rv) or not llvm_target_has(dict(ctx.target.tvm_target), "avx512vnni"):
            return
        plan = vnni_plan(raw, block_rv)
        if plan is None:
            return
        register_vnni_intrinsic()
        loops = sch.get_loops(block)
        kinds = loop_kinds(raw, block_rv, [sch.resolve(loop) for loop in loops])
        loops[plan.lanes_loop], lanes_loop = sch.split(loops[plan.lanes_loop], [None, LANES])
        loops[plan.depth_loop], depth_loop = sch.split(loops[plan.depth_loop], [None, DEPTH])
        order, level_ends = self._tile(sch, loops, kinds)
        sch.reorder(*order, lanes_loop, depth_loop)
        copy = sch.cache_read(block, plan.b, "global")
        sch.annotate(copy, VNNI_LAYOUT_KEY, plan.b_dims[0] * LANES + plan.b_dims[1])
        # the write-back is judged on the block's own elements, then moved onto the tile that replaces it at the root
        written_back = write_back_per_tile(sch, block, [level_ends[level - 1] for level in self.write_back_levels])
        tile = sch.blockize(lanes_loop)
        sch.annotate(tile, TENSORIZE_KEY, VNNI_INTRINSIC)
        if written_back is not None:
            sch.unannotate(block, WRITE_BACK_DEPTH_KEY)
            sch.annotate(tile, WRITE_BACK_DEPTH_KEY, written_back)

    def _tile(self, sch: Schedule, loops: list[LoopRV], kinds: list[str]) -> tuple[list[LoopRV], list[int]]:
        """Each loop split into sampled perfect tiles, one per level of ``structure`` of its kind; the tiles in
        level order, and how many of them are at or above each level."""
        levels: dict[str, list[list[LoopRV]]] = {
            SPATIAL: [[] for _ in range(self.structure.count("S"))],
            REDUCTION: [[] for _ in range(self.structure.count("R"))],
        }
        for loop, kind in zip(loops, kinds):
            tiles = sch.sample_perfect_tile(loop, len(levels[kind]), self.max_innermost_factor)
            for level, tile in zip(levels[kind], sch.split(loop, tiles)):
                level.append(tile)
        return order_levels(levels, self.structure)


@dataclass(frozen=True)
class RewriteVNNILayout:
    """Lay each annotated copy of ``B`` out in the blocks ``vpdpbusd`` reads: ``[..., j // 16, k // 4, j % 16, k % 4]``."""

    name: str = "rewrite-vnni-layout"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        for name in [n for n in sblock_names(sch) if VNNI_LAYOUT_KEY in sch.get(sch.get_sblock(n)).annotations]:
            block = sch.get_sblock(name)
            code = int(sch.get(block).annotations[VNNI_LAYOUT_KEY])
            sch.unannotate(block, VNNI_LAYOUT_KEY)
            k_dim, j_dim = divmod(code, LANES)
            index_map = blocked_layout(k_dim, j_dim, sch.get(block).writes[0].source.shape)
            try:
                sch.transform_layout(block, ("write", 0), index_map)
            except RuntimeError as exc:  # TVM schedule errors
                return f"block {name}: {last_line(exc)}"
        return None



def blocked_layout(k_dim: int, j_dim: int, shape: list) -> tirx.IndexMap:
    """``[..., j, ..., k, ...]`` (any order) as ``[the other dimensions..., j // 16, k // 4, j % 16, k % 4]``."""

    def blocked(*x: tirx.PrimExpr) -> list[tirx.PrimExpr]:
        rest = [v for d, v in enumerate(x) if d not in (k_dim, j_dim)]
        return [*rest, x[j_dim] // LANES, x[k_dim] // DEPTH, x[j_dim] % LANES, x[k_dim] % DEPTH]

    return tirx.IndexMap.from_func(blocked, ndim=len(shape), index_dtype=str(shape[0].ty))
