"""The x86 columns of a cost model's features: how many dot-product instructions a scheduled program executes.

Registered as the feature extractor ``x86`` (``probtune_register_feature_extractors``):
a cost model appends these columns to its own, as ``x86.<column>``. The
generic features describe a tensorized block by its stores only (one store
of 16 lanes per instruction), not by the 64 products it computes, so a
cost model could not tell a VNNI program from a plain integer one; the
columns say:

``vnni_calls``: the ``vpdpbusd`` instructions the program executes, each
times the loop iterations around it (zero for a program without one);
``bf16_calls``: the same of ``vdpbf16ps`` (:mod:`probtune_x86.bf16`);
``amx_calls``: the same of AMX's tile products (:mod:`probtune_x86.amx`), ``tdpbusd`` or ``tdpbf16ps``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import tirx

from probtune.plugin import child_stmts
from probtune_x86.amx import BF16_TILE, INT8_TILE
from probtune_x86.bf16 import BF16_CALL
from probtune_x86.vnni import VNNI_LLVM_NAME

__all__ = ["X86_FEATURE_NAMES", "X86Features", "x86_features"]

X86_FEATURE_NAMES: tuple[str, ...] = ("vnni_calls", "bf16_calls", "amx_calls")

_OPERANDS = ("uint8", "int8", "bfloat16")  # the instructions' operand types: a program without one runs neither


@functools.cache
def _tile_product_ids() -> frozenset[int]:
    return frozenset(_intrinsic_id(tile.llvm_name) for tile in (INT8_TILE, BF16_TILE))


@functools.cache
def _intrinsic_id(name: str) -> int:
    from tvm.target.codegen import llvm_lookup_intrinsic_id

    return int(llvm_lookup_intrinsic_id(name))


@dataclass(frozen=True)
class X86Features:
    """The feature extractor ``x86``: :data:`X86_FEATURE_NAMES` of a scheduled program. A dataclass, so that it pickles."""

    name: str = "x86"
    columns: tuple[str, ...] = X86_FEATURE_NAMES

    def extract(self, func: tirx.PrimFunc) -> np.ndarray:
        return x86_features(func)


def _column(value: tirx.PrimExpr) -> int | None:
    """The column of the instruction ``value`` calls, if it calls one."""
    if not isinstance(value, tvm.ir.Call):
        return None
    op = str(getattr(value.op, "name", ""))
    first = value.args[0] if value.args else None
    if op == "tirx.call_llvm_pure_intrin" and isinstance(first, tirx.IntImm) and int(first) == _intrinsic_id(VNNI_LLVM_NAME):
        return 0
    if op == "tirx.call_extern" and str(getattr(first, "value", "")) == BF16_CALL:
        return 1
    if op == "tirx.call_llvm_intrin" and isinstance(first, tirx.IntImm) and int(first) in _tile_product_ids():
        return 2
    return None


def x86_features(func: tirx.PrimFunc) -> np.ndarray:
    """The raw ``X86_FEATURE_NAMES`` quantities of a scheduled program; zeros, without a walk, for one that takes
    no 8-bit or bfloat16 tensor (every float32 program the search featurizes)."""
    raw = np.zeros(len(X86_FEATURE_NAMES), dtype=np.float64)
    if not any(str(getattr(p.ty, "dtype", "")) in _OPERANDS for p in func.params):
        return raw
    stack: list[tuple[tirx.Stmt, float]] = [(func.body, 1.0)]
    while stack:
        node, iterations = stack.pop()
        if isinstance(node, tirx.For):
            extent = int(node.extent.value) if isinstance(node.extent, tirx.IntImm) else 1
            stack.append((node.body, iterations * extent))
            continue
        column = _column(node.value) if isinstance(node, (tirx.BufferStore, tirx.Evaluate)) else None
        if column is not None:
            raw[column] += iterations
        stack.extend((child, iterations) for child in child_stmts(node))
    return raw
