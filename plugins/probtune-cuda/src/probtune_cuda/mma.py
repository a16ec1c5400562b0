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

int8 ``mma.sync`` multiplies 16x16x32 tiles, WMMA 16x16x16 ones. For int8
inputs the tiling samples the tiles' reduction extent instead
(``TILE_K_KEY``: 16, or 32 on Ampere and later), and the instruction
follows from it: 32-deep tiles run on ``mma.sync``. Either way the nest's
shape is fixed by the program and its decisions, as a trace needs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from tvm import s_tir

from probtune.plugin import UNROLL_KEY, SpaceContext, nested_sblocks
from probtune_cuda.intrinsics import TENSORIZE_INIT_KEY, TENSORIZE_KEY, load_tensor_intrinsics
from probtune_cuda.limits import compute_capability

__all__ = [
    "INSTRUCTION_KEY",
    "INT8_MMA_K",
    "MMA_MIN_ARCH",
    "MMA_SYNC",
    "TILE_K_KEY",
    "WMMA",
    "WMMA_TILE",
    "RewriteMMASync",
    "instruction_choices",
    "mma_names",
    "tile_k_choices",
]

INSTRUCTION_KEY = "probtune.tensor_core_instruction"
"""Block annotation: which instruction runs the block's tiles (``WMMA`` or ``MMA_SYNC``)."""

TILE_K_KEY = "probtune.tensor_core_tile_k"
"""Block annotation on int8 tiles: their sampled reduction extent, which picks the instruction (``INT8_MMA_K``: ``mma.sync``)."""

WMMA, MMA_SYNC = 0, 1

WMMA_TILE = 16
"""WMMA's tile: 16x16x16 for float16 and int8; ``mma.sync``'s too, but for int8's reduction (``INT8_MMA_K``)."""

INT8_MMA_K = 32
"""The reduction extent of an int8 ``mma.sync`` tile."""

MMA_MIN_ARCH = 80
"""``mma.sync`` of 16x8x16 float16 and 16x8x32 int8 tiles needs Ampere (sm_80) or later."""

_SHARED = "shared.dyn"
_ROLES = ("init", "load_a", "load_b", "compute", "store")


def instruction_choices(in_dtype: str, arch: int) -> tuple[int, ...]:
    """The instructions a block of ``in_dtype`` inputs can run on a GPU of compute capability ``arch``."""
    return (WMMA, MMA_SYNC) if in_dtype == "float16" and arch >= MMA_MIN_ARCH else (WMMA,)


def tile_k_choices(in_dtype: str, arch: int, trans_b: bool) -> tuple[int, ...]:
    """The tiles' reduction extents to sample: WMMA's 16, and ``mma.sync``'s 32 for int8 on Ampere or later.

    Only a B laid out ``[j, k]`` is offered to int8 ``mma.sync``: TVM loads a
    ``[k, j]`` one byte by byte into an array its index leaves in local memory.
    """
    return (WMMA_TILE, INT8_MMA_K) if in_dtype == "int8" and arch >= MMA_MIN_ARCH and trans_b else (WMMA_TILE,)


def _mma_group(in_dtype: str, out_dtype: str, trans_b: bool) -> dict[str, str]:
    """The ``mma.sync`` intrinsics of one input and accumulator type, by role (``init``, ``load_a``, ...)."""
    intrinsics = load_tensor_intrinsics()
    return dict(intrinsics.get_mma_intrin_group(_SHARED, _SHARED, in_dtype, out_dtype, False, trans_b, True))


@functools.cache
def _shared_tile(intrinsic: str) -> tuple[int, int] | None:
    """The shape of the shared-memory tile a load or store intrinsic reads or writes; None if it has none."""
    from tvm.s_tir import TensorIntrin

    load_tensor_intrinsics()
    desc = TensorIntrin.get(intrinsic).desc
    for buffer in desc.params:  # the buffers it matches
        if str(buffer.scope()).startswith("shared"):
            rows, cols = (int(extent) for extent in buffer.shape[-2:])
            return rows, cols
    return None


