"""Parallelize outer loops over the cores, vectorize the innermost loop, unroll with a sampled depth.

The modules only *annotate* a block with the limits they sampled; the
validator ``rewrite-parallel-vectorize-unroll`` turns the annotations into
real fuse/parallel/vectorize/unroll steps on each replayed program. This
keeps the trace's structure independent of sampled tile sizes: how many
loops to fuse depends on their extents, which change from one sample to the
next.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

from probtune.plugin import (
    REDUCTION,
    SPATIAL,
    UNROLL_KEY,
    BlockRV,
    Schedule,
    SpaceContext,
    at_root,
    contiguous_along,
    last_line,
    loop_kinds,
    root_tile,
    sblock_names,
)
from probtune_cpu.tensorize import is_tensorized
from probtune_cpu.vector_unit import vector_width

__all__ = [
    "PARALLEL_KEY",
    "VECTORIZE_KEY",
    "VECTOR_SPLIT_KEY",
    "ParallelVectorize",
    "RewriteParallelVectorizeUnroll",
    "RewriteReductionBlock",
    "RewriteSpatialInnermost",
]

PARALLEL_KEY = "probtune.parallel_jobs"
VECTORIZE_KEY = "probtune.vector_lanes"
VECTOR_SPLIT_KEY = "probtune.vector_split"
"""Block annotation: how many lanes of an innermost loop too long to vectorize whole make one vectorized loop.

A key of its own, not a new meaning of ``VECTORIZE_KEY``: traces already in a
database keep replaying to the programs that were measured.
"""
MAX_VECTORS_PER_LOOP = 16  # a longer innermost loop is split (VECTOR_SPLIT_KEY) or left to LLVM, not made one huge vector
MAX_UNROLLED_EXTREMUM_STEPS = 16
"""The most steps TVM may unroll inside a float max/min reduction, whatever the step sampled for its loop nest.

