"""The lowering step of programs with AMX tile products: the tiles' configuration, and Linux's permission to use them.

A thread must load a tile configuration (``LDTILECFG``: each tile's rows and
bytes per row) before its first tile instruction, and Linux lets a process
use the tiles once it has asked (``arch_prctl(ARCH_REQ_XCOMP_PERM)``), else
the first one faults. :func:`configure_tiles` (a CPU target's
``LLVMCompiler.lowering``) loads the configuration around each statement
that uses tiles, inside each parallel task (TVM's thread pool runs tasks on
threads of its own), and asks for the permission once per call of the
kernel, so that a compiled model runs in any process that loads it. Each
such statement first stores the thread's own configuration and loads it
again after: a library that configured the thread's tiles once
(onnxruntime's int8 products) goes on using them, and with another
configuration left loaded its next tile instruction would fault. Every tile
is 64 bytes wide; ``A``'s and ``C``'s have the rows the intrinsics mark
(``TILE_ROWS_KEY``), ``B``'s 16. The tile layout rewrite
(:class:`probtune_x86.amx.RewriteAMXLayout`) keeps a program to one count of
rows.
"""

from __future__ import annotations

import functools
from typing import Any

import tvm
from tvm import tirx

from probtune.plugin import iter_stmts
from probtune_x86.amx import BF16_TILE, INT8_TILE, TILE_ROWS, TILE_ROWS_KEY

__all__ = ["configure_tiles"]

_TILE_CALLS = ("llvm.x86.tileloadd64", INT8_TILE.llvm_name, BF16_TILE.llvm_name, "llvm.x86.tilestored64")
_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_ARCH_PRCTL = 0x1023, 18, 158  # Linux x86-64's
_B_TILES = (6, 7)  # the registers of B's tiles, which always have 16 rows of 4 terms' groups


def _config_words(rows: int) -> tuple[int, ...]:
    """LDTILECFG's 64 bytes as eight words: palette 1, each of the 8 tiles 64 bytes wide, ``A``'s and ``C``'s
    ``rows`` high and ``B``'s 16 (a byte per tile at byte 48)."""
    heights = sum((TILE_ROWS if tile in _B_TILES else rows) << (8 * tile) for tile in range(8))
    return (1, 0, 0x0040_0040_0040_0040, 0x0040_0040_0040_0040, 0, 0, heights, 0)


def _tile_call(name: str, *args: Any) -> tirx.Stmt:
    return tirx.Evaluate(tirx.call_llvm_intrin("void", name, *args))


def _is_tile_call(stmt: tirx.Stmt) -> bool:
    """Whether ``stmt`` evaluates one of the tile product's LLVM intrinsics."""
    if not isinstance(stmt, tirx.Evaluate) or not isinstance(stmt.value, tvm.ir.expr.Call) or not stmt.value.args:
        return False
    first = stmt.value.args[0]
    return isinstance(first, tirx.IntImm) and int(first) in _tile_intrinsic_ids()


@functools.cache
def _tile_intrinsic_ids() -> frozenset[int]:
    from tvm.target import codegen

    return frozenset(int(codegen.llvm_lookup_intrinsic_id(name)) for name in _TILE_CALLS)


def _uses_tiles(stmt: tirx.Stmt) -> bool:
    return any(_is_tile_call(s) for s in iter_stmts(stmt))