@functools.cache
def mma_names() -> dict[str, str]:
    """Each WMMA intrinsic that has an ``mma.sync`` counterpart, with that counterpart's name.

    For int8 the counterpart computes a 32-deep tile: only a tile cut that deep is renamed.
    """
    intrinsics = load_tensor_intrinsics()
    names = {}
    for in_dtype, out_dtype in (("float16", "float32"), ("float16", "float16"), ("int8", "int32")):
        for trans_b in (False, True):
            wmma = intrinsics.get_wmma_intrin_group(_SHARED, _SHARED, in_dtype, out_dtype, trans_b)
            mma = _mma_group(in_dtype, out_dtype, trans_b)
            names.update({wmma[role]: mma[role] for role in _ROLES})
    return names


@dataclass(frozen=True)
class RewriteMMASync:
    """Rewrite each tensorized block sampled for ``mma.sync``: ``warp`` fragments in ``ldmatrix``'s layout, ``mma`` tiles."""

    name: str = "rewrite-mma-sync"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        for block in nested_sblocks(sch):
            try:
                instruction = _sampled_instruction(sch, block)
            except ValueError as error:
                return str(error)
            if instruction in (None, WMMA):
                continue
            if compute_capability(ctx.target.tvm_target) < MMA_MIN_ARCH:
                return f"mma.sync needs sm_{MMA_MIN_ARCH} or later"
            reason = _to_mma(sch, block)
            if reason is not None:
                return reason
        return None


def _sampled_instruction(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> int | None:
    """The instruction sampled for a tensorized block (its annotation taken off), None for other blocks.

    Raises ValueError naming a sampled value that is no instruction.
    """
    annotations = sch.get(block).annotations
    if (choice := annotations.get(INSTRUCTION_KEY)) is not None:
        sch.unannotate(block, INSTRUCTION_KEY)
        if int(choice) not in (WMMA, MMA_SYNC):
            raise ValueError(f"tensor-core instruction {int(choice)} is neither WMMA ({WMMA}) nor mma.sync ({MMA_SYNC})")
        return int(choice)
    if (k := annotations.get(TILE_K_KEY)) is not None:
        sch.unannotate(block, TILE_K_KEY)
        if int(k) not in (WMMA_TILE, INT8_MMA_K):
            raise ValueError(f"an int8 tile {int(k)} deep runs on neither WMMA ({WMMA_TILE}) nor mma.sync ({INT8_MMA_K})")
        return MMA_SYNC if int(k) == INT8_MMA_K else WMMA
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
            tile = _shared_tile(names[_intrinsic(sch, block, TENSORIZE_KEY)]) or (WMMA_TILE, WMMA_TILE)  # the accumulator's
            sch.set_scope(block, 0, "warp")
            sch.transform_layout(block, ("write", 0), functools.partial(_ldmatrix_layout, tile))
        for key in (TENSORIZE_KEY, TENSORIZE_INIT_KEY):
            if intrinsic := _intrinsic(sch, block, key):
                sch.unannotate(block, key)  # TVM keeps an annotation's old value when it is set again
                sch.annotate(block, key, names[intrinsic])
    return None


def _intrinsic(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, key: str) -> str:
    return str(sch.get(block).annotations.get(key, ""))


def _ldmatrix_layout(tile: tuple[int, int], *indices: Any) -> tuple[Any, ...]:
    """A fragment buffer's index to ``ldmatrix``'s: per tile of the last two dimensions, lane and value."""
    *outer, row, col = indices
    rows, cols = tile
    layout = getattr(load_tensor_intrinsics(), f"shared_{rows}x{cols}_to_ldmatrix_32x{rows * cols // 32}_layout")
    lane, value = layout(row % rows, col % cols)
    return (*outer, row // rows, col // cols, lane, value)
