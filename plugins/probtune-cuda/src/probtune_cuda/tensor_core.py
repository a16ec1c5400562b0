"""Tensor-core tiling: a float16 or int8 matmul-like block computed by warps with TVM's WMMA intrinsics.

A convolution is first rewritten as one matmul
(:mod:`probtune_cuda.reindex`). A block whose loops are not whole 16-wide
tiles is then padded (``pad_einsum``, an instruction this plugin adds):
the copies into shared memory read zeros past the inputs' ends, the copy
out skips the padding.
Each 16x16x16 tile (int8 on ``mma.sync``: 16x16x32) becomes a block (``blockize``),
which ``rewrite-tensorize`` replaces by the WMMA multiply-accumulate after
the search (the initialisation by the fragment fill). The tiles are then
spread as MetaSchedule spreads them: structure ``SSRRSRS``, the first
spatial level fused and bound to ``blockIdx.x``, the second to
``threadIdx.y`` (one warp per value; its 32 lanes run every intrinsic
together, so ``threadIdx.x`` is the lane). Each input is copied into shared
memory under the outermost reduction tile by all the block's threads, then
loaded into fragments per warp under the middle one; the accumulators are
stored into shared memory per warp and copied from there to the output by
all threads, finishing the block's elementwise epilogue (a cast to float16,
a bias and an activation) on the way. The outer reduction loop may be
software-pipelined (:mod:`probtune_cuda.software_pipeline`), and the tiles
run by ``mma.sync`` instead of WMMA (:mod:`probtune_cuda.mma`).

Tile sizes, copy widths, the pipelining and the instruction are sampled;
whether a block is tensorized and the shape of its nest depend only on the
program and the target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import TensorIntrin
from tvm.s_tir.schedule.analysis import get_tensorize_loop_mapping

from probtune.plugin import (
    REDUCTION,
    SPATIAL,
    BlockRV,
    ExprRV,
    LoopRV,
    Schedule,
    SpaceContext,
    as_list,
    at_root,
    block_names,
    identity,
    is_spatial,
    loop_kinds,
    nested_sblocks,
    realize_of,
    thread_tag,
)
from probtune_cuda.blocks import unbound
from probtune_cuda.instructions import PAD_EINSUM
from probtune_cuda.intrinsics import TENSORIZE_INIT_KEY, TENSORIZE_KEY, WARP_EXECUTION_KEY, load_tensor_intrinsics
from probtune_cuda.limits import block_limit, compute_capability
from probtune_cuda.mma import INSTRUCTION_KEY, TILE_K_KEY, WMMA_TILE, instruction_choices, tile_k_choices
from probtune_cuda.multi_level_tiling import COOPERATIVE_FETCH_KEY, SHARED, elementwise_consumer
from probtune_cuda.reindex import TRANSFORM_TO_INTRINSIC, contiguous_widths, transform_to_intrinsic
from probtune_cuda.software_pipeline import NO_PIPELINE, PIPELINE_KEY, REGISTER_STAGED, loop_buffers, pipeline_choices
from probtune_cuda.split_reduction import bind_partial_sums, split_choices

__all__ = [
    "WMMA_MIN_ARCH",
    "IntrinGroup",
    "TensorCoreTiling",
    "WMMAPlan",
    "lane_registers",
    "shared_memory_bytes",
    "threads_per_block",
    "warp_accumulator_fragments",
    "wmma_plan",
]

WMMA_MIN_ARCH = 70
"""WMMA needs Volta (sm_70) or later."""

TILE = WMMA_TILE  # a tile's rows, columns and, but for int8 on mma.sync, depth

_ACCUMULATORS = {"float16": ("float32", "float16"), "int8": ("int32",)}  # input dtype -> accumulator dtypes WMMA has
_OUTER_REDUCTION_DEPTH = 2  # the outer block's loops: block, warp, then the outer reduction tile (one reduction loop)
_SHARED_ROW_PAD = {"float16": 8, "int8": 16}  # elements added to each shared row: 16 bytes, which spreads the banks


@dataclass(frozen=True)
class IntrinGroup:
    """The WMMA intrinsics of one input and accumulator type: names registered in TVM's tensor-intrinsic table."""

    compute: str
    init: str
    load_a: str
    load_b: str
    store: str


