"""Multi-level tiling: the loop structure behind fast CPU reductions (matmul, conv)."""

from __future__ import annotations

from dataclasses import dataclass

from probtune import SpaceContext
from probtune.schedule import BlockRV, LoopRV, Schedule
from probtune.tir import REDUCTION, SPATIAL, loop_kinds

__all__ = ["MultiLevelTiling"]


@dataclass(frozen=True)
class MultiLevelTiling:
    """Tile spatial loops in ``structure``'s S levels and reduction loops in its R levels.

    With the default "SSRSRS" every spatial loop is split into 4 sampled
    perfect tiles and every reduction loop into 2, then the tiles are
    reordered level by level, so that the innermost levels form a small
    register/L1-resident kernel and the outer ones walk the caches.
    """

    name: str = "multi-level-tiling"
    structure: str = "SSRSRS"
    max_innermost_factor: int = 64

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> None:
        loops = sch.get_loops(block)
        kinds = loop_kinds(sch.tvm, sch.resolve(block), [sch.resolve(loop) for loop in loops])
        if REDUCTION not in kinds or SPATIAL not in kinds or set(kinds) - {SPATIAL, REDUCTION}:
            return
        if any(sch.loop_extent(loop) is None for loop in loops):
            return
        levels: dict[str, list[list[LoopRV]]] = {
            SPATIAL: [[] for _ in range(self.structure.count("S"))],
            REDUCTION: [[] for _ in range(self.structure.count("R"))],
        }
        for loop, kind in zip(loops, kinds):
            depth = len(levels[kind])
            tiles = sch.sample_perfect_tile(loop, depth, self.max_innermost_factor)
            for level, tile_loop in zip(levels[kind], sch.split(loop, tiles)):
                level.append(tile_loop)
        order: list[LoopRV] = []
        next_level = {SPATIAL: 0, REDUCTION: 0}
        for letter in self.structure:
            kind = SPATIAL if letter == "S" else REDUCTION
            order.extend(levels[kind][next_level[kind]])
            next_level[kind] += 1
        sch.reorder(*order)
