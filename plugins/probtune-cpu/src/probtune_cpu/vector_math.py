"""Compute float32 ``tanh``, ``erf``, ``sigmoid``, ``exp2``, the logarithms and small integer powers with arithmetic
that vectorizes.

TVM lowers these to one scalar libm call per element even in a vectorized
loop (``erff``; ``expf`` inside ``tanh`` and ``sigmoid``; ``exp2f``,
``logf``; ``powf`` for ``x ** 3``): GELU, SiLU and tanh-GELU epilogues,
RMS norms' squares and log-softmax then run at scalar speed. A power by a
constant 1 to 4 becomes products of its base. As vendor libraries
do, ``tanh`` and ``erf`` become Eigen's rational approximations
(odd polynomial over even polynomial, on an input clamped where the result
is +-1 in float32), and ``sigmoid`` and ``exp2`` are written with
:func:`~probtune_cpu.polynomial_exp.polynomial_exp`; ``log``, ``log2`` and
``log10`` are in :mod:`probtune_cpu.polynomial_log`. Clamps are selects,
which keep a NaN (its comparisons are false), so NaN stays NaN. The
accuracy each is held to is in tests/test_cpu_vector_math.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx

from probtune.plugin import MAX_PRODUCT_POWER, SpaceContext
from probtune_cpu.polynomial_exp import CallRewrite, polynomial_exp, rewrite_calls
from probtune_cpu.polynomial_log import polynomial_log, polynomial_log2, polynomial_log10

__all__ = ["RewriteVectorMath", "polynomial_erf", "polynomial_exp2", "polynomial_sigmoid", "polynomial_tanh"]

# Eigen's generic_fast_tanh_float: numerator odd (x^1 .. x^13), denominator even (x^0 .. x^6)
_TANH_CLAMP = 9.0  # tanh rounds to +-1 in float32 beyond
_TANH_P = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
           1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03)
_TANH_Q = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)
# Eigen's generic_fast_erf_float: numerator odd (x^1 .. x^13), denominator even (x^0 .. x^8)
_ERF_CLAMP = 4.0  # erf rounds to +-1 in float32 beyond
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
          -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
          -1.42647390514189e-02)
_LN2 = 0.6931471805599453
_POW = tvm.ir.Op.get("tirx.pow")


def _horner(z: tirx.Expr, coefficients: tuple[float, ...], dtype: str) -> tirx.Expr:
    value = tirx.const(coefficients[0], dtype)
    for coefficient in coefficients[1:]:
        value = value * z + tirx.const(coefficient, dtype)
    return value


def _rational_odd(x: tirx.Expr, clamp: float, numerator: tuple[float, ...], denominator: tuple[float, ...]) -> tirx.Expr:
    """``x' * P(x'^2) / Q(x'^2)`` with ``x'`` the input clamped to [-clamp, clamp] (NaN kept)."""
    dtype = str(x.ty)
    arg, low, clamped, square = (tirx.Var(name, dtype) for name in ("odd_arg", "odd_low", "odd_x", "odd_x2"))
    limit = tirx.const(clamp, dtype)
    body = clamped * _horner(square, numerator, dtype) / _horner(square, denominator, dtype)
    body = tirx.Let(square, clamped * clamped, body)
    body = tirx.Let(clamped, tirx.Select(low > limit, limit, low), body)
    body = tirx.Let(low, tirx.Select(arg < -limit, -limit, arg), body)
    return tirx.Let(arg, x, body)


def polynomial_tanh(x: tirx.Expr, scale_with_ldexp: bool = False) -> tirx.Expr:
    """``tanh(x)`` for float32 ``x``: Eigen's rational approximation."""
    return _rational_odd(x, _TANH_CLAMP, _TANH_P, _TANH_Q)


def polynomial_erf(x: tirx.Expr, scale_with_ldexp: bool = False) -> tirx.Expr:
    """``erf(x)`` for float32 ``x``: Eigen's rational approximation."""
    return _rational_odd(x, _ERF_CLAMP, _ERF_P, _ERF_Q)


def polynomial_sigmoid(x: tirx.Expr, scale_with_ldexp: bool = False) -> tirx.Expr:
    """``1 / (1 + exp(-x))`` with the polynomial ``exp`` (``exp(-x)`` overflowing to inf gives 0, as it should)."""
    dtype = str(x.ty)
    one = tirx.const(1.0, dtype)
    return one / (one + polynomial_exp(-x, scale_with_ldexp))


def polynomial_exp2(x: tirx.Expr, scale_with_ldexp: bool = False) -> tirx.Expr:
    """``2^n * exp(f ln 2)`` with ``n = round(x)`` and ``f = x - n`` (exact), so that the error does not grow with ``x``.

    ``2^n`` is two factors of exponent bits, each a normal number over the
    clamped range: the product rounds to the subnormal or infinite result.
    """
    dtype = str(x.ty)
    int_dtype = dtype.replace("float", "int")

    def power_of_two(k: tirx.Expr) -> tirx.Expr:  # for -126 <= k <= 127
        return tirx.reinterpret(dtype, (k + tirx.const(127, int_dtype)) << tirx.const(23, int_dtype))

    arg, low, clamped, n = (tirx.Var(name, dtype) for name in ("exp2_arg", "exp2_low", "exp2_x", "exp2_n"))
    whole, half = tirx.Var("exp2_whole", int_dtype), tirx.Var("exp2_half", int_dtype)
    fraction = polynomial_exp((clamped - n) * tirx.const(_LN2, dtype), scale_with_ldexp)
    body = tirx.Let(half, whole >> tirx.const(1, int_dtype), fraction * power_of_two(half) * power_of_two(whole - half))
    body = tirx.Let(whole, tirx.Cast(int_dtype, n), body)
    body = tirx.Let(n, tirx.floor(clamped + tirx.const(0.5, dtype)), body)
    body = tirx.Let(clamped, tirx.Select(low > tirx.const(129.0, dtype), tirx.const(129.0, dtype), low), body)
    body = tirx.Let(low, tirx.Select(arg < tirx.const(-151.0, dtype), tirx.const(-151.0, dtype), arg), body)
    return tirx.Let(arg, x, body)


def _integer_power(exponent: int) -> CallRewrite:
    """``x ** exponent`` as a product of ``x`` (left to right, as numpy's float32 ``x * x * x``)."""

    def power(x: tirx.Expr, scale_with_ldexp: bool = False) -> tirx.Expr:
        product = x
        for _ in range(exponent - 1):
            product = product * x
        return product

    return power


def _constant_integer_exponent(expr: tirx.Expr) -> int | None:
    """The exponent of ``pow(x, c)`` when ``c`` is a float constant equal to an integer from 1 to
    :data:`MAX_PRODUCT_POWER`."""
    exponent = expr.args[1]
    if not isinstance(exponent, tirx.FloatImm) or not float(exponent.value).is_integer():
        return None
    return int(exponent.value) if 1 <= exponent.value <= MAX_PRODUCT_POWER else None


_REWRITES: dict[str, CallRewrite] = {
    "tirx.tanh": polynomial_tanh,
    "tirx.erf": polynomial_erf,
    "tirx.sigmoid": polynomial_sigmoid,
    "tirx.exp2": polynomial_exp2,
    "tirx.log": polynomial_log,
    "prim.log2": polynomial_log2,  # TVM 0.27 registers log2 under this name
    "tirx.log10": polynomial_log10,
}
_OPS = {tvm.ir.Op.get(name): rewrite for name, rewrite in _REWRITES.items()}


@dataclass(frozen=True)
class RewriteVectorMath:
    """Replace float32 ``tanh``, ``erf``, ``sigmoid``, ``exp2``, ``log``, ``log2``, ``log10`` and ``pow`` by a
    constant 1 to 4 in stored values by arithmetic."""

    name: str = "rewrite-vector-math"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        rewrite_calls(sch, ctx, _rewrite_of, _is_rewritable)
        return None


def _rewrite_of(expr: tirx.Expr) -> CallRewrite | None:
    if not isinstance(expr, tvm.ir.expr.Call) or str(expr.ty) != "float32":
        return None
    if expr.op.same_as(_POW):
        exponent = _constant_integer_exponent(expr)
        return None if exponent is None else _integer_power(exponent)
    return next((rewrite for op, rewrite in _OPS.items() if expr.op.same_as(op)), None)


def _is_rewritable(expr: tirx.Expr) -> bool:
    return _rewrite_of(expr) is not None