@dataclass(frozen=True)
class WMMAPlan:
    """How a block maps onto WMMA: its intrinsics, its loops for the tile's i, j and k, and its two operands."""

    group: IntrinGroup
    tile_loops: tuple[int, int, int]  # indices among the block's loops, in the intrinsic's order (i, j, k)
    operand_a: int  # index of the read holding A[i, k]
    operand_b: int  # index of the read holding B[k, j] (or B[j, k])
    in_dtype: str
    trans_b: bool  # B is laid out B[j, k]


def wmma_plan(raw: s_tir.Schedule, block_rv: s_tir.schedule.SBlockRV, ctx: SpaceContext) -> WMMAPlan | None:
    """The block's WMMA mapping, or None where WMMA cannot compute it (types, shape, target, access pattern)."""
    dtypes = _wmma_dtypes(raw, block_rv, ctx)
    if dtypes is None:
        return None
    loops = list(raw.get_loops(block_rv))
    kinds = loop_kinds(raw, block_rv, loops)
    if kinds.count(REDUCTION) != 1 or not all(kind in (SPATIAL, REDUCTION) for kind in kinds):
        return None
    for trans_b in (False, True):
        group = _intrin_group(*dtypes, trans_b)
        tile_loops = _tile_loops(raw, block_rv, loops, group.compute)
        if tile_loops is None or any(int(raw.get(loops[index]).extent) % TILE for index in tile_loops):
            continue
        if kinds[tile_loops[2]] != REDUCTION:
            continue
        operands = _operands(raw, block_rv, [raw.get(loops[index]).loop_var for index in tile_loops], trans_b)
        if operands is not None:
            return WMMAPlan(group, tile_loops, *operands, dtypes[0], trans_b)
    return None


def _wmma_dtypes(raw: s_tir.Schedule, block_rv: s_tir.schedule.SBlockRV, ctx: SpaceContext) -> tuple[str, str] | None:
    """The block's input and accumulator types if WMMA has them on the target and the block is at the root; else None."""
    sblock = raw.get(block_rv)
    if compute_capability(ctx.target.tvm_target) < WMMA_MIN_ARCH or not at_root(raw, block_rv):
        return None
    if len(sblock.reads) != 2 or len(sblock.writes) != 1:
        return None
    in_dtypes = {str(read.source.dtype) for read in sblock.reads}
    out_dtype = str(sblock.writes[0].source.dtype)
    if len(in_dtypes) != 1 or out_dtype not in _ACCUMULATORS.get(next(iter(in_dtypes)), ()):
        return None
    return next(iter(in_dtypes)), out_dtype


def _intrin_group(in_dtype: str, out_dtype: str, trans_b: bool) -> IntrinGroup:
    names = load_tensor_intrinsics().get_wmma_intrin_group(SHARED, SHARED, in_dtype, out_dtype, trans_b)
    return IntrinGroup(names["compute"], names["init"], names["load_a"], names["load_b"], names["store"])


def _added_blocks(sch: Schedule, kind: str, block: BlockRV, attrs: dict[str, Any]) -> set[str]:
    """Record the instruction on ``block``; the names of the blocks it added."""
    before = set(block_names(sch.mod["main"]))
    sch.apply(kind, [block], attrs)
    return set(block_names(sch.mod["main"])) - before


def _elementwise_producers(raw: s_tir.Schedule, names: list[str]) -> set[str]:
    """The spatial blocks at the root that feed only the named blocks, directly or through each other."""
    found, todo = set[str](), list(names)
    while todo:
        for producer in raw.get_producers(raw.get_sblock(todo.pop())):
            sblock, name = raw.get(producer), str(raw.get(producer).name_hint)
            only = all(str(raw.get(c).name_hint) in {*names, *found, name} for c in raw.get_consumers(producer))
            if name not in found and name not in names and is_spatial(sblock) and at_root(raw, producer) and only:
                found.add(name)
                todo.append(name)
    return found


