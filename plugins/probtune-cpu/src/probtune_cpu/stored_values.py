"""Rewrite the value each block stores, node by node: what the arithmetic rewrites share."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import tvm
from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

from probtune.plugin import iter_stmts, sblock_names

__all__ = ["map_bottom_up", "replace_block", "rewrite_stored_values", "workload_stores_any"]

_BINARY = (
    tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Mod, tirx.FloorDiv, tirx.FloorMod, tirx.Min, tirx.Max,
    tirx.EQ, tirx.NE, tirx.LT, tirx.LE, tirx.GT, tirx.GE, tirx.And, tirx.Or,
)


def map_bottom_up(expr: tirx.Expr, replace: Callable[[tirx.Expr], tirx.Expr]) -> tirx.Expr:
    """``expr`` with ``replace`` applied to every arithmetic, cast, select, call, let and load node, children first.

    ``replace`` returns its argument to keep a node; nodes whose children are
    unchanged are returned as they are, so callers can test ``same_as``.
    Variables, constants and other nodes are returned as they are.
    """
    if isinstance(expr, _BINARY):
        a, b = map_bottom_up(expr.a, replace), map_bottom_up(expr.b, replace)
        return replace(expr if a.same_as(expr.a) and b.same_as(expr.b) else type(expr)(a, b))
    if isinstance(expr, tirx.Cast):
        value = map_bottom_up(expr.value, replace)
        return replace(expr if value.same_as(expr.value) else tirx.Cast(str(expr.ty), value))
    if isinstance(expr, tirx.Select):
        old = (expr.condition, expr.true_value, expr.false_value)
        new = [map_bottom_up(part, replace) for part in old]
        return replace(expr if all(n.same_as(o) for n, o in zip(new, old)) else tirx.Select(*new))
    if isinstance(expr, tvm.ir.expr.Call):
        args = [map_bottom_up(arg, replace) for arg in expr.args]
        unchanged = all(n.same_as(o) for n, o in zip(args, expr.args))
        return replace(expr if unchanged else tvm.ir.expr.Call(expr.op, args, ret_ty=expr.ty))
    if isinstance(expr, tirx.Let):
        value, body = map_bottom_up(expr.value, replace), map_bottom_up(expr.body, replace)
        return replace(expr if value.same_as(expr.value) and body.same_as(expr.body) else tirx.Let(expr.var, value, body))
    if isinstance(expr, TensorLoad):
        indices = [map_bottom_up(index, replace) for index in expr.indices]
        unchanged = all(n.same_as(o) for n, o in zip(indices, expr.indices))
        return replace(expr if unchanged else tirx.BufferLoad(expr.source, indices))
    return expr


def rewrite_stored_values(sch: s_tir.Schedule, rewrite: Callable[[tirx.BufferStore], tirx.Expr]) -> None:
    """Replace the stored value of every block whose body is one store by ``rewrite(store)``."""
    for name in sblock_names(sch):
        block_rv = sch.get_sblock(name)
        store = _one_store(sch.get(block_rv).body)
        if store is None:
            continue
        value = rewrite(store)
        if value.same_as(store.value):
            continue
        replace_block(sch, block_rv, body=_stored(store, value))


def _one_store(body: tirx.Stmt) -> tirx.BufferStore | None:
    """The block's one store, as it was before :func:`_stored` bound a bfloat16 store's float to a variable."""
    if isinstance(body, tirx.BufferStore):
        return body
    if isinstance(body, tirx.SeqStmt) and len(body.seq) == 2:
        bind, store = body.seq
        if isinstance(bind, tirx.Bind) and isinstance(store, tirx.BufferStore) and isinstance(store.value, tirx.Cast):
            if store.value.value.same_as(bind.var):
                return tirx.BufferStore(store.buffer, tirx.Cast(str(store.value.ty), bind.value), store.indices)
    return None


def _stored(store: tirx.BufferStore, value: tirx.Expr) -> tirx.Stmt:
    """``store`` of ``value``; a value rounded to bfloat16 has its float bound to a variable first.

    TVM's bfloat16 legalization reads the float it rounds twice, so it would
    copy a rewritten value's let-bindings into one expression, which
    vectorization refuses; bound in a statement of its own, the float is read as a variable.
    """
    if isinstance(value, tirx.Cast) and str(value.ty) == "bfloat16" and not isinstance(value.value, tirx.Var):
        unrounded = tirx.Var("unrounded", value.value.ty)
        rounded = tirx.BufferStore(store.buffer, tirx.Cast("bfloat16", unrounded), store.indices)
        return tirx.SeqStmt([tirx.Bind(unrounded, value.value), rounded])
    return tirx.BufferStore(store.buffer, value, store.indices)


@functools.lru_cache(maxsize=32)
def workload_stores_any(mod: tvm.IRModule, test: Callable[[tirx.Expr], bool]) -> bool:
    """Whether a value that the unscheduled ``mod`` stores has a node for which ``test`` holds.

    Schedule primitives move, copy and split stores but make no new arithmetic,
    so a rewrite of some node kind (``exp``, a float division) has nothing to do
    in any program of a workload without one; asking once per workload spares
    the walk over every candidate's stores (about a tenth of the time it takes
    to realize one; bench/results/NOTES.md). ``test`` is a module-level
    function, so that it is a key.
    A validator that made such nodes itself would have to run after the
    rewrites that ask this (the CPU targets' validators make none before them).
    """
    found = False

    def visit(expr: tirx.Expr) -> tirx.Expr:
        nonlocal found
        found = found or test(expr)
        return expr

    for stmt in iter_stmts(mod["main"].body):
        if isinstance(stmt, tirx.BufferStore):
            map_bottom_up(stmt.value, visit)
    return found


def replace_block(sch: s_tir.Schedule, block_rv: s_tir.schedule.SBlockRV, **changes: Any) -> None:
    """Put a copy of the block with ``changes`` (``body``, ``init``, ``reads``, ``writes``, ``alloc_buffers``) in its place."""
    block = sch.get(block_rv)
    fields = {
        "reads": block.reads, "writes": block.writes, "body": block.body, "init": block.init,
        "alloc_buffers": block.alloc_buffers, **changes,
    }
    new_block = s_tir.SBlock(
        block.iter_vars, fields["reads"], fields["writes"], block.name_hint, fields["body"], fields["init"],
        fields["alloc_buffers"], block.match_buffers, block.annotations,
    )
    sch.state.replace(sch.get_sref(block_rv), new_block, {block: new_block})
