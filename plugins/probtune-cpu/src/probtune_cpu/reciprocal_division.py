"""Divide many numbers by the same divisor with one reciprocal and a multiply each, not a division each.

Softmax ends with ``exp[i, j] / sum[i]``: a whole vector of dividends shares
one divisor. A vector division is slow (AVX-512 ``vdivps`` on Intel cores:
about 10 cycles per 16 lanes against half a cycle for a multiply), so vendor
kernels (MLAS, PyTorch) multiply by ``1 / sum`` instead, and so does this
rewrite: ``a * r`` with ``r = 1 / b`` computed once per divisor.

Contract (float32): within 1.5 ulp of ``a / b`` wherever the quotient is a
normal number (two roundings, against one), subnormal quotients within
2^-149; zero, infinite and NaN dividends give the division's result, and a
quotient within 1.5 ulp of the largest float may round to infinity.
Divisors whose reciprocal is not a normal number (0, subnormal, ``|b| >=
2^126``, infinity, NaN) take the division, through a branch on the divisor
that LLVM hoists out of the loop over the dividends.

The two roundings are accepted for speed: on the best program of a softmax
tune this form ran faster than a correctly rounded quotient (Markstein's FMA
correction of ``a * r``, this rewrite's form before), and that faster than
the division (bench/results/NOTES.md).

Never applied where the stored value rounds to an integer (a quantization:
one ulp of ``x / scale`` flips a half-way rounding, as ONNX's
DynamicQuantizeLinear case shows). Otherwise applied to a float32 division
in a block's stored value whose divisor does not depend on the store's last index (the loop that is vectorized), also
through the variables of ``Let`` bindings (the polynomials of
``rewrite-vector-math`` bind them): a divisor that varies along the vector
would make the branch's condition a vector, and TVM then computes the whole
stored value one lane at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx

from probtune.plugin import SpaceContext, identity, variable_ids
from probtune_cpu.stored_values import map_bottom_up, rewrite_stored_values, workload_stores_any

__all__ = ["RewriteInvariantDivision", "reciprocal_quotient"]

# 1/b is a normal float32 for biased exponents 1..252 of b (2^-126 <= |b| < 2^126)
_LOWEST_BIASED_EXPONENT, _HIGHEST_BIASED_EXPONENT = 1, 252


def reciprocal_quotient(dividend: tirx.Expr, divisor: tirx.Expr) -> tirx.Expr:
    """``dividend / divisor`` for float32 scalars, as ``dividend * (1 / divisor)`` (see the module docstring)."""
    a, b = tirx.Var("div_a", "float32"), tirx.Var("div_b", "float32")
    biased = tirx.Var("div_biased_exponent", "int32")
    reciprocal_is_normal = tirx.And(
        biased >= tirx.const(_LOWEST_BIASED_EXPONENT, "int32"), biased <= tirx.const(_HIGHEST_BIASED_EXPONENT, "int32")
    )
    body = tirx.if_then_else(reciprocal_is_normal, a * (tirx.const(1.0, "float32") / b), a / b)
    exponent = (tirx.reinterpret("int32", b) >> tirx.const(23, "int32")) & tirx.const(255, "int32")
    return tirx.Let(a, dividend, tirx.Let(b, divisor, tirx.Let(biased, exponent, body)))


@dataclass(frozen=True)
class RewriteInvariantDivision:
    """Replace float32 divisions by a divisor shared along the store's last index with ``reciprocal_quotient``."""

    name: str = "rewrite-invariant-division"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        if workload_stores_any(ctx.workload.mod, _is_float32_division):
            rewrite_stored_values(sch, self._rewrite)
        return None

    @staticmethod
    def _rewrite(store: tirx.BufferStore) -> tirx.Expr:
        lane_vars = variable_ids(store.indices[-1]) if store.indices else set()
        if not lane_vars or _rounds_to_integers(store.value):  # nothing to share, or an ulp would change the result
            return store.value
        lane_vars = _with_dependent_lets(store.value, lane_vars)

        def replace(expr: tirx.Expr) -> tirx.Expr:
            if _is_float32_division(expr) and not lane_vars & variable_ids(expr.b):
                return reciprocal_quotient(expr.a, expr.b)
            return expr

        return map_bottom_up(store.value, replace)


_ROUNDING = frozenset({"tirx.round", "tirx.nearbyint", "tirx.floor", "tirx.ceil", "tirx.trunc"})


def _rounds_to_integers(value: tirx.Expr) -> bool:
    """Whether ``value`` rounds a float32 quotient to an integer (a quantization): one ulp flips a half-way case."""
    found = False

    def visit(expr: tirx.Expr) -> tirx.Expr:
        nonlocal found
        rounding = (isinstance(expr, tirx.Cast) and "int" in str(expr.ty) and "float" in str(expr.value.ty)) or (
            isinstance(expr, tvm.ir.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in _ROUNDING)
        found = found or (rounding and _contains(expr, _is_float32_division))
        return expr

    map_bottom_up(value, visit)
    return found


def _contains(value: tirx.Expr, wanted: Callable[[tirx.Expr], bool]) -> bool:
    hit = False

    def visit(expr: tirx.Expr) -> tirx.Expr:
        nonlocal hit
        hit = hit or wanted(expr)
        return expr

    map_bottom_up(value, visit)
    return hit


def _with_dependent_lets(value: tirx.Expr, lane_vars: set[int]) -> set[int]:
    """``lane_vars`` and the variables of the ``Let`` bindings in ``value`` whose value depends on them, at any depth."""
    lets: list[tirx.Let] = []

    def collect(expr: tirx.Expr) -> tirx.Expr:
        if isinstance(expr, tirx.Let):
            lets.append(expr)
        return expr

    map_bottom_up(value, collect)
    dependent = set(lane_vars)
    grew = True
    while grew:
        grew = False
        for let in lets:
            if identity(let.var) not in dependent and variable_ids(let.value) & dependent:
                dependent.add(identity(let.var))
                grew = True
    return dependent


def _is_float32_division(expr: tirx.Expr) -> bool:
    return isinstance(expr, tirx.Div) and str(expr.ty) == "float32"
