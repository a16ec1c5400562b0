"""Compute float32 ``log``, ``log2`` and ``log10`` with arithmetic that vectorizes, instead of a libm call per element.

The approximation is Cephes' ``logf``: ``x = 2^e * (1 + m)`` with ``1 + m``
in [sqrt(1/2), sqrt(2)), read from the exponent and mantissa bits (a
subnormal ``x`` is first scaled by 2^23), and ``log(1 + m)`` a degree-9
polynomial; ``e`` times ``ln 2`` (or ``log10 2``, or 1 for ``log2``) is added
last, from constants split in two so that the large part is exact, as Cephes'
``log2f`` and ``log10f`` do; ``log2`` of a power of two is exact. Special values
are selects: ``log(0) = -inf``, ``log(inf) = inf``, NaN for a negative
input or a NaN. The accuracy each is held to is in tests/test_cpu_vector_math.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tvm import tirx

__all__ = ["polynomial_log", "polynomial_log2", "polynomial_log10"]

_SQRT_HALF = 0.707106781186547524
_P = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
      -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4  # ln 2 in two parts: e * _LN2_HI is exact
_LOG2E_MINUS_1 = 0.44269504088896340736  # log2(e) - 1: log2 adds the unscaled terms once more
_LOG10E_HI, _LOG10E_LO = 4.3359375e-1, 7.00731903251827651129e-4  # log10(e) in two parts
_LOG10_2_HI, _LOG10_2_LO = 3.0078125e-1, 2.48745663981195213739e-4  # log10(2) in two parts
_SMALLEST_NORMAL = 1.17549435e-38
_SIGN_AND_MANTISSA = 0x807FFFFF - (1 << 32)  # the bit mask as a signed int32
_SUBNORMAL_SCALE = 8388608.0  # 2^23: makes any positive subnormal a normal number

Combine = Callable[[tirx.Expr, tirx.Expr, tirx.Expr, Callable[[float], tirx.Expr]], tirx.Expr]


def polynomial_log(x: tirx.Expr, scale_with_ldexp: bool = False) -> tirx.Expr:
    """``log(x)`` for float32 ``x``."""
    return _log_family(x, lambda e, m, y, c: (y + e * c(_LN2_LO) + m) + e * c(_LN2_HI))


def polynomial_log2(x: tirx.Expr, scale_with_ldexp: bool = False) -> tirx.Expr:
    """``log2(x)`` for float32 ``x``: exact at powers of two."""
    return _log_family(x, lambda e, m, y, c: y * c(_LOG2E_MINUS_1) + m * c(_LOG2E_MINUS_1) + y + m + e)


def polynomial_log10(x: tirx.Expr, scale_with_ldexp: bool = False) -> tirx.Expr:
    """``log10(x)`` for float32 ``x``."""
    return _log_family(x, lambda e, m, y, c: (y * c(_LOG10E_LO) + m * c(_LOG10E_LO) + e * c(_LOG10_2_LO)
                                             + y * c(_LOG10E_HI) + m * c(_LOG10E_HI) + e * c(_LOG10_2_HI)))


def _log_family(x: tirx.Expr, combine: Combine) -> tirx.Expr:
    """``combine(e, m, y, const)`` for ``x = 2^e (1 + m)`` and ``log(1 + m) = m + y``, with a logarithm's special values."""
    dtype = str(x.ty)
    int_dtype = dtype.replace("float", "int")

    def c(value: float) -> tirx.Expr:
        return tirx.const(value, dtype)

    def i(value: int) -> tirx.Expr:
        return tirx.const(value, int_dtype)

    arg, scaled, bits, frac, m, e, z = (tirx.Var(f"log_{n}", t) for n, t in (
        ("arg", dtype), ("scaled", dtype), ("bits", int_dtype), ("frac", dtype), ("m", dtype), ("e", dtype),
        ("z", dtype)))
    poly = c(_P[0])
    for coefficient in _P[1:]:
        poly = poly * m + c(coefficient)
    value = combine(e, m, m * z * poly - c(0.5) * z, c)
    special = tirx.Select(arg == c(0.0), c(-math.inf), c(math.nan))
    body = tirx.Select(arg == c(math.inf), c(math.inf), tirx.Select(arg > c(0.0), value, special))
    body = tirx.Let(z, m * m, body)
    below = frac < c(_SQRT_HALF)  # fold [1/2, sqrt(1/2)) up, so that 1 + m is within [sqrt(1/2), sqrt(2))
    exponent = tirx.Cast(dtype, ((bits >> i(23)) & i(0xFF)) - i(126)) - tirx.Select(
        arg < c(_SMALLEST_NORMAL), c(23.0), c(0.0))
    body = tirx.Let(e, tirx.Select(below, exponent - c(1.0), exponent), tirx.Let(
        m, tirx.Select(below, frac + frac - c(1.0), frac - c(1.0)), body))
    # the mantissa with the exponent of 1/2: a number in [1/2, 1)
    body = tirx.Let(frac, tirx.reinterpret(dtype, (bits & i(_SIGN_AND_MANTISSA)) | i(0x3F000000)), body)
    body = tirx.Let(bits, tirx.reinterpret(int_dtype, scaled), body)
    body = tirx.Let(scaled, tirx.Select(arg < c(_SMALLEST_NORMAL), arg * c(_SUBNORMAL_SCALE), arg), body)
    return tirx.Let(arg, x, body)
