"""GPU unrolling: a sampled unroll limit per loop nest, applied by TVM's loop unrolling when lowering.

The module records the choice as a block annotation; ``rewrite-gpu-unroll``
turns it into the ``pragma_auto_unroll_max_step`` (and explicit unrolling) of
the nest's outermost loop, which TVM's ``UnrollLoop`` pass reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir

from probtune import SpaceContext
from probtune.schedule import BlockRV, Schedule
from probtune.tir import at_root, block_names

__all__ = ["UNROLL_KEY", "GPUAutoUnroll", "RewriteGPUUnroll"]

UNROLL_KEY = "probtune.gpu_unroll_max_step"
"""Block annotation: how many steps TVM may unroll in this block's loop nest (0: none)."""


@dataclass(frozen=True)
class GPUAutoUnroll:
    """Sample an unroll limit for each loop nest at the root (MetaSchedule's CUDA choices)."""

    name: str = "gpu-auto-unroll"
    max_steps: tuple[int, ...] = (0, 16, 64, 512, 1024)

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> None:
        if at_root(sch.tvm, sch.resolve(block)):
            step = sch.sample_categorical(self.max_steps, [1.0 / len(self.max_steps)] * len(self.max_steps))
            sch.annotate(block, UNROLL_KEY, step)


@dataclass(frozen=True)
class RewriteGPUUnroll:
    """Move each block's sampled unroll limit onto its outermost loop, as the pragmas TVM's lowering reads."""

    name: str = "rewrite-gpu-unroll"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        for block_rv in _annotated_blocks(sch):
            step = int(sch.get(block_rv).annotations[UNROLL_KEY])
            sch.unannotate(block_rv, UNROLL_KEY)
            loops = sch.get_loops(block_rv)
            if step > 0 and loops:
                sch.annotate(loops[0], "pragma_auto_unroll_max_step", tvm.tirx.IntImm("int32", step))
                sch.annotate(loops[0], "pragma_unroll_explicit", tvm.tirx.IntImm("int32", 1))
        return None


def _annotated_blocks(sch: s_tir.Schedule) -> list[s_tir.schedule.SBlockRV]:
    blocks = [sch.get_sblock(name) for name in block_names(sch.mod["main"])]
    return [block for block in blocks if UNROLL_KEY in sch.get(block).annotations]
