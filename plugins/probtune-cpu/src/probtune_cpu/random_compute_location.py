"""Sample where a producer is computed: as written (at the root), inlined, or inside a loop of its consumer.

Computing a producer inside its consumer's loop nest keeps the produced tile in
cache until it is read (conv padding inside the convolution's output tile,
softmax's row max right before the row's exponentials). TVM lists the legal
locations (-2 inline when the block can be inlined, -1 the root, then the
indices of the consumer's usable loops); the sampled index is the decision,
and ``compute_at`` does the rest: at the root mark it does nothing, at the
inline mark it inlines the block. Both are recorded, so a replay with any
decision is a valid program.

A sampled "inline" removes the block, so this module must be the last one
applied to a block (no later instruction of the trace may name it); blocks
are visited consumers first, so the blocks visited after it never refer to
it by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import s_tir

from probtune.plugin import BlockRV, Schedule, SpaceContext, iter_stmts, realize_of

__all__ = ["PLACE_PRODUCERS_KEY", "RandomComputeLocation", "owns_untiled_nest"]

PLACE_PRODUCERS_KEY = "probtune.place_producers"
"""Block annotation: the block's producers were created by a module (e.g. rfactor) and need a location too."""


def owns_untiled_nest(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """Whether the block sits alone in a loop nest under the root that no module has tiled yet.

    Untiled: each block iterator is bound to one loop variable, as written.
    """
    loops = sch.get_loops(block)
    if not loops:
        return False
    outer = sch.get_sref(loops[0])
    if outer.parent is None or not isinstance(outer.parent.stmt, s_tir.SBlock):
        return False
    if sum(isinstance(stmt, s_tir.SBlockRealize) for stmt in iter_stmts(outer.stmt)) != 1:
        return False
    loop_vars = [sch.get(loop).loop_var for loop in loops]
    bindings = realize_of(sch, block).iter_values
    return len(bindings) == len(loop_vars) and all(any(value.same_as(var) for var in loop_vars) for value in bindings)


def _is_movable(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """Whether ``compute_at`` can give the block a new place without undoing an earlier module's work.

    It regenerates the block's loops, which would throw a sampled tiling away,
    and someone must read what the block writes.
    """
    return owns_untiled_nest(sch, block) and len(sch.get_consumers(block)) > 0


@dataclass(frozen=True)
class RandomComputeLocation:
    """Sample a compute location for a movable block, then for the producers it was asked to place."""

    name: str = "random-compute-location"

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> None:
        raw, block_rv = sch.tvm, sch.resolve(block)
        flagged_producers: list[str] = []
        if PLACE_PRODUCERS_KEY in raw.get(block_rv).annotations:
            # looked up by name: a traced get_producers would pin how many producers every replay must find
            flagged_producers = [raw.get(p).name_hint for p in raw.get_producers(block_rv)]
            sch.unannotate(block, PLACE_PRODUCERS_KEY)
        if _is_movable(raw, block_rv):
            sch.compute_at(block, sch.sample_compute_location(block))
        for name in flagged_producers:
            producer = sch.get_sblock(name)
            if _is_movable(raw, sch.resolve(producer)):
                sch.compute_at(producer, sch.sample_compute_location(producer))
