"""Reductions tiled around an x86 dot-product instruction: ``lanes`` sums, each of ``depth`` products per instruction.

A reduction ``C[..., j] += acc(A[..., k]) * acc(B[..., k, ..., j])`` maps
onto such an instruction (VNNI's ``vpdpbusd``, AVX512-BF16's ``vdpbf16ps``):
``lanes`` accumulators of ``j``, each adding the dot product of ``depth``
consecutive ``k`` of ``A`` (one 32-bit broadcast) with ``depth`` of ``B``.
:class:`DotProductTiling` splits ``j`` by ``lanes`` and ``k`` by ``depth``,
tiles the other loops as multi-level tiling does (sampled perfect tiles,
structure ``SSRSRS``, the write-back under a sampled tile), and marks the
inner nest for the instruction's tensor intrinsic (``rewrite-cpu-tensorize``
replaces it). ``B`` is copied into the blocked layout the instruction reads,
``[..., j // lanes, k // depth, j % lanes, k % depth]``
(:class:`RewriteDotLayout`): for a model's constant weight the copy is made
once, when the model is compiled.

A block of other types or extents (a depthwise convolution, whose sum runs
over no channel; 3 input channels) is left to multi-level tiling.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tvm import DataType, s_tir, tirx
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
from probtune_cpu.multi_level_tiling import (
    OFF_REGISTER_TILE_WEIGHT,
    REGISTER_TILE,
    WRITE_BACK_DEPTH_KEY,
    order_levels,
    write_back_per_tile,
)
from probtune_cpu.tensorize import TENSORIZE_KEY
from probtune_cpu.vector_unit import vector_register_bytes

__all__ = [
    "DotInstruction",
    "DotPlan",
    "DotProductTiling",
    "RewriteDotLayout",
    "blocked_layout",
    "dot_plan",
    "kept_accumulator_bytes",
]


@dataclass(frozen=True)
class DotInstruction:
    """An instruction summing ``depth`` products into each of ``lanes`` accumulators, as a tensor intrinsic."""

    intrinsic: str  # the tensor intrinsic's name in TVM's table
    register: Callable[[], str]  # registers it (once) and returns ``intrinsic``
    llvm_feature: str  # the CPU feature it needs, LLVM's name
    accumulator: str  # the sums' type
    a_dtype: str  # the operand broadcast ``depth`` at a time
    b_dtype: str  # the operand read ``lanes x depth`` at a time
    lanes: int
    depth: int
    layout_key: str  # block annotation on B's copy: dimension of k times ``lanes`` plus dimension of j


@dataclass(frozen=True)
class DotPlan:
    """How a block maps onto a dot-product instruction."""

    a: int  # read index of the broadcast operand
    b: int  # read index of the blocked one
    lanes_loop: int  # index among the block's loops of j
    depth_loop: int  # ... and of k
    b_dims: tuple[int, int]  # dimensions of B indexed by k and j


def _operand(value: tirx.PrimExpr, accumulator: str) -> tirx.Buffer | None:
    """The buffer ``value`` loads from, when it is ``accumulator(load)`` of a buffer of another type."""
    if (
        isinstance(value, tirx.Cast)
        and str(value.ty) == accumulator
        and isinstance(value.value, TensorLoad)
        and str(value.value.source.dtype) != accumulator
    ):
        return value.value.source
    return None


def _operand_pairs(sblock: s_tir.SBlock, instruction: DotInstruction) -> list[tuple[int, int]]:
    """Read indices (A, B) that the block ``C = C + acc(x) * acc(y)`` may have, by the instruction's operand types."""
    store = sblock.body
    if sblock.init is None or not isinstance(store, tirx.BufferStore) or str(store.buffer.dtype) != instruction.accumulator:
        return []
    value = store.value
    if not (isinstance(value, tirx.Add) and isinstance(value.a, TensorLoad) and value.a.source.same_as(store.buffer)):
        return []
    if not isinstance(value.b, tirx.Mul):
        return []
    x, y = _operand(value.b.a, instruction.accumulator), _operand(value.b.b, instruction.accumulator)
    reads = [region.source for region in sblock.reads]
    pairs = []
    for a, b in ((x, y), (y, x)):
        if a is None or b is None or (str(a.dtype), str(b.dtype)) != (instruction.a_dtype, instruction.b_dtype):
            continue
        a_index = next((i for i, s in enumerate(reads) if s.same_as(a)), None)
        b_index = next((i for i, s in enumerate(reads) if s.same_as(b)), None)
        if a_index is not None and b_index is not None and (a_index, b_index) not in pairs:
            pairs.append((a_index, b_index))
    return pairs


