"""Compute float32 ``exp`` with a polynomial that vectorizes, instead of a libm call per element.

TVM lowers ``exp`` to LLVM's ``llvm.exp`` intrinsic, which the x86 and
AArch64 back ends turn into one scalar ``expf`` call per element, even in a
vectorized loop: softmax then spends most of its time in those calls.
Vendor libraries (MLAS, oneDNN) use the same kind of
approximation.

The approximation is Cephes' ``expf``: ``exp(x) = 2^n * exp(r)`` with ``n =
round(x / ln 2)`` and ``|r| <= ln(2) / 2``, ``exp(r)`` a degree-7 polynomial,
``2^n`` built from the exponent bits. It is within 2 ulp of the exact result
wherever that is a normal float32, and rounds to the subnormal result, 0 or
+inf beyond; NaN stays NaN. float64 ``exp`` is left to libm.

On AVX-512 targets the scaling by ``2^n`` is LLVM's ``ldexp`` intrinsic,
one ``vscalefps`` instead of two sets of exponent bits and two multiplies
(elsewhere LLVM makes ``ldexp`` a libm call). Both round once: the results
are the same bits, and the single instruction is the faster form.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx

from probtune.plugin import SpaceContext
from probtune_cpu.llvm_features import llvm_target_has
from probtune_cpu.stored_values import map_bottom_up, rewrite_stored_values, workload_stores_any

__all__ = ["CallRewrite", "RewriteExpPolynomial", "polynomial_exp", "rewrite_calls"]

_EXP = tvm.ir.Op.get("tirx.exp")
_LOG2E = 1.44269504088896341
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4  # ln 2 in two parts, so that x - n*ln2 stays exact
_COEFFICIENTS = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
_LOWEST = -104.0  # below, exp underflows float32 even as a subnormal: clamping changes nothing
_HIGHEST = 88.8  # above ln(FLT_MAX) = 88.72: exp overflows to +inf at the clamp too


def polynomial_exp(x: tirx.Expr, scale_with_ldexp: bool = False) -> tirx.Expr:
    """``exp(x)`` for a float32 ``x`` (scalar or vector) out of arithmetic that LLVM vectorizes.

    ``scale_with_ldexp`` multiplies by ``2^n`` with LLVM's ``ldexp`` intrinsic: only for
    targets where that is an instruction (AVX-512's ``vscalefps``).
    """
    dtype = str(x.ty)
    int_dtype = dtype.replace("float", "int")

    def c(value: float) -> tirx.Expr:
        return tirx.const(value, dtype)

    def power_of_two(k: tirx.Expr) -> tirx.Expr:  # 2^k from the exponent bits, for -126 <= k <= 127
        return tirx.reinterpret(dtype, (k + tirx.const(127, int_dtype)) << tirx.const(23, int_dtype))

    arg, clamped, n, r = (tirx.Var(name, dtype) for name in ("exp_arg", "exp_clamped", "exp_n", "exp_r"))
    half_n = tirx.Var("exp_half_n", int_dtype)
    p = c(_COEFFICIENTS[0])
    for coefficient in _COEFFICIENTS[1:]:
        p = p * r + c(coefficient)
    exp_r = p * r * r + r + c(1.0)
    if scale_with_ldexp:
        body = tirx.call_llvm_pure_intrin(dtype, "llvm.ldexp", exp_r, tirx.Cast(int_dtype, n))
    else:
        # 2^n as 2^(n/2) * 2^(n - n/2): either factor is a normal number for any n in [-150, 128], and the
        # product rounds to the subnormal or infinite result
        value = exp_r * power_of_two(half_n) * power_of_two(tirx.Cast(int_dtype, n) - half_n)
        body = tirx.Let(half_n, tirx.Cast(int_dtype, n) >> tirx.const(1, int_dtype), value)
    body = tirx.Let(r, clamped - n * c(_LN2_HI) - n * c(_LN2_LO), body)
    body = tirx.Let(n, tirx.floor(clamped * c(_LOG2E) + c(0.5)), body)
    # clamped as selects that keep a NaN (its comparisons are false), not min/max, which LLVM lowers to
    # vmaxps/vminps that drop it; NaN then flows through the arithmetic, so no isnan test is needed
    # (testing it as well made the whole exp twice as slow)
    low = tirx.Var("exp_low", dtype)
    clamp = tirx.Let(low, tirx.Select(arg < c(_LOWEST), c(_LOWEST), arg), tirx.Select(low > c(_HIGHEST), c(_HIGHEST), low))
    body = tirx.Let(clamped, clamp, body)
    return tirx.Let(arg, x, body)


@dataclass(frozen=True)
class RewriteExpPolynomial:
    """Replace float32 ``exp`` in every block's stored value by ``polynomial_exp``."""

    name: str = "rewrite-exp-polynomial"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        rewrite_calls(sch, ctx, _exp_rewrite, _is_float32_exp)
        return None


CallRewrite = Callable[[tirx.Expr, bool], tirx.Expr]
"""Arithmetic for a call, given its argument and whether ``2^n`` may be scaled with ``ldexp``."""


def rewrite_calls(
    sch: s_tir.Schedule, ctx: SpaceContext, rewrite_of: Callable[[tirx.Expr], CallRewrite | None],
    is_rewritable: Callable[[tirx.Expr], bool],
) -> None:
    """Replace every call that ``rewrite_of`` gives a rewrite for, in every block's stored value.

    ``is_rewritable`` (a module-level function: it is a cache key) first asks
    the unscheduled workload whether there is any such call. A call whose
    argument is already a rewritten one (Mish's ``tanh(log(1 + exp(x)))``)
    keeps its library call: TVM's lowering substitutes nested ``Let``
    bindings into their uses, and three nested polynomials grew into a
    program too large for LLVM to build in the builder's time limit.
    """
    if not workload_stores_any(ctx.workload.mod, is_rewritable):
        return
    scale_with_ldexp = llvm_target_has(ctx.target.tvm_target, "avx512f")

    def replace(expr: tirx.Expr) -> tirx.Expr:
        rewrite = rewrite_of(expr)
        if rewrite is None or _holds_let(expr.args[0]):  # see the function's docstring
            return expr
        return rewrite(expr.args[0], scale_with_ldexp)

    rewrite_stored_values(sch, lambda store: map_bottom_up(store.value, replace))


def _holds_let(expr: tirx.Expr) -> bool:
    """Whether ``expr`` binds a ``Let`` anywhere inside (a rewritten call's polynomial)."""
    found = False

    def visit(node: tirx.Expr) -> tirx.Expr:
        nonlocal found
        found = found or isinstance(node, tirx.Let)
        return node

    map_bottom_up(expr, visit)
    return found


def _is_float32_exp(expr: tirx.Expr) -> bool:
    return isinstance(expr, tvm.ir.expr.Call) and expr.op.same_as(_EXP) and str(expr.ty) == "float32"


def _exp_rewrite(expr: tirx.Expr) -> CallRewrite | None:
    return polynomial_exp if _is_float32_exp(expr) else None