An explicitly unrolled chain of scalar float ``max`` updates of one element
makes LLVM's optimizer take time exponential in the chain's length (a ``sum``
chain does not). Unrolled softmax row maxes hit it and ran into the builder's
time limit; a chain of 16 builds quickly (bench/results/NOTES.md).
"""
_REQUEST_KEYS = (PARALLEL_KEY, VECTORIZE_KEY, VECTOR_SPLIT_KEY, UNROLL_KEY)


@dataclass(frozen=True)
class ParallelVectorize:
    """Ask for ``jobs_per_core`` x cores parallel iterations and target-width vectors.

    An innermost spatial loop too long to vectorize whole (an untiled
    elementwise block: softmax's exponentials over a 1024-wide row) is split,
    and the vectorized part is ``vectors_per_split`` vectors, sampled: it sets
    how many registers the loop body keeps live, and a few vectors ran faster
    than one, than sixteen, or than leaving the loop to LLVM
    (bench/results/NOTES.md).
    """

    name: str = "parallel-vectorize"
    jobs_per_core: int = 16
    vectors_per_split: tuple[int, ...] = (1, 2, 4, 8)
    min_parallel_iterations: int = 1024
    """A block that runs fewer iterations in all is not parallelized: it takes less time on one core than starting
    and joining the workers does (a split into many small pieces, each with a parallel loop of its own, ran many
    times slower; the measurement is in the commit that made this change)."""
    sampled_parallel_iterations: int = 1 << 18
    """A block that runs fewer iterations in all (but at least ``min_parallel_iterations``) runs on one core or on
    all of them, a sampled choice: a recurrent step's matrix product (65k multiply-adds) takes about as long on
    one core as the workers' start and join cost, and only a measurement tells which is faster."""

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> None:
        raw, block_rv = sch.tvm, sch.resolve(block)
        tile = root_tile(raw, block_rv)  # a block blockized into an instruction's tile: its nest is the tile's
        if tile is not None:
            block = sch.get_sblock(tile)
            block_rv = sch.resolve(block)
        if not at_root(raw, block_rv):
            return
        lanes = vector_width(ctx.target)
        iterations = _iterations(raw, block_rv)
        jobs = self.jobs_per_core * ctx.target.num_cores
        if iterations < self.min_parallel_iterations:
            sch.annotate(block, PARALLEL_KEY, 1)
        elif iterations < self.sampled_parallel_iterations and ctx.target.num_cores > 1:
            sch.annotate(block, PARALLEL_KEY, sch.sample_uniform([1, jobs]))
        else:
            sch.annotate(block, PARALLEL_KEY, jobs)
        sch.annotate(block, VECTORIZE_KEY, lanes)
        innermost = raw.get_loops(block_rv)[-1]
        extent = raw.get(innermost).extent
        if (
            isinstance(extent, tvm.tirx.IntImm)
            and int(extent) > lanes * MAX_VECTORS_PER_LOOP
            and loop_kinds(raw, block_rv, [innermost]) == [SPATIAL]
        ):
            widths = [lanes * vectors for vectors in self.vectors_per_split]
            sch.annotate(block, VECTOR_SPLIT_KEY, sch.sample_uniform(widths))


def _iterations(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> float:
    """How many times the block's body runs: the product of its loops' extents (unknown extents: infinitely many)."""
    extents = [sch.get(loop).extent for loop in sch.get_loops(block)]
    if any(not isinstance(extent, tvm.tirx.IntImm) for extent in extents):
        return math.inf
    return math.prod(int(extent) for extent in extents)


def _is_guest(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """Whether the block was computed into the loop nest of a consumer that parallelizes it.

    Such a block shares its outer loops with that consumer, whose own rewrite
    fuses, parallelizes and unrolls them; the guest may only vectorize its own
    innermost loop. (A consumer moved into a producer's tile, such as a cache
    write-back, carries no parallel request of its own, so the producer stays host.)
    """
    loops = sch.get_loops(block)
    if not loops:
        return False
    outermost = sch.get_sref(loops[0])
    return any(
        PARALLEL_KEY in sch.get(consumer).annotations and _is_under(sch.get_sref(consumer), outermost)
        for consumer in sch.get_consumers(block)
    )


def _is_under(sref: s_tir.StmtSRef, ancestor: s_tir.StmtSRef) -> bool:
    """Whether ``ancestor`` encloses ``sref``: read from the schedule's tree of srefs, without walking the program."""
    node = sref.parent
    while node is not None:
        if node.same_as(ancestor):
            return True
        node = node.parent
    return False


@dataclass(frozen=True)
class RewriteParallelVectorizeUnroll:
    """Fuse the leading spatial loops up to the job limit and parallelize them; vectorize the innermost; unroll.

    A program whose parallel loop leaves cores idle is rejected when the
    block's leading spatial loops offered more jobs than the fused ones (the
    tiles, not the workload, made the jobs few): 7 jobs on 2 cores keep them
    busy 7/8 of the time. A conv2d program ran clearly slower with 7 jobs than
    with 14 or 56, and the search, which measures few programs, had kept the
    7-job one as its best (bench/results/NOTES.md).

    An innermost loop along which some buffer is not read contiguously (a
    gather: a transpose's read) is vectorized one vector at a time: LLVM
    builds a wide gather as one load per lane, and unrolled around it a
    channels-last transpose made a build too slow to finish in the builder's
    time limit (the measurement is in the commit that made this change).
    """

    name: str = "rewrite-parallel-vectorize-unroll"
    min_core_use: float = 0.9
    """The least share of the cores' time a parallel loop must keep them busy (jobs over cores x rounds of jobs)."""

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        for name in sblock_names(sch):
            block = sch.get_sblock(name)
            annotations = sch.get(block).annotations
            wanted = {key: int(annotations[key]) for key in _REQUEST_KEYS if key in annotations}
            if not wanted:
                continue
            for key in wanted:
                sch.unannotate(block, key)
            if _is_guest(sch, block):  # its outer loops belong to a consumer, which parallelizes and unrolls them
                wanted.pop(PARALLEL_KEY, None)
                wanted.pop(UNROLL_KEY, None)
            try:
                reason = self._rewrite(sch, block, wanted, ctx.target.num_cores)
            except RuntimeError as exc:  # TVM schedule errors
                return f"block {name}: {last_line(exc)}"
            if reason is not None:
                return f"block {name}: {reason}"
        return None

    def _rewrite(
        self, sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, wanted: dict[str, int], cores: int
    ) -> str | None:
        """Rewrite the block's nest, or say why its parallel loop would leave the cores idle (before fusing it)."""
        loops = sch.get_loops(block)
        kinds = loop_kinds(sch, block, loops)
        extents = [sch.get(loop).extent for loop in loops]
        if any(not isinstance(e, tvm.tirx.IntImm) for e in extents):
            return None
        lanes = wanted.get(VECTORIZE_KEY, 0)
        split = wanted.get(VECTOR_SPLIT_KEY, 0)
        vectorizable = (
            lanes
            and len(loops) > 1
            and kinds[-1] == SPATIAL
            and isinstance(sch.get(loops[-1]).body, s_tir.SBlockRealize)
            and not is_tensorized(sch.get(block))  # its inside becomes an instruction; its write-back is vectorized
        )
        gather = vectorizable and not contiguous_along(sch, block, loops[-1])
        longest = lanes if gather else lanes * MAX_VECTORS_PER_LOOP  # see the class docstring
        split = lanes if gather else split
        if vectorizable and split and int(extents[-1]) > longest and int(extents[-1]) % split == 0:
            loops = [*loops[:-1], *sch.split(loops[-1], [None, split])]
            kinds = [*kinds, SPATIAL]  # both halves of the split loop are spatial
        fors = [sch.get(loop) for loop in loops]  # as before vectorizing: vectorize changes no loop's body type
        sizes = [int(f.extent) for f in fors]
        if vectorizable and 1 < sizes[-1] <= longest:
            sch.vectorize(loops[-1])
        # loops of one iteration go first: a packing copy sits under the outermost tile of the vector loop,
        # and when that tile is 1 the parallel loops are the ones under it (the copy then runs on one core)
        first = 0
        while first < len(loops) - 1 and kinds[first] == SPATIAL and sizes[first] == 1:
            first += 1
        leading, jobs = first, 1
        max_jobs = wanted.get(PARALLEL_KEY, 1)
        while leading < len(loops) - 1 and kinds[leading] == SPATIAL and jobs < max_jobs:
            jobs *= sizes[leading]
            leading += 1
            if not isinstance(fors[leading - 1].body, tvm.tirx.For):
                break  # fuse needs a perfect nest: a loop holding more than one statement ends the fused prefix
        # the jobs all spatial loops before the first reduction could make; the innermost loop is never fused
        spatial_prefix = kinds.index(REDUCTION) if REDUCTION in kinds else len(kinds)
        offered = math.prod(sizes[: min(spatial_prefix, len(sizes) - 1)])
        core_use = jobs / (math.ceil(jobs / cores) * cores)
        if 1 < jobs < offered and core_use < self.min_core_use:
            return (
                f"{jobs} parallel jobs keep {cores} cores busy {core_use:.0%} of the time "
                f"(its leading spatial loops offer {offered})"
            )
        outer = loops[0]
        if jobs > 1:
            outer = sch.fuse(*loops[first:leading]) if leading - first > 1 else loops[first]
            sch.parallel(outer)
        if wanted.get(UNROLL_KEY):
            sch.annotate(outer, "pragma_auto_unroll_max_step", wanted[UNROLL_KEY])
            sch.annotate(outer, "pragma_unroll_explicit", 1)
            if wanted[UNROLL_KEY] > MAX_UNROLLED_EXTREMUM_STEPS:
                _cap_extremum_unrolling(sch, outer)
        return None


def _cap_extremum_unrolling(sch: s_tir.Schedule, outer: s_tir.schedule.LoopRV) -> None:
    """Give each float max/min reduction under ``outer`` an unroll limit of its own (see MAX_UNROLLED_EXTREMUM_STEPS).

    TVM's unroll pass takes the innermost ``pragma_auto_unroll_max_step``
    around a loop, so the rest of the nest keeps the sampled step.
    """
    for block in sch.get_child_blocks(outer):
        if not _is_float_extremum_update(sch.get(block).body):
            continue
        loops = sch.get_loops(block)
        kinds = loop_kinds(sch, block, loops)
        if REDUCTION in kinds:
            sch.annotate(loops[kinds.index(REDUCTION)], "pragma_auto_unroll_max_step", MAX_UNROLLED_EXTREMUM_STEPS)


def _is_float_extremum_update(body: tirx.Stmt) -> bool:
    """Whether ``body`` is ``B[i] = max(B[i], x)`` (or ``min``) on floats: a step of a max/min reduction."""
    if not isinstance(body, tirx.BufferStore) or not isinstance(body.value, (tirx.Max, tirx.Min)):
        return False
    accumulates = any(
        isinstance(operand, TensorLoad) and operand.source.same_as(body.buffer)
        for operand in (body.value.a, body.value.b)
    )
    return accumulates and str(body.buffer.dtype).startswith("float")


@dataclass(frozen=True)
class RewriteSpatialInnermost:
    """Move a contiguous spatial loop innermost in a loop nest that ends in a reduction loop.

    A reduction loop cannot be vectorized. ``compute_at`` rebuilds a block's
    loops in the order of its iterators, which for an rfactor block (whose
    partial-result axis comes first) puts the reduction innermost and walks
    the input with a stride; with the partial-result axis innermost instead,
    every access is contiguous and the loop is vectorized. Only the loops
    that hold this block alone are reordered. Must run before
    ``rewrite-parallel-vectorize-unroll``.
    """

    name: str = "rewrite-spatial-innermost"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        for name in sblock_names(sch):
            block = sch.get_sblock(name)
            loops = sch.get_loops(block)
            kinds = loop_kinds(sch, block, loops)
            if not loops or kinds[-1] != REDUCTION:
                continue
            own = [loop for loop in loops if len(sch.get_child_blocks(loop)) == 1]  # a suffix of ``loops``
            kinds = kinds[len(loops) - len(own) :]
            if len(own) < 2 or set(kinds) - {SPATIAL, REDUCTION}:
                continue
            contiguous = [
                loop for loop, kind in zip(own, kinds) if kind == SPATIAL and contiguous_along(sch, block, loop)
            ]
            if contiguous:
                innermost = contiguous[-1]
                try:
                    sch.reorder(*[loop for loop in own if loop is not innermost], innermost)
                except RuntimeError as exc:  # TVM schedule errors
                    return f"block {name}: {last_line(exc)}"
        return None


@dataclass(frozen=True)
class RewriteReductionBlock:
    """Split a reduction's initialisation out of its reduction loops (``decompose_reduction``).

    Left inside, the init is a branch executed on every reduction step of the
    innermost loops, which blocks vectorization of the hot loop.
    """

    name: str = "rewrite-reduction-block"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        for name in sblock_names(sch):
            block = sch.get_sblock(name)
            if sch.get(block).init is None:
                continue
            loops = sch.get_loops(block)
            kinds = loop_kinds(sch, block, loops)
            if REDUCTION not in kinds:
                continue
            try:
                sch.decompose_reduction(block, loops[kinds.index(REDUCTION)])
            except RuntimeError as exc:  # TVM schedule errors
                return f"block {name}: {last_line(exc)}"
        return None
