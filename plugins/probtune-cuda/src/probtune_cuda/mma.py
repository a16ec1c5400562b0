"""The tensor cores through ``ldmatrix`` and ``mma.sync``, an alternative to WMMA sampled per tensorized block.

WMMA's fragments are opaque: the compiler chooses how a 16x16 tile is
spread over a warp's registers. ``mma.sync`` names that layout, so the
operands are loaded from shared memory with ``ldmatrix`` (a warp reads four
8x8 matrices at once, conflict-free) and kept in ``warp`` buffers laid out
as ``ldmatrix`` leaves them: each 16x16 tile as 32 lanes of 8 values
(TVM's ``shared_16x16_to_ldmatrix_32x8_layout``).

The tensor-core tiling builds one nest for both: its fragment loads,
multiply-accumulate and store are WMMA tiles, and it samples which
instruction runs them (``INSTRUCTION_KEY`` on the tensorized block; float16
inputs on Ampere or later). ``rewrite-mma-sync`` turns a block sampled for
``mma.sync`` into it before the other validators finish the program: its
fragments become ``warp`` buffers in that layout and each tile is marked
for its ``mma`` intrinsic instead; its loops are not unrolled (TVM's
unrolling leaves the operands of ``ldmatrix`` and ``mma`` in local memory,
which the cubin lint refuses). Unlike MetaSchedule's default space,
where the WMMA rule claims every block, both are reachable in one space.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from tvm import s_tir

from probtune import SpaceContext
from probtune.tir import nested_sblocks
from probtune_cpu.parallel_vectorize import UNROLL_KEY
from probtune_cuda.intrinsics import TENSORIZE_INIT_KEY, TENSORIZE_KEY, load_tensor_intrinsics
from probtune_cuda.limits import compute_capability

__all__ = ["INSTRUCTION_KEY", "MMA_MIN_ARCH", "MMA_SYNC", "WMMA", "RewriteMMASync", "instruction_choices", "mma_names"]

INSTRUCTION_KEY = "probtune.tensor_core_instruction"
"""Block annotation: which instruction runs the block's tiles (``WMMA`` or ``MMA_SYNC``)."""

WMMA, MMA_SYNC = 0, 1

MMA_MIN_ARCH = 80
"""``mma.sync`` of 16x8x16 float16 tiles needs Ampere (sm_80) or later."""

_SHARED = "shared.dyn"
_ROLES = ("init", "load_a", "load_b", "compute", "store")


def instruction_choices(in_dtype: str, arch: int) -> tuple[int, ...]:
    """The instructions a block of ``in_dtype`` inputs can run on a GPU of compute capability ``arch``."""
    return (WMMA, MMA_SYNC) if in_dtype == "float16" and arch >= MMA_MIN_ARCH else (WMMA,)


@functools.cache
def mma_names() -> dict[str, str]:
    """Each WMMA intrinsic of float16 inputs that has an ``mma.sync`` counterpart, with that counterpart's name."""
    intrinsics = load_tensor_intrinsics()
    names = {}
    for out_dtype in ("float32", "float16"):
        for trans_b in (False, True):
            wmma = intrinsics.get_wmma_intrin_group(_SHARED, _SHARED, "float16", out_dtype, trans_b)
            mma = intrinsics.get_mma_intrin_group(_SHARED, _SHARED, "float16", out_dtype, False, trans_b, True)
            names.update({wmma[role]: mma[role] for role in _ROLES})
    return names


@dataclass(frozen=True)
class RewriteMMASync:
    """Rewrite each tensorized block sampled for ``mma.sync``: ``warp`` fragments in ``ldmatrix``'s layout, ``mma`` tiles."""

    name: str = "rewrite-mma-sync"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        for block in nested_sblocks(sch):
            choice = sch.get(block).annotations.get(INSTRUCTION_KEY)
            if choice is None:
                continue
            sch.unannotate(block, INSTRUCTION_KEY)
            if int(choice) == WMMA:
                continue
            if int(choice) != MMA_SYNC:
                return f"tensor-core instruction {int(choice)} is neither WMMA ({WMMA}) nor mma.sync ({MMA_SYNC})"
            if compute_capability(ctx.target.tvm_target) < MMA_MIN_ARCH:
                return f"mma.sync needs sm_{MMA_MIN_ARCH} or later"
            reason = _to_mma(sch, block)
            if reason is not None:
                return reason
        return None


def _to_mma(sch: s_tir.Schedule, compute: s_tir.schedule.SBlockRV) -> str | None:
    """Move a WMMA block, its fragment loads and its store to ``mma.sync``; why not, if it cannot."""
    tiles = [b for b in [*sch.get_producers(compute), compute, *sch.get_consumers(compute)] if _intrinsic(sch, b, TENSORIZE_KEY)]
    names = mma_names()
    for block in tiles:
        for key in (TENSORIZE_KEY, TENSORIZE_INIT_KEY):
            intrinsic = _intrinsic(sch, block, key)
            if intrinsic and intrinsic not in names:
                return f"block {sch.get(block).name_hint}'s {intrinsic} has no mma.sync counterpart"
    if UNROLL_KEY in sch.get(compute).annotations:
        sch.unannotate(compute, UNROLL_KEY)  # unrolled, ldmatrix's and mma's operands end up in local memory
    for block in tiles:
        if any(str(region.source.scope()).startswith("wmma.") for region in sch.get(block).writes):
            sch.set_scope(block, 0, "warp")
            sch.transform_layout(block, ("write", 0), _ldmatrix_layout)
        for key in (TENSORIZE_KEY, TENSORIZE_INIT_KEY):
            if intrinsic := _intrinsic(sch, block, key):
                sch.unannotate(block, key)  # TVM keeps an annotation's old value when it is set again
                sch.annotate(block, key, names[intrinsic])
    return None


def _intrinsic(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, key: str) -> str:
    return str(sch.get(block).annotations.get(key, ""))


def _ldmatrix_layout(*indices: Any) -> tuple[Any, ...]:
    """A fragment buffer's index to ``ldmatrix``'s: per 16x16 tile of the last two dimensions, lane and value."""
    *outer, row, col = indices
    lane, value = load_tensor_intrinsics().shared_16x16_to_ldmatrix_32x8_layout(row % 16, col % 16)
    return (*outer, row // 16, col // 16, lane, value)