def dot_plan(raw: s_tir.Schedule, block: s_tir.schedule.SBlockRV, instruction: DotInstruction) -> DotPlan | None:
    """How the block maps onto ``instruction``, or None where it does not.

    ``j``, the innermost spatial loop, must index only the output's last
    dimension and one of B's; ``k``, the innermost reduction loop, only A's
    last dimension and another of B's; their extents whole multiples of ``lanes`` and ``depth``.
    """
    sblock = raw.get(block)
    pairs = _operand_pairs(sblock, instruction)
    loops = raw.get_loops(block)
    kinds = loop_kinds(raw, block, loops)
    if not pairs or SPATIAL not in kinds or REDUCTION not in kinds:
        return None
    j = max(i for i, kind in enumerate(kinds) if kind == SPATIAL)
    k = max(i for i, kind in enumerate(kinds) if kind == REDUCTION)
    extents = [raw.get(loop).extent for loop in loops]
    if any(not isinstance(e, tirx.IntImm) for e in extents):
        return None
    if int(extents[j]) % instruction.lanes or int(extents[k]) % instruction.depth:
        return None
    along_j, along_k = indexing_dims(raw, block, loops[j]), indexing_dims(raw, block, loops[k])
    for a, b in pairs:
        if (
            along_j.get(("write", 0)) == [len(sblock.writes[0].region) - 1]
            and ("read", a) not in along_j
            and along_k.get(("read", a)) == [len(sblock.reads[a].region) - 1]
            and len(along_j.get(("read", b), [])) == 1
            and len(along_k.get(("read", b), [])) == 1
            and all(isinstance(r.min, tirx.Var) and int(r.extent) == 1 for r in sblock.reads[b].region)
        ):
            return DotPlan(a, b, j, k, (along_k[("read", b)][0], along_j[("read", b)][0]))
    return None


@dataclass(frozen=True)
class DotProductTiling:
    """Tile a reduction around ``instruction`` (see the module docstring).

    Only where the target's CPU has the instruction (its ``mcpu``, asked of LLVM): in another target's space it
    does nothing.
    """

    name: str
    instruction: DotInstruction
    structure: str = "SSRSRS"
    max_innermost_factor: int = 16
    write_back_levels: tuple[int, ...] = (1, 2)
    register_tile: tuple[float, float] = REGISTER_TILE
    off_register_tile_weight: float = OFF_REGISTER_TILE_WEIGHT

    def prior(self, sch: s_tir.Schedule, ctx: SpaceContext) -> float:
        """Favour fresh draws whose instruction tiles keep ``register_tile`` of the target's vector registers as
        accumulators (:func:`kept_accumulator_bytes`); another keeps a draw with probability
        ``off_register_tile_weight``. The programs near the best of a tuning keep that many sums, while most random
        draws keep fewer or far more (bench/results/NOTES.md)."""
        low, high = (share * vector_register_bytes(ctx.target) for share in self.register_tile)
        weight = 1.0
        for name in sblock_names(sch):
            block = sch.get_sblock(name)
            if sch.get(block).annotations.get(TENSORIZE_KEY) == self.instruction.intrinsic:
                tile = kept_accumulator_bytes(sch, block)
                if tile is not None and not low <= tile <= high:
                    weight *= self.off_register_tile_weight
        return weight

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> None:
        raw, block_rv, op = sch.tvm, sch.resolve(block), self.instruction
        if not at_root(raw, block_rv) or not llvm_target_has(dict(ctx.target.tvm_target), op.llvm_feature):
            return
        plan = dot_plan(raw, block_rv, op)
        if plan is None:
            return
        op.register()
        loops = sch.get_loops(block)
        kinds = loop_kinds(raw, block_rv, [sch.resolve(loop) for loop in loops])
        loops[plan.lanes_loop], lanes_loop = sch.split(loops[plan.lanes_loop], [None, op.lanes])
        loops[plan.depth_loop], depth_loop = sch.split(loops[plan.depth_loop], [None, op.depth])
        order, level_ends = self._tile(sch, loops, kinds)
        sch.reorder(*order, lanes_loop, depth_loop)
        copy = sch.cache_read(block, plan.b, "global")
        sch.annotate(copy, op.layout_key, plan.b_dims[0] * op.lanes + plan.b_dims[1])
        # the write-back is judged on the block's own elements, then moved onto the tile that replaces it at the root
        written_back = write_back_per_tile(sch, block, [level_ends[level - 1] for level in self.write_back_levels])
        tile = sch.blockize(lanes_loop)
        sch.annotate(tile, TENSORIZE_KEY, op.intrinsic)
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