def _tile_padding(raw: s_tir.Schedule, block_rv: s_tir.schedule.SBlockRV) -> list[int] | None:
    """Padding factors per block iterator that make the tiles WMMA maps whole, or None if none is needed or possible.

    WMMA maps the output's last two dimensions and the reduction: those
    iterators are padded to multiples of 16, the others (a batch) are kept.
    """
    sblock = raw.get(block_rv)
    values = as_list(realize_of(raw, block_rv).iter_values)
    if len(sblock.writes) != 1 or not all(isinstance(value, tirx.Var) for value in values):
        return None  # pad_einsum needs each iterator bound to one loop
    output = [identity(region.min) for region in sblock.writes[0].region[-2:]]
    factors = [
        TILE if int(iv.dom.extent) % TILE and (identity(iv.var) in output or int(iv.iter_type) == tirx.IterVar.CommReduce) else 1
        for iv in sblock.iter_vars
    ]
    return factors if any(factor > 1 for factor in factors) else None


def _tile_loops(
    raw: s_tir.Schedule, block_rv: s_tir.schedule.SBlockRV, loops: list[s_tir.schedule.LoopRV], intrinsic: str
) -> tuple[int, int, int] | None:
    """The block's loops that TVM maps onto the intrinsic's i, j and k, by index, or None."""
    info = get_tensorize_loop_mapping(raw, block_rv, TensorIntrin.get(intrinsic).desc)
    if info is None or len(info.loop_map) != 3:
        return None
    stmts = [raw.get(loop) for loop in loops]
    order: dict[int, int] = {}
    for block_loop, desc_loop in info.loop_map.items():
        index = next((i for i, stmt in enumerate(stmts) if stmt.same_as(block_loop.stmt)), None)
        if index is None:
            return None
        order[int(info.desc_loop_indexer[desc_loop])] = index
    return (order[0], order[1], order[2]) if sorted(order) == [0, 1, 2] else None


def _operands(
    raw: s_tir.Schedule, block_rv: s_tir.schedule.SBlockRV, tile_vars: Sequence[tirx.Var], trans_b: bool
) -> tuple[int, int] | None:
    """Indices of the reads laid out as the intrinsic's A[i, k] and B[k, j] (B[j, k] if ``trans_b``), or None.

    The output must be C[i, j]: the intrinsics load, multiply and store row-major 16x16 tiles of the last two
    dimensions.
    """
    realize = realize_of(raw, block_rv)
    iters_of: dict[int, set[int]] = {}  # loop variable -> the block iterators its binding feeds
    for iv, value in zip(as_list(realize.block.iter_vars), as_list(realize.iter_values)):
        for var in as_list(tirx.analysis.undefined_vars(value)):
            iters_of.setdefault(identity(var), set()).add(identity(iv.var))
    i, j, k = (frozenset(iters_of.get(identity(var), set())) for var in tile_vars)

    def laid_out(region: Any, rows: frozenset[int], cols: frozenset[int]) -> bool:
        dims = [{identity(v) for v in as_list(tirx.analysis.undefined_vars(r.min))} for r in region.region]
        return len(dims) >= 2 and dims[-2] == rows and dims[-1] == cols

    reads = list(realize.block.reads)
    b_layout = (j, k) if trans_b else (k, j)
    a = [n for n, read in enumerate(reads) if laid_out(read, i, k)]
    b = [n for n, read in enumerate(reads) if laid_out(read, *b_layout)]
    if len(a) != 1 or len(b) != 1 or a == b or not laid_out(realize.block.writes[0], i, j):
        return None
    return a[0], b[0]


