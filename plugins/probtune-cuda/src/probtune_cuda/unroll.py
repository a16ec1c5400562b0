"""GPU unrolling: the unroll limit sampled per loop nest, applied by TVM's loop unrolling when lowering.

The limit is sampled by the kernel's ``AutoUnroll`` module (registered
here as ``gpu-auto-unroll``, with MetaSchedule's CUDA choices; a tensor-core
tile's on the tile), which records it as a block annotation;
``rewrite-gpu-unroll`` turns it into the ``pragma_auto_unroll_max_step``
(and explicit unrolling) of the nest's outermost loop, which TVM's
``UnrollLoop`` pass reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir

from probtune.plugin import UNROLL_KEY, AutoUnroll, SpaceContext, sblock_names

__all__ = ["GPU_AUTO_UNROLL", "RewriteGPUUnroll"]

GPU_AUTO_UNROLL = AutoUnroll(name="gpu-auto-unroll", max_steps=(0, 16, 64, 512, 1024))
"""Sample an unroll limit for each loop nest at the root (MetaSchedule's CUDA choices)."""


@dataclass(frozen=True)
class RewriteGPUUnroll:
    """Move each block's sampled unroll limit onto its outermost loop, as the pragmas TVM's lowering reads."""

    name: str = "rewrite-gpu-unroll"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        for name in sblock_names(sch):
            block_rv = sch.get_sblock(name)
            step = sch.get(block_rv).annotations.get(UNROLL_KEY)
            if step is None:
                continue
            sch.unannotate(block_rv, UNROLL_KEY)
            loops = sch.get_loops(block_rv)
            if int(step) > 0 and loops:
                sch.annotate(loops[0], "pragma_auto_unroll_max_step", tvm.tirx.IntImm("int32", int(step)))
                sch.annotate(loops[0], "pragma_unroll_explicit", tvm.tirx.IntImm("int32", 1))
        return None
