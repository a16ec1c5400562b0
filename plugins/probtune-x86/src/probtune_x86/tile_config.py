"""The lowering step of programs with AMX tile products: the tiles' configuration, and Linux's permission to use them.

A thread must load a tile configuration (``LDTILECFG``: each tile's rows and
bytes per row) before its first tile instruction, and Linux lets a process
use the tiles once it has asked (``arch_prctl(ARCH_REQ_XCOMP_PERM)``), else
the first one faults. :func:`configure_tiles` (a CPU target's
``LLVMCompiler.lowering``) loads one configuration at the start of each
parallel task that uses tiles (TVM's thread pool runs tasks on threads of its
own), and asks for the permission once per call of the kernel, so that a
compiled model runs in any process that loads it. Every tile is 64 bytes wide;
``A``'s and ``C``'s have the rows the intrinsics mark (``TILE_ROWS_KEY``),
``B``'s 16. The tile layout rewrite (:class:`probtune_x86.amx.RewriteAMXLayout`)
keeps a program to one count of rows.
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


def _tile_configuration(rows: int) -> list[tirx.Stmt]:
    """Statements loading the tile configuration (LDTILECFG) for tiles of ``rows`` from a 64-byte buffer on the stack."""
    words = _config_words(rows)
    config = tirx.decl_buffer((len(words),), "uint64", name="tile_config")
    stores = [tirx.BufferStore(config, tirx.IntImm("uint64", word), [tirx.IntImm("int32", n)])
              for n, word in enumerate(words)]
    load = _tile_call("llvm.x86.ldtilecfg", tirx.address_of(config[0]))
    return [tirx.AllocBuffer(config), *stores, load]


def _marked_rows(stmt: tirx.Stmt) -> set[int]:
    """The tile rows the intrinsics in ``stmt`` mark."""
    return {int(s.value) for s in iter_stmts(stmt) if isinstance(s, tirx.AttrStmt) and s.attr_key == TILE_ROWS_KEY}


def _configured(stmt: tirx.Stmt, rows: int) -> tirx.Stmt | None:
    """``stmt`` with the tile configuration loaded at the start of each parallel loop's body that uses tiles (each
    task's thread has tile registers of its own), or None where no parallel loop uses them."""
    if isinstance(stmt, tirx.For):
        if stmt.kind == tirx.ForKind.PARALLEL and _uses_tiles(stmt.body):
            body: tirx.Stmt | None = tirx.SeqStmt([*_tile_configuration(rows), stmt.body])
        else:
            body = _configured(stmt.body, rows)
        if body is None:
            return None
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding,
                        stmt.annotations, stmt.step, stmt.span)
    if isinstance(stmt, tirx.SeqStmt):
        rewritten = [_configured(s, rows) for s in stmt.seq]
        if all(r is None for r in rewritten):
            return None
        return tirx.SeqStmt([r if r is not None else s for r, s in zip(rewritten, stmt.seq)], stmt.span)
    if isinstance(stmt, tirx.AttrStmt):
        body = _configured(stmt.body, rows)
        return None if body is None else tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, body, stmt.span)
    return None


def configure_tiles(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """A lowering step for programs with tile products: Linux's permission to use the tiles asked at the kernel's
    start, and the tile configuration loaded there (for the calling thread) and in each parallel task using them."""
    if not _uses_tiles(func.body):
        return func
    rows = _marked_rows(func.body)
    if len(rows) != 1:
        raise ValueError(f"the tile products of a program must mark one count of rows ({TILE_ROWS_KEY}), not {sorted(rows)}")
    permission = tirx.Evaluate(tirx.call_extern(
        "int64", "syscall", *(tirx.IntImm("int64", v) for v in (_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA))))
    (height,) = rows
    body = _configured(func.body, height) or func.body
    return func.with_body(tirx.SeqStmt([permission, *_tile_configuration(height), body]))