def _with_tiles(rows: int, body: tirx.Stmt) -> list[tirx.Stmt]:
    """``body`` run with the tile configuration for tiles of ``rows`` loaded (LDTILECFG, from a 64-byte buffer on the
    stack), and the thread's own configuration stored before (STTILECFG) and loaded again after: another library
    (onnxruntime's int8 products) may have configured this thread's tiles and go on using them unconfigured."""
    words = _config_words(rows)
    config = tirx.decl_buffer((len(words),), "uint64", name="tile_config")
    saved = tirx.decl_buffer((len(words),), "uint64", name="saved_tile_config")
    stores = [tirx.BufferStore(config, tirx.IntImm("uint64", word), [tirx.IntImm("int32", n)])
              for n, word in enumerate(words)]
    return [
        tirx.AllocBuffer(config), tirx.AllocBuffer(saved), *stores,
        _tile_call("llvm.x86.sttilecfg", tirx.address_of(saved[0])),
        _tile_call("llvm.x86.ldtilecfg", tirx.address_of(config[0])),
        body,
        # a thread whose tiles were not configured stored zeros (palette 0): loading them releases its tiles
        _tile_call("llvm.x86.ldtilecfg", tirx.address_of(saved[0])),
    ]


def _marked_rows(stmt: tirx.Stmt) -> set[int]:
    """The tile rows the intrinsics in ``stmt`` mark."""
    return {int(s.value) for s in iter_stmts(stmt) if isinstance(s, tirx.AttrStmt) and s.attr_key == TILE_ROWS_KEY}


def _parallel_uses_tiles(stmt: tirx.Stmt) -> bool:
    return any(isinstance(s, tirx.For) and s.kind == tirx.ForKind.PARALLEL and _uses_tiles(s.body) for s in iter_stmts(stmt))


def _returns(stmt: tirx.Stmt) -> bool:
    return any(isinstance(s, tirx.Return) for s in iter_stmts(stmt))


def _configured(stmt: tirx.Stmt, rows: int) -> tirx.Stmt:
    """``stmt`` with its tiles' configuration (:func:`_with_tiles`) around each parallel loop's body that uses them
    (each task's thread has tile registers of its own), and around each other outermost statement using them outside
    such loops; the function's return, which follows them, stays last. A tile's values live within one intrinsic's
    statements, inside one such statement."""
    if not _uses_tiles(stmt):
        return stmt
    if isinstance(stmt, tirx.For) and stmt.kind == tirx.ForKind.PARALLEL:
        body: tirx.Stmt = tirx.SeqStmt(_with_tiles(rows, stmt.body))
    elif not (_returns(stmt) or _parallel_uses_tiles(stmt)):
        return tirx.SeqStmt(_with_tiles(rows, stmt))
    elif isinstance(stmt, tirx.SeqStmt):
        return tirx.SeqStmt([_configured(s, rows) for s in stmt.seq], stmt.span)
    elif isinstance(stmt, tirx.LetStmt):
        return tirx.LetStmt(stmt.var, stmt.value, _configured(stmt.body, rows), stmt.span)
    elif isinstance(stmt, tirx.AttrStmt):
        return tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, _configured(stmt.body, rows), stmt.span)
    elif isinstance(stmt, tirx.IfThenElse):
        otherwise = None if stmt.else_case is None else _configured(stmt.else_case, rows)
        return tirx.IfThenElse(stmt.condition, _configured(stmt.then_case, rows), otherwise, stmt.span)
    elif isinstance(stmt, tirx.For):
        body = _configured(stmt.body, rows)
    else:
        return tirx.SeqStmt(_with_tiles(rows, stmt))
    return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding, stmt.annotations,
                    stmt.step, stmt.span)


def configure_tiles(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """A lowering step for programs with tile products: Linux's permission to use the tiles asked at the kernel's
    start, and the tile configuration loaded around the statements using them (in each parallel task, on its thread),
    the thread's own configuration put back after each."""
    if not _uses_tiles(func.body):
        return func
    rows = _marked_rows(func.body)
    if len(rows) != 1:
        raise ValueError(f"the tile products of a program must mark one count of rows ({TILE_ROWS_KEY}), not {sorted(rows)}")
    permission = tirx.Evaluate(tirx.call_extern(
        "int64", "syscall", *(tirx.IntImm("int64", v) for v in (_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA))))
    (height,) = rows
    return func.with_body(tirx.SeqStmt([permission, _configured(func.body, height)]))


