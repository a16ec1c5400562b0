"""One kernel per row: a row's reductions, and the values between them, computed inside the kernel that uses them.

A softmax is a row maximum, the exponentials, their sum and the quotients;
a layer norm is a row sum, a sum of squared deviations and the normalized
values. Bound block by block, each step is a kernel of its own that writes
its result to global memory for the next to read back (four launches for a
softmax, three for a layer norm). ``gpu-row-kernel`` gives each row of the
last block one thread block, and computes the row's producers there, in
shared memory: a reduction's sum across the block's threads (TVM lowers it
to warp shuffles), a spatial producer's elements spread over the same
threads. TVM MetaSchedule's cross-thread reduction rule does the same for a
reduction with a fusible consumer.

A row may hold one value (a mean over a feature map, then its cast): one
thread writes it, behind a predicate. Summing each such row in a thread of
its own (``gpu-auto-bind``) is the other way, better where the rows are many
and short, so the space keeps both as sketches, the row kernel first where a
row has more terms than there are rows.

A function that returns a row's values and their cast as well (a layer norm
and its float16 copy, :mod:`probtune.model.cast_outputs`) binds the rows of the
values' block, which TVM cannot compute at another as it writes an output,
and computes the cast of each value where it is computed.

It applies where every producer reduces or computes whole rows of the last
block and none would be computed more than once; whether TVM allows the
compute-at steps is decided on a copy of the program, as ``auto-inline``
does, so a recorded choice holds on every replay.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import tvm
from tvm import s_tir

from probtune.plugin import (
    REDUCTION,
    SPATIAL,
    BlockRV,
    ExprRV,
    LoopRV,
    Schedule,
    SpaceContext,
    is_one,
    is_spatial,
    loop_kinds,
)
from probtune_cuda.blocks import iterations, unbound, with_dependencies
from probtune_cuda.limits import block_limit
from probtune_cuda.multi_level_tiling import reads_element_for_element

__all__ = ["GPURowKernel"]


@dataclass(frozen=True)
class _Plan:
    """The ``last`` block's leading ``rows`` loops index rows; ``producers`` are computed per row, consumers first,
    and ``tails`` (a cast of the last block's output) after it."""

    last: str
    rows: int
    producers: tuple[str, ...]
    tails: tuple[str, ...] = ()


def _row_loops(raw: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> int | None:
    """How many leading loops of a reduction block are spatial with only reduced loops after them, less the loops
    of one iteration just before those (a mean that keeps its reduced axis); None otherwise."""
    loops = list(raw.get_loops(block))
    kinds = loop_kinds(raw, block, loops)
    if REDUCTION not in kinds:
        return None
    first = kinds.index(REDUCTION)
    if any(kind != SPATIAL for kind in kinds[:first]) or any(kind != REDUCTION for kind in kinds[first:]):
        return None
    while first > 1 and is_one(raw.get(loops[first - 1]).extent):
        first -= 1
    return first


def _tail_of(raw: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> s_tir.schedule.SBlockRV | None:
    """The block's only producer where that writes an output of the function and the block, its only consumer,
    reads it element for element (a cast of it); None otherwise."""
    producers = raw.get_producers(block)
    if len(producers) != 1 or len(raw.get_consumers(producers[0])) != 1 or not _writes_output(raw, producers[0]):
        return None
    source, reader = raw.get(producers[0]), raw.get(block)
    cast = is_spatial(source) and is_spatial(reader) and reads_element_for_element(reader, source.writes[0].source)
    return producers[0] if cast and unbound(raw, producers[0]) else None


def _plan(raw: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> _Plan | None:
    """The row structure of ``block`` and its producers, if it has one: a spatial last block, at least one row
    reduction among its producers, all of them indexing the same number of leading row loops. A block that casts
    an output of the function (:func:`_tail_of`) is a tail of that output's block, which is then the last."""
    if not unbound(raw, block) or raw.get_consumers(block):
        return None
    tails: tuple[str, ...] = ()
    values = _tail_of(raw, block)
    if values is not None:
        block, tails = values, (raw.get(block).name_hint,)
    kinds = loop_kinds(raw, block, list(raw.get_loops(block)))
    found = with_dependencies(raw, block)
    producers = found[1:] if found is not None else None
    if not producers or any(kind != SPATIAL for kind in kinds):
        return None
    rows = {_row_loops(raw, p) for p in producers if not is_spatial(raw.get(p))}
    if len(rows) != 1 or None in rows:
        return None
    (row_count,) = rows
    if row_count is None or not 0 < row_count <= len(kinds):  # None for mypy: excluded above
        return None
    return _Plan(raw.get(block).name_hint, row_count, tuple(raw.get(p).name_hint for p in producers), tails)


def _writes_output(raw: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """Whether the block writes one of the function's outputs (a second output: a value and its cast)."""
    written = raw.get(block).writes[0].source
    return any(param.same_as(written) for param in raw.mod["main"].params)


def _spread(sch: Schedule, loops: Sequence[LoopRV], threads: ExprRV | int) -> LoopRV:
    """Fuse ``loops`` and spread them over ``threads`` threads of the block; the loop over the threads."""
    _, lanes = sch.split(sch.fuse(*loops), [None, threads])
    sch.bind(lanes, "threadIdx.x")
    return lanes


def _row_kernel(sch: Schedule, plan: _Plan, threads: ExprRV | int) -> LoopRV:
    """Bind the last block's rows to thread blocks and its columns to ``threads`` threads, then compute each
    producer at the row loop in shared memory, its columns (or its reduced loops) over the same threads, and each
    tail of the last block at each of its elements."""
    loops = sch.get_loops(sch.get_sblock(plan.last))
    row = sch.fuse(*loops[: plan.rows])
    columns = loops[plan.rows :]
    if not columns:  # one value per row (a mean in channels-last order, its channels indexing the rows)
        row, column = sch.split(row, [None, 1])
        columns = [column]
    lanes = _spread(sch, columns, threads)
    for name in plan.producers:
        producer = sch.get_sblock(name)
        sch.compute_at(producer, row)
        sch.set_scope(producer, 0, "shared")
        inner = sch.get_loops(producer)[1:]
        kinds = loop_kinds(sch.tvm, sch.resolve(producer), [sch.resolve(loop) for loop in inner])
        reduced = [loop for loop, kind in zip(inner, kinds) if kind == REDUCTION]
        _spread(sch, reduced or inner, threads)
    for name in plan.tails:
        sch.reverse_compute_at(sch.get_sblock(name), lanes)
    sch.bind(row, "blockIdx.x")
    return row


def _fuses(trial: Schedule, plan: _Plan, threads: int, rows: int, per_row: dict[str, int]) -> bool:
    """Whether the row kernel is legal on ``trial`` (a copy of the program) and each producer, computed per row,
    runs its body no more often than its ``per_row`` columns of each of the ``rows`` rows need (the last split
    of ``threads`` rounded up)."""
    try:
        _row_kernel(trial, plan, threads)
    except (RuntimeError, ValueError):  # TVM refused a step: the producers are not computed per row
        return False
    for name in plan.producers:
        runs = iterations(trial.tvm, trial.resolve(trial.get_sblock(name)))
        if runs is None or runs > rows * math.ceil(per_row[name] / threads) * threads:
            return False
    return True


def _thread_choices(per_row: Sequence[int], choices: Sequence[int], limit: int) -> list[int]:
    """Thread counts within ``limit`` and the longest per-row extent, those dividing every extent at least as long if
    any does; for rows shorter than every choice (an attention's 16 keys), the largest power of two within them (part
    of a warp, which TVM reduces with masked shuffles). A shorter extent (a mean's one value per row, written after
    its sum over a feature map) leaves threads idle behind a predicate."""
    longest = min(limit, max(per_row))
    fits = [n for n in choices if n <= longest] or ([1 << (longest.bit_length() - 1)] if longest > 1 else [])
    dividing = [n for n in fits if all(e % n == 0 for e in per_row if e >= n)]
    return dividing or fits


@dataclass(frozen=True)
class GPURowKernel:
    """Compute the rows of a block whose producers reduce over rows, with those producers, in one kernel."""

    name: str = "gpu-row-kernel"
    thread_extents: tuple[int, ...] = (32, 64, 128, 256, 512, 1024)
    after_blocks: bool = True

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> list[Schedule] | None:
        """Bind the row kernel; where each row has one value, also a fork that leaves the block to the other bindings,
        which sum each row in a thread of its own (the first sketch where the rows outnumber a row's terms)."""
        plan = _plan(sch.tvm, sch.resolve(block))
        if plan is None:
            return None
        trial = Schedule(sch.mod, instructions=ctx.instructions)
        shape = _per_row(trial, plan)
        if shape is None:
            return None
        rows, columns, per_row = shape
        if columns == 1 and max(per_row.values()) < min(self.thread_extents):
            return None  # one value of fewer terms than a warp (a pooling window): summed in a thread, as it is best
        choices = self._choices(trial, plan, shape, ctx)
        if not choices:
            return None
        fork = sch.fork() if columns == 1 else None
        bound = fork if fork is not None and rows >= max(per_row.values()) else sch
        _row_kernel(bound, plan, bound.sample_uniform(choices))
        return [fork] if fork is not None else None

    def _choices(self, trial: Schedule, plan: _Plan, shape: tuple[int, int, dict[str, int]], ctx: SpaceContext
                 ) -> list[int]:
        """The thread counts to sample, or [] where the rows' producers do not fit a thread block or TVM refuses."""
        rows, columns, per_row = shape
        if _shared_bytes(trial, per_row) > block_limit(ctx.target.tvm_target, "max_shared_memory_per_block"):
            return []
        limit = block_limit(ctx.target.tvm_target, "max_threads_per_block")
        choices = _thread_choices([columns, *per_row.values()], self.thread_extents, limit)
        return choices if choices and _fuses(trial, plan, choices[0], rows, per_row) else []


def _shared_bytes(trial: Schedule, per_row: dict[str, int]) -> int:
    """The shared memory bytes a row's producers take."""
    total = 0
    for name, elements in per_row.items():
        block = trial.get(trial.get_sblock(name))
        if is_spatial(block):  # a reduction keeps one value per row, a spatial producer the whole row
            total += elements * tvm.DataType(block.writes[0].source.dtype).bits // 8
    return total


def _per_row(trial: Schedule, plan: _Plan) -> tuple[int, int, dict[str, int]] | None:
    """The last block's rows and columns per row, and each producer's body runs per row; None where an extent is
    symbolic or a producer's work is not a whole number per row."""
    extents = [trial.loop_extent(loop) for loop in trial.get_loops(trial.get_sblock(plan.last))]
    runs = {name: iterations(trial.tvm, trial.resolve(trial.get_sblock(name))) for name in plan.producers}
    known = [e for e in extents if e is not None]
    counted = {name: n for name, n in runs.items() if n is not None}
    if len(known) < len(extents) or len(counted) < len(runs):
        return None
    rows, columns = math.prod(known[: plan.rows]), math.prod(known[plan.rows :])
    if columns == 0 or any(n % rows or n == 0 for n in counted.values()):
        return None
    return rows, columns, {name: n // rows for name, n in counted.items()}
