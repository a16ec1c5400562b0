"""GPU unrolling: the unroll limit sampled per loop nest, applied by TVM's loop unrolling when lowering.

The limit is sampled by the CPU plugin's ``AutoUnroll`` module (registered
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

from probtune import SpaceContext
from probtune.schedule import BlockRV, Schedule
from probtune.tir import at_root, sblock_names
from probtune_cpu.parallel_vectorize import UNROLL_KEY, AutoUnroll

__all__ = ["GPU_AUTO_UNROLL", "GPUAutoUnroll", "RewriteGPUUnroll"]


@dataclass(frozen=True)
class GPUAutoUnroll(AutoUnroll):
    """``AutoUnroll``, which samples a tensor-core tile's limit on the tile: the root block its block was blockized into."""

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> None:
        tile = _tile_of(sch.tvm, sch.resolve(block))
        super().apply(sch, block if tile is None else sch.get_sblock(tile), ctx)


def _tile_of(raw: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> str | None:
    """The name of the root-level block enclosing ``block`` directly, if it is not at the root itself."""
    if at_root(raw, block):
        return None
    sref = raw.get_sref(block).parent
    while sref is not None and not isinstance(sref.stmt, s_tir.SBlock):
        sref = sref.parent
    if sref is None or sref.parent is None:  # under the root block: computed at another block's loops
        return None
    name = str(sref.stmt.name_hint)
    return name if at_root(raw, raw.get_sblock(name)) else None


GPU_AUTO_UNROLL = GPUAutoUnroll(name="gpu-auto-unroll", max_steps=(0, 16, 64, 512, 1024))
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
