"""The lowering step of programs with AMX tile products: the tiles' configuration, and Linux's permission to use them.

A thread must load a tile configuration (``LDTILECFG``: each tile's rows and
bytes per row) before its first tile instruction, and Linux lets a process
use the tiles once it has asked (``arch_prctl(ARCH_REQ_XCOMP_PERM)``), else
the first one faults. :func:`configure_tiles` (a CPU target's
``LLVMCompiler.lowering``) loads one configuration, every tile 16 rows of 64
bytes, at the start of each parallel task that uses tiles (TVM's thread
pool runs tasks on threads of its own), and asks for the permission once per
call of the kernel, so that a compiled model runs in any process that loads it.
"""

from __future__ import annotations

import functools
from typing import Any

import tvm
from tvm import tirx

from probtune.plugin import iter_stmts
from probtune_x86.amx import BF16_TILE, INT8_TILE

__all__ = ["configure_tiles"]

_TILE_CALLS = ("llvm.x86.tileloadd64", INT8_TILE.llvm_name, BF16_TILE.llvm_name, "llvm.x86.tilestored64")
_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_ARCH_PRCTL = 0x1023, 18, 158  # Linux x86-64's
_CONFIG_WORDS = (1, 0, 0x0040_0040_0040_0040, 0x0040_0040_0040_0040, 0, 0, 0x1010_1010_1010_1010, 0)
"""LDTILECFG's 64 bytes as eight words: palette 1, each of the 8 tiles 64 bytes wide and 16 rows high."""


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


def _tile_configuration() -> list[tirx.Stmt]:
    """Statements loading the tile configuration (LDTILECFG) from a 64-byte buffer on the stack."""
    config = tirx.decl_buffer((len(_CONFIG_WORDS),), "uint64", name="tile_config")
    stores = [tirx.BufferStore(config, tirx.IntImm("uint64", word), [tirx.IntImm("int32", n)])
              for n, word in enumerate(_CONFIG_WORDS)]
    load = _tile_call("llvm.x86.ldtilecfg", tirx.address_of(config[0]))
    return [tirx.AllocBuffer(config), *stores, load]


def _configured(stmt: tirx.Stmt) -> tirx.Stmt | None:
    """``stmt`` with the tile configuration loaded at the start of each parallel loop's body that uses tiles (each
    task's thread has tile registers of its own), or None where no parallel loop uses them."""
    if isinstance(stmt, tirx.For):
        if stmt.kind == tirx.ForKind.PARALLEL and _uses_tiles(stmt.body):
            body: tirx.Stmt | None = tirx.SeqStmt([*_tile_configuration(), stmt.body])
        else:
            body = _configured(stmt.body)
        if body is None:
            return None
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding,
                        stmt.annotations, stmt.step, stmt.span)
    if isinstance(stmt, tirx.SeqStmt):
        rewritten = [_configured(s) for s in stmt.seq]
        if all(r is None for r in rewritten):
            return None
        return tirx.SeqStmt([r if r is not None else s for r, s in zip(rewritten, stmt.seq)], stmt.span)
    if isinstance(stmt, tirx.AttrStmt):
        body = _configured(stmt.body)
        return None if body is None else tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, body, stmt.span)
    return None


def configure_tiles(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """A lowering step for programs with tile products: Linux's permission to use the tiles asked at the kernel's
    start, and the tile configuration loaded there (for the calling thread) and in each parallel task using them."""
    if not _uses_tiles(func.body):
        return func
    permission = tirx.Evaluate(tirx.call_extern(
        "int64", "syscall", *(tirx.IntImm("int64", v) for v in (_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA))))
    body = _configured(func.body) or func.body
    return func.with_body(tirx.SeqStmt([permission, *_tile_configuration(), body]))


