"""The invariant-division rewrite: within 1.5 ulp of the division, exact where promised, applied only where a divisor is shared."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import s_tir, te

from conftest import context_of, run_module, softmax_samples_with
from probtune import SpaceContext
from probtune.targets import resolve_target
from probtune.workloads.catalog import BUILTIN_WORKLOADS
from probtune_cpu.reciprocal_division import RewriteInvariantDivision, _is_float32_division
from probtune_cpu.stored_values import workload_stores_any

_TINY = float(np.finfo(np.float32).tiny)
_SPECIAL_DIVISORS = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -3e-39, 2.0**126, -3e38, 2.0**-126, 1.0, -1.0]
_SPECIAL_DIVIDENDS = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-40, 3e38, -3.4e38, 1.0]
_REWRITTEN = "div_biased_exponent"  # a variable of the rewritten quotient


def _rows_over_vector(rows: int, cols: int) -> tvm.tirx.PrimFunc:
    a = te.placeholder((rows, cols), "float32", name="a")
    b = te.placeholder((rows,), "float32", name="b")
    q = te.compute((rows, cols), lambda i, j: a[i, j] / b[i], name="q")
    return te.create_prim_func([a, b, q])


def _rewritten(func: tvm.tirx.PrimFunc, target) -> s_tir.Schedule:
    sch = s_tir.Schedule(func)
    assert RewriteInvariantDivision().check(sch, context_of(sch, target)) is None
    return sch


def _inputs(rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    # a quarter of the dividends and of the divisors span float32's whole range, the rest moderate numbers
    a = rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-60, 60, (rows, cols)))
    a[:, : cols // 4] = rng.standard_normal((rows, cols // 4)) * np.exp2(rng.integers(-149, 128, (rows, cols // 4)))
    b = rng.standard_normal(rows) * np.exp2(rng.integers(-60, 60, rows))
    b[: rows // 4] = rng.standard_normal(rows // 4) * np.exp2(rng.integers(-140, 128, rows // 4))
    b[: len(_SPECIAL_DIVISORS)] = _SPECIAL_DIVISORS
    a[:, : len(_SPECIAL_DIVIDENDS)] = _SPECIAL_DIVIDENDS
    with np.errstate(over="ignore"):
        return a.astype(np.float32), b.astype(np.float32)


@pytest.mark.parametrize("lanes", [1, 16])
def test_quotients_are_within_the_promised_distance_of_the_divisions(host, lanes):
    rows, cols = 256, 512
    sch = _rewritten(_rows_over_vector(rows, cols), host)
    assert _REWRITTEN in sch.mod.script()
    _, inner = sch.split(sch.get_loops(sch.get_sblock("q"))[1], [None, lanes])
    if lanes > 1:
        sch.vectorize(inner)
    lib = tvm.compile(sch.mod, target=tvm.target.Target(host.tvm_target))
    a, b = _inputs(rows, cols)
    (got,) = run_module(lib, [a, b, np.zeros_like(a)])[2:]
    with np.errstate(all="ignore"):
        want = a / b[:, None]
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    # bit for bit: every special divisor (the division's branch), and zero, infinite and NaN dividends
    exact = np.zeros_like(same)
    exact[: len(_SPECIAL_DIVISORS)] = True
    exact |= ~np.isfinite(a) | (a == 0)
    assert same[exact].all(), (a[exact & ~same][:4], np.broadcast_to(b[:, None], a.shape)[exact & ~same][:4])
    with np.errstate(all="ignore"):
        normal = ~exact & (np.abs(want) >= _TINY) & (np.abs(want) < 3.4e38)
    assert normal.mean() > 0.7 and (~same[normal]).sum() > 1000  # two roundings: often not the division's bits
    exact_quotient = a[normal].astype(np.float64) / np.broadcast_to(b[:, None], a.shape)[normal]
    spacing = np.spacing(np.abs(want[normal])).astype(np.float64)
    assert (np.abs(got[normal] - exact_quotient) <= 1.5 * spacing).all()
    subnormal = ~exact & (np.abs(want) < _TINY)
    assert subnormal.sum() > 100
    assert (np.abs(got[subnormal].astype(np.float64) - want[subnormal]) <= 2.0**-149).all()


def test_only_divisors_shared_along_the_last_index_are_rewritten(host):
    shared = _rewritten(_rows_over_vector(4, 32), host)
    assert _REWRITTEN in shared.mod.script()
    a = te.placeholder((4, 32), "float32", name="a")
    b = te.placeholder((4, 32), "float32", name="b")
    elementwise = te.create_prim_func([a, b, te.compute((4, 32), lambda i, j: a[i, j] / b[i, j], name="q")])
    column = te.create_prim_func([a, b, te.compute((4, 32), lambda i, j: a[i, j] / b[i, 0], name="q")])
    c = te.placeholder((4, 32), "float64", name="c")
    d = te.placeholder((4,), "float64", name="d")
    double = te.create_prim_func([c, d, te.compute((4, 32), lambda i, j: c[i, j] / d[i], name="q")])
    for func in (elementwise, double):
        sch = s_tir.Schedule(func)
        before = sch.mod
        assert RewriteInvariantDivision().check(sch, context_of(sch, host)) is None
        assert sch.mod.same_as(before)
    assert _REWRITTEN in _rewritten(column, host).mod.script()


def test_a_divisor_bound_by_a_let_to_a_value_along_the_vector_is_kept(host):
    """erf's rational polynomial P(x) / Q(x), Q bound by Lets: a branch on it would compute the lanes one by one."""
    a = te.placeholder((4, 32), "float32", name="a")
    b = te.placeholder((4,), "float32", name="b")
    x, x2 = tvm.tirx.Var("x", "float32"), tvm.tirx.Var("x2", "float32")

    def rational(i, j):
        return tvm.tirx.Let(x, a[i, j], tvm.tirx.Let(x2, x * x, x / (x2 + 1.0) + x / b[i]))

    sch = _rewritten(te.create_prim_func([a, b, te.compute((4, 32), rational, name="q")]), host)
    script = sch.mod.script()
    assert script.count("T.if_then_else") == 1  # x / b[i] only
    assert "x / (x2 + T.float32(1.0))" in script
    lib = tvm.compile(sch.mod, target=tvm.target.Target(host.tvm_target))
    rng = np.random.default_rng(0)
    u, v = rng.uniform(-3, 3, (4, 32)).astype("float32"), rng.uniform(0.5, 2, 4).astype("float32")
    (got,) = run_module(lib, [u, v, np.zeros_like(u)])[2:]
    np.testing.assert_allclose(got, u / (u * u + 1) + u / v[:, None], rtol=1e-6, atol=1e-6)


