"""Turn the inner part of a long reduction into a spatial axis of partial results (rfactor).

A row reduction such as softmax's max and sum or layer norm's sums runs, as
written, one scalar accumulation chain per output: LLVM may not reorder
floating-point additions, so no vector lane is used. Splitting the reduction
``k`` into ``k_outer x k_inner`` and factoring out ``k_inner`` gives a new
block that accumulates ``k_inner`` independent partial results per output (a
spatial, vectorizable axis, innermost and contiguous in the partial-result
buffer), and leaves the original block summing those ``k_inner`` partials.
The split is a sampled perfect tile, so the search picks the width; an inner
factor of 1 gives back (nearly) the plain reduction.

The new ``<block>_rf`` block is not visited by the other modules (the space
generator walks the original blocks), so the original block is flagged for
``random-compute-location``, which samples where the partials are computed:
inside the original block's loop over outputs, the partials of one output are
computed right before they are summed and share its parallel loop.

When it applies (MetaSchedule's AddRFactor rule, restated for one fixed
choice), to a reduction block over an untiled loop nest whose loops are all
spatial or reduction with constant extents:

* without data reuse (every input read depends on every spatial iterator: a
  row reduction), whenever the reduction spans ``min_vectors`` full vectors:
  random samples of layer norm and softmax ran faster with the vector
  partials than without (bench/results/NOTES.md);
* with data reuse (matmul-like: multi-level tiling's job), only when the
  outputs are too few to occupy the cores (fewer than ``cores x
  max_jobs_per_core``) and fewer than the reduction's length.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

import tvm
from tvm import s_tir

from probtune.plugin import REDUCTION, SPATIAL, BlockRV, ExprRV, Schedule, SpaceContext, loop_kinds, reuses_data
from probtune_cpu.parallel_vectorize import PARALLEL_KEY, VECTORIZE_KEY
from probtune_cpu.random_compute_location import PLACE_PRODUCERS_KEY, owns_untiled_nest
from probtune_cpu.vector_unit import vector_width

__all__ = ["AddRFactor"]


def _rfactor_inner(
    sch: Any, block: Any, kinds: list[str], factors: Callable[[Any], Sequence[ExprRV | int | None]]
) -> Any:
    """Move the reduction loops innermost, fuse them, split in two and rfactor the inner part.

    Written once for both schedule kinds: the traced one (factors sampled)
    and a throw-away copy of the raw TVM one (fixed factors, to learn whether
    TVM accepts the reducer).
    """
    loops = sch.get_loops(block)
    spatial = [loop for loop, kind in zip(loops, kinds) if kind == SPATIAL]
    reduction = [loop for loop, kind in zip(loops, kinds) if kind == REDUCTION]
    if SPATIAL in kinds[kinds.index(REDUCTION) :]:
        sch.reorder(*spatial, *reduction)
    fused = sch.fuse(*reduction) if len(reduction) > 1 else reduction[0]
    _, inner = sch.split(fused, factors(fused))
    partials_ndim = len(sch.get(block).writes[0].region)
    return sch.rfactor(inner, partials_ndim)  # the new axis goes last: contiguous partials


@dataclass(frozen=True)
class AddRFactor:
    """Rfactor long reductions into vectorizable partial results (see the module docstring for when)."""

    name: str = "add-rfactor"
    max_jobs_per_core: int = 16
    min_vectors: int = 4
    max_innermost_factor: int = 64

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> None:
        raw, block_rv = sch.tvm, sch.resolve(block)
        kinds = self._kinds_if_wanted(raw, block_rv, ctx)
        if kinds is None:
            return
        try:
            _rfactor_inner(raw.copy(), block_rv, kinds, lambda _: [None, 1])
        except RuntimeError:  # TVM does not recognise the reducer
            return
        partials = _rfactor_inner(
            sch, block, kinds, lambda loop: sch.sample_perfect_tile(loop, 2, self.max_innermost_factor)
        )
        sch.annotate(block, PLACE_PRODUCERS_KEY, 1)
        # the modules never visit the new block: ask for its parallel loop and vectors here (dropped
        # by the rewrite if it is placed inside its consumer's parallel loop nest)
        sch.annotate(partials, PARALLEL_KEY, self.max_jobs_per_core * ctx.target.num_cores)
        sch.annotate(partials, VECTORIZE_KEY, vector_width(ctx.target))

    def _kinds_if_wanted(
        self, raw: s_tir.Schedule, block: s_tir.schedule.SBlockRV, ctx: SpaceContext
    ) -> list[str] | None:
        """The block's loop kinds if the rule above applies to it, else None."""
        sblock = raw.get(block)
        if sblock.init is None or len(sblock.writes) != 1 or not owns_untiled_nest(raw, block):
            return None
        loops = raw.get_loops(block)
        kinds = loop_kinds(raw, block, loops)
        if REDUCTION not in kinds or set(kinds) - {SPATIAL, REDUCTION}:
            return None
        extents = [raw.get(loop).extent for loop in loops]
        if not all(isinstance(extent, tvm.tirx.IntImm) for extent in extents):
            return None
        spatial = prod(int(e) for e, kind in zip(extents, kinds) if kind == SPATIAL)
        reduction = prod(int(e) for e, kind in zip(extents, kinds) if kind == REDUCTION)
        if reduction < self.min_vectors * vector_width(ctx.target):
            return None
        if reuses_data(sblock) and not spatial < min(reduction, ctx.target.num_cores * self.max_jobs_per_core):
            return None
        return kinds

