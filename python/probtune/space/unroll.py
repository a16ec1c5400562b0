"""Unrolling as a sampled choice: how far the compiler may unroll a block's loop nest, a choice every target's space makes.

``AutoUnroll`` only annotates the block with the limit it sampled
(``UNROLL_KEY``); each target's own post-processor turns the annotation into
the unrolling pragmas on the nest's outermost loop, where the loops are final.
"""

from __future__ import annotations

from dataclasses import dataclass

from probtune.interfaces import SpaceContext
from probtune.schedule.analysis import at_root, root_tile
from probtune.schedule.schedule import BlockRV, Schedule

__all__ = ["UNROLL_KEY", "AutoUnroll"]

UNROLL_KEY = "probtune.unroll_max_step"
"""Block annotation: the sampled unroll limit of the block's loop nest (0: none)."""


@dataclass(frozen=True)
class AutoUnroll:
    """Sample how far unrolling may go for the block's loop nest (0 turns it off).

    A block blockized into a tile (a tensor intrinsic's) has its limit sampled
    on the tile, which heads the loop nest.
    """

    name: str = "auto-unroll"
    max_steps: tuple[int, ...] = (0, 16, 64, 512)

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> None:
        tile = root_tile(sch.tvm, sch.resolve(block))
        if tile is not None:
            block = sch.get_sblock(tile)
        if at_root(sch.tvm, sch.resolve(block)):
            step = sch.sample_uniform(self.max_steps)
            sch.annotate(block, UNROLL_KEY, step)
