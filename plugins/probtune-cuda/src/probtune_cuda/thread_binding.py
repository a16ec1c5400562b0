"""Thread binding for the blocks no tiling module takes: row reductions across a block's threads, the rest spread out.

``gpu-cross-thread-reduction`` gives each output of a reduction whose
reduced loops are innermost (a softmax's row maximum and sum, a layer norm's
moments) one thread block, and its reduced values to that block's threads:
TVM lowers the sum across the threads to warp shuffles. ``gpu-auto-bind``
spreads any other block's leading spatial loops over thread blocks and
threads; where the block reduces in each thread (a pooling window), its
elementwise consumers are computed in the same threads. Both sample the
number of threads, which the categorical mutator then changes
(MetaSchedule's thread-binding mutation); ``rewrite-unbound-block``
still binds whatever neither took. Both run after the other modules went
through every block (``after_blocks``): a tiling may still fold a block
into its own loops.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tvm import s_tir

from probtune.plugin import (
    REDUCTION,
    SPATIAL,
    BlockRV,
    ExprRV,
    LoopRV,
    Schedule,
    SpaceContext,
    allows,
    is_spatial,
    loop_kinds,
)
from probtune_cuda.blocks import unbound
from probtune_cuda.limits import block_limit
from probtune_cuda.multi_level_tiling import elementwise_consumer

__all__ = ["GPUAutoBind", "GPUCrossThreadReduction"]


def _unbound_loops(sch: Schedule, block: BlockRV) -> tuple[list[LoopRV], list[str]] | None:
    """The loops of a block at the root that no module bound to GPU axes, with their kinds; None otherwise."""
    raw, block_rv = sch.tvm, sch.resolve(block)
    if not unbound(raw, block_rv):
        return None
    return sch.get_loops(block), loop_kinds(raw, block_rv, list(raw.get_loops(block_rv)))


def _threads(
    sch: Schedule, loops: Sequence[LoopRV], choices: Sequence[int], ctx: SpaceContext, divide: bool
) -> ExprRV | None:
    """A sampled thread count for ``loops`` fused: among ``choices``, within the target's limit and their extent
    (dividing it if ``divide``); None if none fits or an extent is not constant."""
    extents = [sch.loop_extent(loop) for loop in loops]
    if not extents or None in extents:
        return None
    extent = math.prod(e for e in extents if e is not None)
    limit = block_limit(ctx.target.tvm_target, "max_threads_per_block")
    fits = [n for n in choices if n <= min(limit, extent) and (not divide or extent % n == 0)]
    if not fits:
        return None
    return sch.sample_uniform(fits)


@dataclass(frozen=True)
class GPUCrossThreadReduction:
    """Reduce each output's innermost reduced loops across one thread block's threads."""

    name: str = "gpu-cross-thread-reduction"
    thread_extents: tuple[int, ...] = (32, 64, 128, 256, 512)
    after_blocks: bool = True

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> None:
        found = _unbound_loops(sch, block)
        if found is None:
            return
        loops, kinds = found
        first = kinds.index(REDUCTION) if REDUCTION in kinds else len(kinds)
        if first == len(kinds) or any(kind != REDUCTION for kind in kinds[first:]):
            return
        if any(kind != SPATIAL for kind in kinds[:first]):
            return
        threads = _threads(sch, loops[first:], self.thread_extents, ctx, divide=True)
        if threads is None:
            return
        _, lanes = sch.split(sch.fuse(*loops[first:]), [None, threads])
        sch.bind(lanes, "threadIdx.x")
        if first:
            sch.bind(sch.fuse(*loops[:first]), "blockIdx.x")


@dataclass(frozen=True)
class GPUAutoBind:
    """Spread a block's leading spatial loops over thread blocks and a sampled number of threads each; a reduction's
    elementwise consumers follow it into its threads."""

    name: str = "gpu-auto-bind"
    thread_extents: tuple[int, ...] = (32, 64, 128, 256, 512, 1024)
    after_blocks: bool = True

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> None:
        found = _unbound_loops(sch, block)
        if found is None or _follows_a_reduction(sch.tvm, sch.resolve(block)):
            return
        loops, kinds = found
        leading = next((n for n, kind in enumerate(kinds) if kind != SPATIAL), len(kinds))
        threads = _threads(sch, loops[:leading], self.thread_extents, ctx, divide=False)
        if threads is None:
            return
        grid, lanes = sch.split(sch.fuse(*loops[:leading]), [None, threads])
        sch.bind(grid, "blockIdx.x")
        sch.bind(lanes, "threadIdx.x")
        if REDUCTION in kinds:
            _finish_at_threads(sch, block, lanes)


def _follows_a_reduction(raw: s_tir.Schedule, block_rv: s_tir.schedule.SBlockRV) -> bool:
    """Whether the block ends a chain of elementwise consumers of an unbound reduction (a cast after a pooling): it is
    left for the reduction's binding to take (:func:`_finish_at_threads`), which comes later (consumers come first)."""
    while len(producers := raw.get_producers(block_rv)) == 1 and unbound(raw, producers[0]):
        if elementwise_consumer(raw, producers[0]) != raw.get(block_rv).name_hint:
            return False
        if not is_spatial(raw.get(producers[0])):
            return True
        block_rv = producers[0]
    return False


def _finish_at_threads(sch: Schedule, block: BlockRV, lanes: LoopRV) -> None:
    """Compute the elementwise consumers of a reduction that each thread computes whole (a pooling window's maximum,
    a small mean) where the thread has the value, kept in a register: a cast or scale after it is then no kernel of
    its own and no store to memory.

    TVM decides whether a consumer can move (it must read no other block's output computed elsewhere).
    """
    while (name := elementwise_consumer(sch.tvm, sch.resolve(block))) is not None:
        consumer = sch.get_sblock(name)
        if not _moved_under(sch, consumer, lanes):
            return
        sch.set_scope(block, 0, "local")  # only its consumer, in the same thread, reads it
        block = consumer


def _moved_under(sch: Schedule, block: BlockRV, loop: LoopRV) -> bool:
    """Whether TVM allows computing ``block`` under ``loop``, having done it if so."""
    moved, at = sch.resolve(block), sch.resolve(loop)
    if not allows(sch.tvm, lambda trial: trial.reverse_compute_at(moved, at)):
        return False
    sch.reverse_compute_at(block, loop)
    return True
