"""Parallelize outer loops over the cores and vectorize the innermost loop.

The module only *annotates* a block with the limits it sampled; the
validator ``rewrite-parallel-vectorize`` turns the annotations into real
fuse/parallel/vectorize steps on each replayed program. This keeps the
trace's structure independent of sampled tile sizes: how many loops to fuse
depends on their extents, which change from one sample to the next.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir

from probtune import SpaceContext
from probtune.schedule import BlockRV, Schedule
from probtune.tir import SPATIAL, block_names, loop_kinds

__all__ = ["ParallelVectorize", "RewriteParallelVectorize", "PARALLEL_KEY", "VECTORIZE_KEY"]

PARALLEL_KEY = "probtune.parallel_jobs"
VECTORIZE_KEY = "probtune.vector_lanes"
MAX_VECTORS_PER_LOOP = 16  # a longer innermost loop is left to LLVM rather than made one huge vector


@dataclass(frozen=True)
class ParallelVectorize:
    """Ask for ``jobs_per_core`` x cores parallel iterations and target-width vectors."""

    name: str = "parallel-vectorize"
    jobs_per_core: int = 16

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> None:
        if sch.tvm.get_loops(sch.resolve(block)) and _at_root(sch.tvm, sch.resolve(block)):
            sch.annotate(block, PARALLEL_KEY, self.jobs_per_core * ctx.target.num_cores)
            sch.annotate(block, VECTORIZE_KEY, ctx.target.vector_width)


def _at_root(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """Whether the block's loop nest hangs directly under the root block (not computed at another block)."""
    parent = sch.get_sref(sch.get_loops(block)[0]).parent
    return parent is not None and isinstance(parent.stmt, s_tir.SBlock)


@dataclass(frozen=True)
class RewriteParallelVectorize:
    """Fuse the leading spatial loops up to the job limit and parallelize them; vectorize the innermost."""

    name: str = "rewrite-parallel-vectorize"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        for name in block_names(sch.mod["main"]):
            block = sch.get_sblock(name)
            annotations = sch.get(block).annotations
            if PARALLEL_KEY not in annotations:
                continue
            max_jobs = int(annotations[PARALLEL_KEY])
            lanes = int(annotations[VECTORIZE_KEY])
            sch.unannotate(block, PARALLEL_KEY)
            sch.unannotate(block, VECTORIZE_KEY)
            try:
                self._rewrite(sch, block, max_jobs, lanes)
            except RuntimeError as exc:  # TVM schedule errors
                return f"block {name}: {str(exc).strip().splitlines()[-1]}"
        return None

    @staticmethod
    def _rewrite(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, max_jobs: int, lanes: int) -> None:
        loops = sch.get_loops(block)
        kinds = loop_kinds(sch, block, loops)
        extents = [sch.get(loop).extent for loop in loops]
        if any(not isinstance(e, tvm.tirx.IntImm) for e in extents):
            return
        sizes = [int(e) for e in extents]
        vectorize = len(loops) > 1 and kinds[-1] == SPATIAL and 1 < sizes[-1] <= lanes * MAX_VECTORS_PER_LOOP
        leading, jobs = 0, 1
        while leading < len(loops) - 1 and kinds[leading] == SPATIAL and jobs < max_jobs:
            jobs *= sizes[leading]
            leading += 1
        if vectorize:
            sch.vectorize(loops[-1])
        if jobs > 1:
            sch.parallel(sch.fuse(*loops[:leading]) if leading > 1 else loops[0])