def kept_accumulator_bytes(sch: s_tir.Schedule, tile: s_tir.schedule.SBlockRV) -> int | None:
    """Bytes of sums an instruction tile block keeps across its reduction: the output it updates under its
    write-back (a buffer that small stays in registers), or, without one, under its first reduction level. None where
    an extent is not constant."""
    loops = sch.get_loops(tile)
    kinds = loop_kinds(sch, tile, loops)
    written = sch.get(tile).writes[0]
    extents = [sch.get(loop).extent for loop in loops]
    if not all(isinstance(extent, tirx.IntImm) for extent in [*extents, *(r.extent for r in written.region)]):
        return None
    depth = sch.get(tile).annotations.get(WRITE_BACK_DEPTH_KEY)
    if depth is None:
        first = kinds.index(REDUCTION) if REDUCTION in kinds else len(kinds)
        depth = next((i for i in range(first, len(kinds)) if kinds[i] != REDUCTION), len(kinds))
    elements = 1
    for extent, kind in list(zip(extents, kinds))[int(depth):]:
        if kind == SPATIAL:
            elements *= int(extent)
    for extent in written.region:
        elements *= int(extent.extent)
    return elements * DataType(written.source.dtype).bits // 8


@dataclass(frozen=True)
class RewriteDotLayout:
    """Lay each copy of ``B`` annotated for ``instruction`` out in the blocks it reads:
    ``[..., j // lanes, k // depth, j % lanes, k % depth]``.

    It also registers the instruction's tensor intrinsic, which ``rewrite-cpu-tensorize`` looks up next: a program
    is finished in whichever process realizes it (a helper replays the trace without the tiling that registered it).
    """

    name: str
    instruction: DotInstruction

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        key, lanes, depth = self.instruction.layout_key, self.instruction.lanes, self.instruction.depth
        annotated = [n for n in sblock_names(sch) if key in sch.get(sch.get_sblock(n)).annotations]
        if annotated:
            self.instruction.register()
        for name in annotated:
            block = sch.get_sblock(name)
            k_dim, j_dim = divmod(int(sch.get(block).annotations[key]), lanes)
            sch.unannotate(block, key)
            index_map = blocked_layout(k_dim, j_dim, sch.get(block).writes[0].source.shape, lanes, depth)
            try:
                sch.transform_layout(block, ("write", 0), index_map)
            except RuntimeError as exc:  # TVM schedule errors
                return f"block {name}: {last_line(exc)}"
        return None


def blocked_layout(k_dim: int, j_dim: int, shape: list, lanes: int, depth: int) -> tirx.IndexMap:
    """``[..., j, ..., k, ...]`` (any order) as ``[the other dimensions..., j // lanes, k // depth, j % lanes, k % depth]``."""

    def blocked(*x: tirx.PrimExpr) -> list[tirx.PrimExpr]:
        rest = [v for d, v in enumerate(x) if d not in (k_dim, j_dim)]
        return [*rest, x[j_dim] // lanes, x[k_dim] // depth, x[j_dim] % lanes, x[k_dim] % depth]

    return tirx.IndexMap.from_func(blocked, ndim=len(shape), index_dtype=str(shape[0].ty))

