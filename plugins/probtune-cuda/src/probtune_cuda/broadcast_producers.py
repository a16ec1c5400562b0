"""Small producers of values a block reads broadcast, computed inside each of that block's thread blocks.

A squeeze-excite's second step computes one scale per channel (a small
convolution of the squeezed vector, its bias and a sigmoid) and multiplies
every element of a feature map by its channel's scale. Bound block by
block, the scales are a kernel of their own, a few dozen threads' work that
the multiplication's kernel then waits for. ``gpu-broadcast-producers``
spreads the reading block over thread blocks and computes the scales each
thread block needs inside it, in shared memory, over the same threads: one
kernel, the scales computed once per thread block instead of once in all.

The producers qualify where their whole work, with all they depend on, is a
small share of the reading block's (``MIN_BROADCAST``): a row's maximum that
a softmax's exponentials read is as much work as they are, and is left to
``gpu-row-kernel``. Recomputing them per thread block costs each thread a few
iterations for a small vector and hundreds for a wide one, where a kernel of
their own is as cheap; the space keeps both as sketches, this one first where
a thread recomputes at most ``FIRST_BELOW`` iterations. It runs before the
tilings, which would otherwise bind the producers on their own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import tvm
from tvm import s_tir

from probtune.plugin import (
    SPATIAL,
    BlockRV,
    ExprRV,
    LoopRV,
    Schedule,
    SpaceContext,
    allows,
    is_spatial,
    loop_kinds,
    sblock_names,
)
from probtune_cuda.blocks import iterations, unbound, with_dependencies
from probtune_cuda.limits import block_limit

__all__ = ["FIRST_BELOW", "MIN_BROADCAST", "GPUBroadcastProducers"]

MIN_BROADCAST = 16
"""The reading block must run at least this many times per iteration of the producers (all of them together)."""

FIRST_BELOW = 128
"""Recomputing at most this many producer iterations per thread makes the fused program the space's first sketch."""


@dataclass(frozen=True)
class _Plan:
    """``reader`` reads ``producers`` (its broadcast producer and everything that one depends on, consumers first)."""

    reader: str
    producers: tuple[str, ...]


def _elements(buffer: tvm.tirx.Buffer) -> int | None:
    shape = [int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in buffer.shape]
    return None if None in shape else math.prod(d for d in shape if d is not None)


def _plan(raw: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> _Plan | None:
    """The broadcast producers of a spatial block at the root: one producer whose work, with all it depends on, is at
    most a ``MIN_BROADCAST``-th of the block's."""
    sblock = raw.get(block)
    if not unbound(raw, block) or not is_spatial(sblock):
        return None
    runs = iterations(raw, block)
    if runs is None:
        return None
    for producer in raw.get_producers(block):
        closure = with_dependencies(raw, producer)
        work = [iterations(raw, b) for b in closure] if closure is not None else [None]
        if None in work or sum(w for w in work if w is not None) * MIN_BROADCAST > runs:
            continue
        return _Plan(sblock.name_hint, tuple(raw.get(b).name_hint for b in closure or []))
    return None


def _spread(sch: Schedule, loops: Sequence[LoopRV], threads: ExprRV | int) -> tuple[LoopRV, LoopRV]:
    """Fuse ``loops`` and split them over ``threads`` threads of a block: the outer loop and the loop over the threads."""
    outer, lanes = sch.split(sch.fuse(*loops), [None, threads])
    sch.bind(lanes, "threadIdx.x")
    return outer, lanes


def _inline(sch: Schedule, plan: _Plan) -> list[str]:
    """Inline the producers' spatial steps into the producers that read them (a bias add into its sigmoid, a copy
    into the convolution reading it), where TVM allows, before they are bound (``auto-inline`` leaves blocks computed
    inside a kernel alone); the broadcast producer itself, read by the reader, stays. The producers left."""
    left = list(plan.producers)
    for name in plan.producers[1:]:
        block = sch.get_sblock(name)
        if _inlinable(sch.tvm, sch.resolve(block)):
            sch.compute_inline(block)
            left.remove(name)
    return left


def _inlinable(raw: s_tir.Schedule, block_rv: s_tir.schedule.SBlockRV) -> bool:
    return is_spatial(raw.get(block_rv)) and allows(raw, lambda trial: trial.compute_inline(block_rv))


def _fuse(sch: Schedule, plan: _Plan, threads: ExprRV | int) -> None:
    """Spread the reader over thread blocks of ``threads`` threads, and compute each producer under its thread-block
    loop, in shared memory, its output's elements over the same threads (each thread reducing its own)."""
    producers = _inline(sch, plan)
    grid, _ = _spread(sch, sch.get_loops(sch.get_sblock(plan.reader)), threads)
    for name in producers:
        producer = sch.get_sblock(name)
        sch.compute_at(producer, grid)
        sch.set_scope(producer, 0, "shared")
        inner = sch.get_loops(producer)[1:]
        kinds = loop_kinds(sch.tvm, sch.resolve(producer), [sch.resolve(loop) for loop in inner])
        spatial = [loop for loop, kind in zip(inner, kinds) if kind == SPATIAL]
        if spatial and all(kind == SPATIAL for kind in kinds[: len(spatial)]):  # the reduced loops stay in the thread
            _spread(sch, spatial, threads)
    sch.bind(grid, "blockIdx.x")


def _per_thread(trial: Schedule, plan: _Plan, threads: int) -> int | None:
    """The producer iterations each thread computes with ``threads`` threads a block, fused on ``trial`` (a copy);
    None where TVM refuses a step or an extent is symbolic."""
    try:
        _fuse(trial, plan, threads)
    except (RuntimeError, ValueError):  # TVM refused a step: the producers cannot be computed per thread block
        return None
    raw = trial.tvm
    reader_loops = raw.get_loops(raw.get_sblock(plan.reader))
    blocks = raw.get(reader_loops[0]).extent
    names = set(sblock_names(raw))
    work = [iterations(raw, raw.get_sblock(name)) for name in plan.producers if name in names]
    if not isinstance(blocks, tvm.tirx.IntImm) or None in work:
        return None
    return -(-sum(w for w in work if w is not None) // (int(blocks) * threads))


@dataclass(frozen=True)
class GPUBroadcastProducers:
    """Compute a block's small broadcast producers inside each of its thread blocks; the unfused program is a fork."""

    name: str = "gpu-broadcast-producers"
    thread_extents: tuple[int, ...] = (64, 128, 256, 512)

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> list[Schedule] | None:
        plan = _plan(sch.tvm, sch.resolve(block))
        if plan is None:
            return None
        runs = iterations(sch.tvm, sch.resolve(block)) or 0
        limit = block_limit(ctx.target.tvm_target, "max_threads_per_block")
        choices = [n for n in self.thread_extents if n <= min(limit, runs)]
        if not choices or _shared_bytes(sch.tvm, plan) > block_limit(ctx.target.tvm_target, "max_shared_memory_per_block"):
            return None
        per_thread = _per_thread(Schedule(sch.mod, instructions=ctx.instructions), plan, choices[0])
        if per_thread is None:
            return None
        fork = sch.fork()
        fused = sch if per_thread <= FIRST_BELOW else fork
        _fuse(fused, plan, fused.sample_uniform(choices))
        return [fork]


def _shared_bytes(raw: s_tir.Schedule, plan: _Plan) -> int:
    """The shared memory the producers' whole outputs would take: at least what a thread block keeps of them."""
    total = 0
    for name in plan.producers:
        buffer = raw.get(raw.get_sblock(name)).writes[0].source
        total += (_elements(buffer) or 0) * tvm.DataType(buffer.dtype).bits // 8
    return total