@dataclass(frozen=True)
class TensorCoreTiling:
    """Compute a float16 or int8 matmul-like block (matmul, dense, batch matmul, conv2d) with WMMA, over blocks and warps."""

    name: str = "tensor-core-tiling"
    spatial_levels: int = 4
    reduction_levels: int = 3
    max_innermost_factor: int = 4
    max_block_tiles: int = 8
    """A thread block's tile along each spatial loop, in 16-wide tiles: a 128x128 block at most."""
    max_reduction_tiles: int = 8
    """The reduction tile staged in shared memory at once, in 16-wide tiles."""
    vector_load_lens: tuple[int, ...] = (1, 2, 4, 8)
    max_accumulator_fragments: int = 16
    max_lane_registers: int = 320
    """Bound on :func:`lane_registers`, which counts every fragment as live at once (the compiler keeps fewer)."""
    max_padding: float = 2.0
    """Padding to whole tiles may at most multiply the block's work by this; beyond, WMMA is not used."""
    off_tile_weight: float = 0.01

    def prior(self, sch: s_tir.Schedule, ctx: SpaceContext) -> float:
        """Favour fresh draws that fit the target: warps, shared memory, and fragments in registers.

        Uniform tile sizes mostly give a thread block more shared memory
        than it has (the operands' tiles, times the pipeline's buffers, and
        the staged output), or a warp more than ``max_accumulator_fragments``
        accumulator tiles (a float32 16x16 tile takes 8 registers of every
        lane; beyond about 16 a warp spills); pipelining adds operand
        fragments and staged copies to the registers (``max_lane_registers``).
        Each miss multiplies the draw's weight by ``off_tile_weight``.
        """
        limits = ctx.target.tvm_target
        misses = sum(n > self.max_accumulator_fragments for n in warp_accumulator_fragments(sch).values())
        misses += lane_registers(sch) > self.max_lane_registers
        misses += shared_memory_bytes(sch) > block_limit(limits, "max_shared_memory_per_block")
        misses += threads_per_block(sch) > block_limit(limits, "max_threads_per_block")
        return float(self.off_tile_weight**misses)

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> list[Schedule] | None:
        if not unbound(sch.tvm, sch.resolve(block)):  # another module computes it inside its kernel
            return None
        found = self._plan(sch, block, ctx)
        if found is None:
            return None
        plan, copies = found
        forks = [fork for fork in [self._split_reduction(sch, block, plan, copies, ctx)] if fork is not None]
        self._tensorize(sch, block, plan, copies, ctx)
        return forks

    def _tensorize(
        self, sch: Schedule, block: BlockRV, plan: WMMAPlan, copies: set[str], ctx: SpaceContext, whole: int = 0
    ) -> None:
        """Tile the planned block over warps and thread blocks and compute its tiles on the tensor cores; its first
        ``whole`` loops only number thread blocks."""
        arch = compute_capability(ctx.target.tvm_target)
        k = self._tile_k(sch, block, plan, arch)
        outer = self._tensor_tiles(sch, block, plan, k)
        if len(instructions := instruction_choices(plan.in_dtype, arch)) > 1:
            sch.annotate(outer, INSTRUCTION_KEY, sch.sample_uniform(instructions))
        if not isinstance(k, int):
            sch.annotate(outer, TILE_K_KEY, k)
        grid, warps, r_outer, r_middle = self._tile(sch, outer, whole)
        sch.annotate(r_outer, PIPELINE_KEY, sch.sample_uniform(pipeline_choices(arch)))
        b_tile = (TILE, k) if plan.trans_b else (k, TILE)
        for operand, scope, intrinsic, tile in ((plan.operand_a, "wmma.matrix_a", plan.group.load_a, (TILE, k)),
                                                (plan.operand_b, "wmma.matrix_b", plan.group.load_b, b_tile)):
            fragment = (scope, intrinsic, tile)
            self._read_through_fragments(sch, outer, operand, plan.in_dtype, fragment, (r_outer, r_middle), copies)
        self._write_through_shared(sch, outer, plan, grid, warps)  # after: inlining a pad once the output is trimmed fails

    def _split_reduction(
        self, sch: Schedule, block: BlockRV, plan: WMMAPlan, copies: set[str], ctx: SpaceContext
    ) -> Schedule | None:
        """Split-K where the product may want it (:mod:`probtune_cuda.split_reduction`): a fork of ``sch`` whose
        partial products are tensorized, each part's tiles thread blocks of their own; None where the product is only
        computed whole, or WMMA cannot compute its parts.

        A fork, so that the search still has the product computed whole: a trace's steps cannot depend on the number
        of parts it samples.
        """
        extents = [int(sch.get(loop).extent) for loop in sch.get_loops(block)]
        choices = split_choices(extents, plan.tile_loops, ctx, TILE)
        if not choices:
            return None
        fork = sch.fork()
        found = self._partials(fork, block, plan, fork.sample_uniform(choices), ctx)
        if found is None:
            return None
        partials, split_plan, more = found
        self._tensorize(fork, partials, split_plan, copies | more, ctx, whole=1)
        return fork

    def _partials(
        self, sch: Schedule, block: BlockRV, plan: WMMAPlan, parts: int | ExprRV, ctx: SpaceContext
    ) -> tuple[BlockRV, WMMAPlan, set[str]] | None:
        """Split the block's reduction into ``parts`` (``rfactor``) and sum the partials in a kernel of their own; the
        partial products' block brought into WMMA's shape, its plan and copies (None where WMMA cannot compute it)."""
        position = plan.tile_loops[2]
        part, _ = sch.split(sch.get_loops(block)[position], [parts, None])
        partials = sch.rfactor(part, 0)
        loops = sch.get_loops(partials)
        sch.reorder(loops[position], *loops[:position])  # the parts as the outermost loop, as rfactor's block iterates
        bind_partial_sums(sch, block)
        found = self._plan(sch, partials, ctx)
        return None if found is None else (partials, *found)

    @staticmethod
    def _tile_k(sch: Schedule, block: BlockRV, plan: WMMAPlan, arch: int) -> int | ExprRV:
        """A tile's reduction extent: 16, or sampled among those that divide the block's (int8: 16 or 32)."""
        extent = int(sch.get(sch.get_loops(block)[plan.tile_loops[2]]).extent)
        choices = [k for k in tile_k_choices(plan.in_dtype, arch, plan.trans_b) if extent % k == 0]
        return sch.sample_uniform(choices) if len(choices) > 1 else TILE

    def _plan(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> tuple[WMMAPlan, set[str]] | None:
        """Bring the block into a shape WMMA computes; its plan and the blocks that copy its operands and output on the way.

        A convolution is first rewritten as a matmul (``transform_to_intrinsic``),
        then a block whose tiles are not whole is padded (``pad_einsum``).
        The operands' copies (gathers, pads) and the spatial blocks that only
        feed them (a convolution's zero padding) are inlined into the
        shared-memory copies later: each value is computed once per thread
        block, on its way into shared memory. Returns None, and records
        nothing, where WMMA cannot compute the block.
        """
        copies: set[str] = set()
        intrinsic = self._fused_layout_intrinsic(sch.tvm, sch.resolve(block), ctx)
        if intrinsic is not None:
            copies = _added_blocks(sch, TRANSFORM_TO_INTRINSIC.name, block, {"intrinsic": intrinsic})
        if (plan := wmma_plan(sch.tvm, sch.resolve(block), ctx)) is None:
            padded = self._padding(sch.tvm, sch.resolve(block), ctx)
            if padded is None:
                return None
            factors, plan = padded
            copies |= _added_blocks(sch, PAD_EINSUM.name, block, {"padding": factors})
        return plan, copies | _elementwise_producers(sch.tvm, [str(sch.get(block).name_hint), *copies])

    def _fused_layout_intrinsic(self, raw: s_tir.Schedule, block_rv: s_tir.schedule.SBlockRV, ctx: SpaceContext) -> str | None:
        """The intrinsic to rewrite the block as (a convolution's fused matmul) if WMMA then computes it, else None.

        Of ``B[k, j]`` and ``B[j, k]``, the layout whose copy reads more
        consecutive elements at once: an NCHW convolution's filters are
        contiguous along ``k``, an NHWC one's along ``j``.
        """
        dtypes = _wmma_dtypes(raw, block_rv, ctx)
        if dtypes is None:
            return None
        best: tuple[int, str] | None = None
        for trans_b in (False, True):
            intrinsic = _intrin_group(*dtypes, trans_b).compute
            trial = raw.copy()
            try:
                *_, operand_b = transform_to_intrinsic(trial, block_rv, intrinsic)
            except ValueError:  # no layout as this intrinsic
                continue
            if wmma_plan(trial, block_rv, ctx) is None and self._padding(trial, block_rv, ctx) is None:
                continue
            width = max(contiguous_widths(trial, operand_b, list(self.vector_load_lens)), default=0)
            best = (width, intrinsic) if best is None or width > best[0] else best
        return None if best is None else best[1]

    def _padding(
        self, raw: s_tir.Schedule, block_rv: s_tir.schedule.SBlockRV, ctx: SpaceContext
    ) -> tuple[list[int], WMMAPlan] | None:
        """The ``pad_einsum`` factors that let WMMA compute the block, and the padded block's plan; or None.

        The plan is found on a padded copy (a plan names loops and reads by
        position). None where padding does not let WMMA compute the block or
        would more than ``max_padding`` times its work.
        """
        factors = _tile_padding(raw, block_rv)
        if factors is None:
            return None
        extents = [int(iv.dom.extent) for iv in raw.get(block_rv).iter_vars]
        if math.prod(-(-n // f) * f for n, f in zip(extents, factors)) > self.max_padding * math.prod(extents):
            return None
        trial = raw.copy()
        try:
            trial.pad_einsum(block_rv, factors)
        except (RuntimeError, ValueError):  # TVM: not an einsum it can pad
            return None
        plan = wmma_plan(trial, block_rv, ctx)
        return None if plan is None else (factors, plan)

    def _tensor_tiles(self, sch: Schedule, block: BlockRV, plan: WMMAPlan, k: int | ExprRV) -> BlockRV:
        """Split the intrinsic's loops into 16x16xk tiles, put the tile innermost and make it a block; the outer block."""
        loops = sch.get_loops(block)
        inner = {}
        for index, size in zip(plan.tile_loops, (TILE, TILE, k)):
            loops[index], inner[index] = sch.split(loops[index], [None, size])
        sch.reorder(*loops, *[inner[index] for index in plan.tile_loops])
        outer = sch.blockize(inner[plan.tile_loops[0]])
        sch.annotate(outer, TENSORIZE_KEY, plan.group.compute)
        sch.annotate(outer, TENSORIZE_INIT_KEY, plan.group.init)
        sch.annotate(outer, WARP_EXECUTION_KEY, 1)
        return outer

    def _tile(self, sch: Schedule, outer: BlockRV, whole: int = 0) -> tuple[LoopRV, LoopRV, LoopRV, LoopRV]:
        """Tile the outer block ``SSRRSRS``; the loops bound to blocks and to warps, and the outer two reduction tiles.

        The first ``whole`` loops are not tiled: they only number thread blocks.
        """
        loops = sch.get_loops(outer)
        kinds = loop_kinds(sch.tvm, sch.resolve(outer), [sch.resolve(loop) for loop in loops])
        spatial: list[list[LoopRV]] = [loops[:whole]] + [[] for _ in range(self.spatial_levels - 1)]
        reduction: list[list[LoopRV]] = [[] for _ in range(self.reduction_levels)]
        for loop, kind in zip(loops[whole:], kinds[whole:]):
            levels, bound = (spatial, self.max_block_tiles) if kind == SPATIAL else (reduction, self.max_reduction_tiles)
            factors = sch.sample_perfect_tile(loop, len(levels), self.max_innermost_factor, max_inner_product=bound)
            for level, piece in zip(levels, sch.split(loop, factors)):
                level.append(piece)
        order = [spatial[0], spatial[1], reduction[0], reduction[1], spatial[2], reduction[2], *spatial[3:]]
        sch.reorder(*[loop for level in order for loop in level])
        grid, warps = sch.fuse(*spatial[0]), sch.fuse(*spatial[1])
        sch.bind(grid, "blockIdx.x")
        sch.bind(warps, "threadIdx.y")
        return grid, warps, reduction[0][-1], reduction[1][-1]

    def _write_through_shared(self, sch: Schedule, outer: BlockRV, plan: WMMAPlan, grid: LoopRV, warps: LoopRV) -> None:
        """Accumulate in fragments, store them to shared memory per warp, and copy the block's tile out with all threads.

        The copy finishes the block's elementwise consumers (the trimming of
        a padded output; a cast, bias, activation) if it has them, so the
        output is written once.
        """
        staged = sch.cache_write(outer, 0, SHARED)
        sch.reverse_compute_at(staged, grid)
        fragments = sch.cache_write(outer, 0, "wmma.accumulator")
        sch.reverse_compute_at(fragments, warps)
        while (epilogue := elementwise_consumer(sch.tvm, sch.resolve(staged))) is not None:
            sch.reverse_compute_inline(sch.get_sblock(epilogue))
        self._blockize_tiles(sch, fragments, plan.group.store, (TILE, TILE))
        sch.fuse(*sch.get_loops(staged)[1:])  # under the block's loop
        widths = (1, 2, 4)  # a lane reads at most 16 bytes of float32 at once
        sch.annotate(staged, COOPERATIVE_FETCH_KEY, sch.sample_uniform(widths))

    def _read_through_fragments(
        self,
        sch: Schedule,
        outer: BlockRV,
        operand: int,
        in_dtype: str,
        fragment: tuple[str, str, tuple[int | ExprRV, int | ExprRV]],
        at: tuple[LoopRV, LoopRV],
        copies: set[str],
    ) -> None:
        """Copy an operand's tile to shared memory under the outer reduction tile, then into fragments under the middle one.

        The blocks in ``copies`` that produce the operand (a convolution's
        window gather, a padding's zeros, a cast from float32) are inlined
        into the copy, which reads as many elements at once as the inputs'
        layouts and widest type allow (:func:`~probtune_cuda.reindex.contiguous_widths`).
        """
        shared = sch.cache_read(outer, operand, SHARED)
        while inlined := [name for name in self._producers(sch, shared) if name in copies]:
            for name in inlined:
                sch.compute_inline(sch.get_sblock(name))
        bits = max(tvm.DataType(str(region.source.dtype)).bits for region in sch.get(shared).reads)  # a cast's source
        widths = contiguous_widths(sch.tvm, sch.resolve(shared), [n for n in self.vector_load_lens if n * bits <= 128]) or [1]
        sch.compute_at(shared, at[0])
        sch.fuse(*sch.get_loops(shared)[_OUTER_REDUCTION_DEPTH + 1 :])
        sch.annotate(shared, COOPERATIVE_FETCH_KEY, sch.sample_uniform(widths))
        sch.storage_align(shared, 0, axis=-2, factor=32, offset=_SHARED_ROW_PAD[in_dtype])
        scope, intrinsic, tile = fragment
        loaded = sch.cache_read(outer, operand, scope)
        sch.compute_at(loaded, at[1])
        self._blockize_tiles(sch, loaded, intrinsic, tile)

    @staticmethod
    def _producers(sch: Schedule, block: BlockRV) -> list[str]:
        return [str(sch.tvm.get(rv).name_hint) for rv in sch.tvm.get_producers(sch.resolve(block))]

    @staticmethod
    def _blockize_tiles(sch: Schedule, block: BlockRV, intrinsic: str, tile: tuple[int | ExprRV, int | ExprRV]) -> None:
        """Split a copy's last two loops by ``tile`` and make each tile a block for ``intrinsic``."""
        loops = sch.get_loops(block)
        rows, row_tile = sch.split(loops[-2], [None, tile[0]])
        cols, col_tile = sch.split(loops[-1], [None, tile[1]])
        sch.reorder(rows, cols, row_tile, col_tile)
        sch.annotate(sch.blockize(row_tile), TENSORIZE_KEY, intrinsic)


def warp_accumulator_fragments(raw: s_tir.Schedule) -> dict[str, int]:
    """For each block stored from WMMA accumulators, the accumulator tiles one warp holds."""
    found = {}
    for block_rv in nested_sblocks(raw):
        sblock = raw.get(block_rv)
        if not sblock.annotations.get(TENSORIZE_KEY):
            continue
        if not any(str(read.source.scope()) == "wmma.accumulator" for read in sblock.reads):
            continue
        loops = list(raw.get_loops(block_rv))
        tags = [thread_tag(raw.get(loop)) for loop in loops]
        if "threadIdx.y" in tags:
            found[str(sblock.name_hint)] = math.prod(int(raw.get(loop).extent) for loop in loops[tags.index("threadIdx.y") + 1 :])
    return found


def lane_registers(raw: s_tir.Schedule) -> int:
    """The 32-bit registers each thread holds for fragments and register-staged copies, estimated before building.

    A 16x16 fragment spreads over a warp's 32 lanes: 8 registers of float32
    or int32 accumulators, 4 of float16 operands, 2 of int8 (4 in a 16x32
    tile of int8 ``mma.sync``). A pipelined
    reduction also holds its next step's operand fragments; a copy staged
    through registers holds each thread's share of the next tile.
    """
    lanes, threads = 32, max(threads_per_block(raw), 1)
    total = sum(warp_accumulator_fragments(raw).values()) * TILE * TILE // lanes
    for block_rv in nested_sblocks(raw):
        sblock = raw.get(block_rv)
        loops = [raw.get(loop) for loop in raw.get_loops(block_rv)]
        buffers = max((loop_buffers(loop) for loop in loops), default=NO_PIPELINE)
        written = {str(region.source.scope()): region.source.dtype for region in sblock.writes}
        for scope, dtype in written.items():
            itemsize = tvm.DataType(str(dtype)).bits // 8
            if scope in ("wmma.matrix_a", "wmma.matrix_b") and sblock.annotations.get(TENSORIZE_KEY) and len(loops) >= 2:
                fragments = int(loops[-2].extent) * int(loops[-1].extent) * (2 if buffers > NO_PIPELINE else 1)
                total += fragments * itemsize * math.prod(int(r.extent) for r in sblock.writes[0].region) // lanes // 4
            elif scope.startswith("shared") and buffers == REGISTER_STAGED and COOPERATIVE_FETCH_KEY in sblock.annotations:
                total += -(-largest_extent(loops) * itemsize // threads) // 4
    return total


def largest_extent(loops: list[tirx.For]) -> int:
    """The innermost loop's extent, or where that depends on the loops around it (a copy of a grouped convolution's
    channel window, whose start follows the output channel's tile), its largest value over their ranges."""
    extent = loops[-1].extent
    if isinstance(extent, tirx.IntImm):
        return int(extent)
    analyzer = tvm.sym.Analyzer()
    for loop in loops[:-1]:
        analyzer.bind(loop.loop_var, tvm.ir.Range.from_min_extent(loop.min, loop.extent))
    return int(analyzer.const_int_bound(extent).max_value)


def shared_memory_bytes(raw: s_tir.Schedule) -> int:
    """Shared memory the program's cooperative copies need at once, before row padding.

    A copy fills its fused loop's extent of elements. The copies into shared
    memory (the operands' tiles) live together, each in as many buffers as
    the software pipeline around it sampled; the copies out of it (the
    staged output) come after them and reuse their memory.
    """
    into, out_of = 0, 0
    for block_rv in raw.get_child_blocks(raw.get_sblock("root")):
        sblock = raw.get(block_rv)
        loops = [raw.get(loop) for loop in raw.get_loops(block_rv)]
        if COOPERATIVE_FETCH_KEY not in sblock.annotations or not loops:
            continue
        elements, buffers = largest_extent(loops), max(loop_buffers(loop) for loop in loops)
        for region, is_write in [(r, True) for r in sblock.writes] + [(r, False) for r in sblock.reads]:
            if str(region.source.scope()).startswith("shared"):
                size = elements * tvm.DataType(str(region.source.dtype)).bits // 8
                into, out_of = (into + buffers * size, out_of) if is_write else (into, out_of + size)
    return max(into, out_of)


def threads_per_block(raw: s_tir.Schedule) -> int:
    """Threads per block of a warp-tiled program: the largest ``threadIdx.y`` extent (warps) times 32 (0 if none)."""
    extents = [
        int(raw.get(loop).extent)
        for block_rv in raw.get_child_blocks(raw.get_sblock("root"))
        for loop in raw.get_loops(block_rv)
        if thread_tag(raw.get(loop)) == "threadIdx.y"
    ]
    return 32 * max(extents, default=0)