def test_rewrite_walks_no_program_of_a_workload_without_a_float_division(host):
    """Scheduling makes no new arithmetic: the workload is asked once, and a program is not walked."""
    catalog = {spec.name: spec for spec in BUILTIN_WORKLOADS}
    softmax = catalog["softmax"].instantiate((4, 16))
    conv2d = catalog["conv2d_nchw"].instantiate((1, 4, 6, 6, 4, 3, 3, 1, 1))
    assert workload_stores_any(softmax.mod, _is_float32_division)
    assert not workload_stores_any(conv2d.mod, _is_float32_division)
    sch = s_tir.Schedule(_rows_over_vector(4, 32))
    before = sch.mod
    assert RewriteInvariantDivision().check(sch, SpaceContext(workload=conv2d, target=host)) is None
    assert sch.mod.same_as(before)


def test_every_cpu_target_gets_the_reciprocal():
    assert _REWRITTEN in _rewritten(_rows_over_vector(4, 32), resolve_target("llvm")).mod.script()


def test_softmax_uses_the_reciprocal_and_stays_correct(host):
    for candidate in softmax_samples_with("rewrite-invariant-division", host):
        assert _REWRITTEN in candidate.mod.script()


def test_a_division_inside_a_call_is_rewritten_and_stays_correct(host):
    """GELU's erf(x / s): the rewrite rebuilds the call around the new quotient (it once failed on TVM 0.27's Call)."""
    rows, cols = 8, 64
    a = te.placeholder((rows, cols), "float32", name="a")
    b = te.placeholder((rows,), "float32", name="b")
    q = te.compute((rows, cols), lambda i, j: te.erf(a[i, j] / b[i]), name="q")
    sch = _rewritten(te.create_prim_func([a, b, q]), host)
    assert _REWRITTEN in sch.mod.script()
    lib = tvm.compile(sch.mod, target=tvm.target.Target(host.tvm_target))
    rng = np.random.default_rng(0)
    x, s = rng.uniform(-3, 3, (rows, cols)).astype("float32"), rng.uniform(0.5, 2, rows).astype("float32")
    (got,) = run_module(lib, [x, s, np.zeros_like(x)])[2:]
    from math import erf

    want = np.vectorize(erf)((x / s[:, None]).astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_quotient_rounded_to_an_integer_keeps_its_division(host):
    """DynamicQuantizeLinear's ``round(x / scale)``: x = -2.5 at scale 5/255 is -127.49999 divided, -127.5 multiplied
    by the reciprocal, and rounds one step off; a quotient that a store rounds is left a division."""
    x = te.placeholder((2, 8), "float32", name="x")
    scale = te.placeholder((2,), "float32", name="scale")
    q = te.compute(x.shape, lambda i, j: te.round(x[i, j] / scale[i]).astype("int32"), name="q")
    sch = _rewritten(te.create_prim_func([x, scale, q]), host)
    assert _REWRITTEN not in sch.mod.script()
    lib = tvm.compile(sch.mod, target=tvm.target.Target(host.tvm_target))
    values = np.full((2, 8), -2.5, np.float32)
    scales = np.full(2, np.float32(5.0) / np.float32(255.0), np.float32)
    (got,) = run_module(lib, [values, scales, np.zeros((2, 8), np.int32)])[2:]
    np.testing.assert_array_equal(got, np.rint(values / scales[:, None]).astype(np.int32))
