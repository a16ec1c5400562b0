"""Reject, before building, programs that cannot compile or would waste a measurement.

Each validator reads the finished program (after the rewrites; it changes
nothing) in a few milliseconds, where a program it rejects would cost a build
of a second or more, or the whole build timeout, and give no measurement.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

from probtune.plugin import SpaceContext, as_list, child_stmts, identity, iter_stmts
from probtune_cpu.parallel_vectorize import MAX_VECTORS_PER_LOOP
from probtune_cpu.stored_values import map_bottom_up
from probtune_cpu.vector_unit import vector_width

__all__ = [
    "VerifyNoRecompute", "VerifyParallel", "VerifyStaticLoops", "VerifyUnrollSize", "VerifyVectorize",
    "block_executions", "estimate_unrolled_size",
]

_UNROLL_STEP_KEY = "pragma_auto_unroll_max_step"  # what TVM's UnrollLoop pass reads


def _loops(func: tirx.PrimFunc, kind: tirx.ForKind | None = None) -> Iterator[tirx.For]:
    for stmt in iter_stmts(func.body):
        if isinstance(stmt, tirx.For) and (kind is None or stmt.kind == kind):
            yield stmt


def _constant(expr: tirx.Expr) -> int | None:
    return int(expr) if isinstance(expr, tirx.IntImm) else None


def _inside(loop: tirx.For) -> tuple[list[tirx.For], str | None]:
    """The loops under ``loop`` in program order, and the first block under it that it feeds a non-spatial iterator of.

    One walk of the loop's body answers both questions the loop verifiers ask.
    """
    loop_var_id = identity(loop.loop_var)
    loops: list[tirx.For] = []
    block = None
    for stmt in iter_stmts(loop.body):
        if isinstance(stmt, tirx.For):
            loops.append(stmt)
        elif block is None and isinstance(stmt, s_tir.SBlockRealize) and _binds_non_spatial_iterator(stmt, loop_var_id):
            block = stmt.block.name_hint
    return loops, block


def _binds_non_spatial_iterator(realize: s_tir.SBlockRealize, var_id: int) -> bool:
    """Whether a reduction (or opaque) iterator of the block depends on the variable whose ``identity`` is ``var_id``."""
    return any(
        int(iter_var.iter_type) != tirx.IterVar.DataPar
        and any(identity(v) == var_id for v in as_list(tirx.analysis.undefined_vars(value)))
        for iter_var, value in zip(as_list(realize.block.iter_vars), as_list(realize.iter_values))
    )


@dataclass(frozen=True)
class VerifyStaticLoops:
    """Reject a loop whose bounds are not constants.

    A candidate is built and timed at one shape; tile sampling, vectorization
    and unrolling all need constant extents, and x86 has no vectors of
    run-time length.
    """

    name: str = "verify-static-loops"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        for loop in _loops(sch.mod["main"]):
            if _constant(loop.min) is None or _constant(loop.extent) is None:
                return f"loop {loop.loop_var.name} runs from {loop.min} for {loop.extent} iterations"
        return None


@dataclass(frozen=True)
class VerifyVectorize:
    """Reject a vectorized loop that TVM cannot turn into good vector code.

    Rules: the extent is a constant (no run-time vector length on x86); it
    is at most ``max_vectors`` native vectors (wider, one operation no longer
    fits the register file (16 vectors on AVX2) and spills: the parallel/vectorize rewrite
    leaves such loops to LLVM for that reason); the loop is innermost, no loop
    of more than one iteration under it (TVM widens every statement of the
    body, so a nested loop becomes strided lane-by-lane accesses, and a nested
    vectorized loop fails the build); and every block iterator it feeds is
    data parallel (lanes of a reduction would write the same element).
    """

    name: str = "verify-vectorize"
    max_vectors: int = MAX_VECTORS_PER_LOOP

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        max_lanes = self.max_vectors * vector_width(ctx.target)
        for loop in _loops(sch.mod["main"], tirx.ForKind.VECTORIZED):
            name, lanes = loop.loop_var.name, _constant(loop.extent)
            if lanes is None:
                return f"vectorized loop {name} has a non-constant extent {loop.extent}"
            if lanes > max_lanes:
                return f"vectorized loop {name} has {lanes} lanes, more than {max_lanes} ({self.max_vectors} vectors)"
            loops_inside, block = _inside(loop)
            inner = next((s for s in loops_inside if _constant(s.extent) != 1), None)
            if inner is not None:
                return f"vectorized loop {name} is not innermost: loop {inner.loop_var.name} is inside it"
            if block is not None:
                return f"vectorized loop {name} feeds a reduction iterator of block {block}"
        return None


@dataclass(frozen=True)
class VerifyParallel:
    """Reject a parallel loop over a reduction, or one nested in another parallel loop.

    Threads running a reduction's iterations would race on the accumulator;
    TVM's thread pool cannot nest parallel loops (the build fails).
    """

    name: str = "verify-parallel"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        for loop in _loops(sch.mod["main"], tirx.ForKind.PARALLEL):
            name = loop.loop_var.name
            loops_inside, block = _inside(loop)
            nested = next((s for s in loops_inside if s.kind == tirx.ForKind.PARALLEL), None)
            if nested is not None:
                return f"parallel loop {nested.loop_var.name} is nested in parallel loop {name}"
            if block is not None:
                return f"parallel loop {name} feeds a reduction iterator of block {block}"
        return None


def estimate_unrolled_size(stmt: tirx.Stmt, vector_width: int) -> int:
    """Native vector operations in ``stmt`` once TVM has vectorized and unrolled it.

    Each store counts its value's operations (:func:`_operations`) once per
    vector register it stores. Follows TVM's UnrollLoop pass, which runs after
    vectorization: under a ``pragma_auto_unroll_max_step`` of N, a serial loop
    with no rolled loop inside is unrolled when its extent times its body's
    stores is at most N.
    """
    return _unroll(stmt, max_step=0, lanes=1, vector_width=vector_width)[2]


def _unroll(stmt: tirx.Stmt, max_step: int, lanes: int, vector_width: int) -> tuple[int, bool, int]:
    """(stores counted for unrolling, whether a rolled loop is inside, native operations) of ``stmt``."""
    if isinstance(stmt, tirx.BufferStore):
        return 1, False, -(-lanes // vector_width) * _operations(stmt.value)
    if isinstance(stmt, tirx.Evaluate):
        return 1, False, 1
    if isinstance(stmt, tirx.For):
        extent = _constant(stmt.extent)
        if _UNROLL_STEP_KEY in stmt.annotations:
            max_step = int(stmt.annotations[_UNROLL_STEP_KEY])
        if stmt.kind == tirx.ForKind.VECTORIZED and extent is not None:
            return _unroll(stmt.body, max_step, lanes * extent, vector_width)  # one wide statement, no loop left
        steps, rolled_inside, ops = _unroll(stmt.body, max_step, lanes, vector_width)
        if extent is not None and (
            stmt.kind == tirx.ForKind.UNROLLED
            or (stmt.kind == tirx.ForKind.SERIAL and not rolled_inside and extent * steps <= max_step)
        ):
            return steps * extent, False, ops * extent  # unrolled
        return steps, True, ops
    steps, rolled_inside, ops = 0, False, 0
    for child in child_stmts(stmt):
        child_steps, child_rolled, child_ops = _unroll(child, max_step, lanes, vector_width)
        steps, rolled_inside, ops = steps + child_steps, rolled_inside or child_rolled, ops + child_ops
    return steps, rolled_inside, ops


def _operations(value: tirx.Expr) -> int:
    """Instructions that compute a stored value: its floating-point arithmetic, select, cast and call nodes, two to one.

    A multiply and an add fuse into one instruction, so a matmul's ``C + A * B``
    counts one (also with its padding's ``if_then_else``), where a polynomial
    of ``rewrite-vector-math`` counts dozens. Integer index arithmetic and
    conditions are left out: unrolling makes most of them constants.
    """
    nodes = 0

    def count(expr: tirx.Expr) -> tirx.Expr:
        nonlocal nodes
        dtype = getattr(expr.ty, "dtype", None)  # None: a pointer (an intrinsic's operand address)
        nodes += not isinstance(expr, (tirx.Let, TensorLoad)) and dtype is not None and dtype.is_float
        return expr

    map_bottom_up(value, count)
    return max(1, nodes // 2)


@dataclass(frozen=True)
class VerifyUnrollSize:
    """Reject a program whose unrolled code would be big: slow to build, and never the fastest.

    Unrolling multiplies the code of the loops it covers, and LLVM's time
    grows faster than the code. Among measured programs of several workloads,
    those estimated above the limit took several times as long to build as
    the rest, and none was the fastest of its workload: every best program
    stayed well under it (code that big does not fit the instruction cache;
    bench/results/NOTES.md). A store counts the operations of
    its value, so an unrolled polynomial weighs what it builds like.
    The limit holds for each loop nest, which runs on its own: a function
    of several steps (a few recurrent steps, each a product and its gates)
    may have as many nests as fast as one step's, up to
    ``max_function_ops`` in all, a size that still builds in seconds
    (bench/results/NOTES.md).
    """

    name: str = "verify-unroll-size"
    max_vector_ops: int = 1024
    max_function_ops: int = 16 * 1024

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        width = vector_width(ctx.target)
        sizes = [estimate_unrolled_size(nest, width) for nest in loop_nests(sch.mod["main"].body)]
        if max(sizes, default=0) > self.max_vector_ops:
            return f"a loop nest of about {max(sizes)} vector operations once unrolled, more than {self.max_vector_ops}"
        if sum(sizes) > self.max_function_ops:
            return f"about {sum(sizes)} vector operations once unrolled, more than {self.max_function_ops}"
        return None


def loop_nests(stmt: tirx.Stmt) -> list[tirx.For]:
    """The outermost loops under ``stmt``: each one code of its own, run before the next."""
    if isinstance(stmt, tirx.For):
        return [stmt]
    return [nest for child in child_stmts(stmt) for nest in loop_nests(child)]


def block_executions(stmt: tirx.Stmt, times: int = 1) -> int:
    """How many times the blocks under ``stmt`` run, all together (a loop of unknown extent counted once)."""
    if isinstance(stmt, tirx.For):
        times *= _constant(stmt.extent) or 1
    own = times if isinstance(stmt, s_tir.SBlockRealize) and stmt.block.name_hint != "root" else 0
    return own + sum(block_executions(child, times) for child in child_stmts(stmt))


@functools.lru_cache(maxsize=256)
def _workload_executions(body: tirx.Stmt) -> int:
    """:func:`block_executions` of a workload's own program, counted once for all of its candidates."""
    return block_executions(body)


@dataclass(frozen=True)
class VerifyNoRecompute:
    """Reject a program whose blocks run many times more often than the workload's: one computed inside a loop
    its values do not depend on, redone on every iteration.

    A compute location inside a consumer's loop over elements that all read
    the same producer values (a softmax's exponentials and their sum under
    the loop over the row's outputs) is valid, and redoes the producer's work
    once per element: the softmax then costs its row's width times over. A
    reduction factored out, a write-back through a cache or a tile's copy
    adds at most a few runs of each block to the workload's own.
    """

    name: str = "verify-no-recompute"
    max_ratio: int = 8

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        own = _workload_executions(ctx.workload.mod["main"].body)
        runs = block_executions(sch.mod["main"].body)
        if own and runs > self.max_ratio * own:
            return f"its blocks run {runs} times, {runs / own:.0f}x the workload's {own}: a block is recomputed"
        return None
