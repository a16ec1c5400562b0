"""The vector-math rewrite: tanh, erf, sigmoid, exp2 and the logarithms as arithmetic that vectorizes, accurate and NaN-keeping."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import tvm
from tvm import s_tir, te, tirx

from conftest import context_of, run_module
from probtune import Rng, generate_space
from probtune.measure.codegen import compile_for
from probtune.search.search_strategy import RandomSearch
from probtune.workloads.workload import Workload
from probtune_cpu.vector_math import RewriteVectorMath

_FUNCTIONS = {
    "tanh": (te.tanh, np.tanh),
    "erf": (te.erf, np.vectorize(math.erf, otypes=[np.float64])),
    "sigmoid": (te.sigmoid, lambda x: 1.0 / (1.0 + np.exp(-x))),
    "exp2": (lambda x: tirx.exp2(x), np.exp2),
    "log": (te.log, np.log),
    "log2": (lambda x: tirx.log2(x), np.log2),
    "log10": (lambda x: tirx.log10(x), np.log10),
}
_LOGS = ("log", "log2", "log10")
# largest errors measured on the inputs below (float32 spacing of the result where it is above 1e-3 in size,
# else absolute), with a margin of about 2x: what a change to the approximations must keep
_MAX_ULP = {"tanh": 8, "erf": 8, "sigmoid": 4, "exp2": 2, "log": 2, "log2": 3, "log10": 2}
_INPUTS = np.concatenate([np.linspace(-12, 12, 96_000), [0.0, -0.0, 1e-30, -1e-30, 50.0, -50.0, 1e4, -1e4]]).astype(np.float32)


def _function(name: str, n: int) -> tvm.tirx.PrimFunc:
    x = te.placeholder((n,), "float32", name="x")
    y = te.compute((n,), lambda i: _FUNCTIONS[name][0](x[i]), name="y")
    return te.create_prim_func([x, y])


def _rewritten_vectorized(name: str, n: int, target) -> tuple[s_tir.Schedule, object]:
    sch = s_tir.Schedule(_function(name, n))
    assert RewriteVectorMath().check(sch, context_of(sch, target)) is None
    _, inner = sch.split(sch.get_loops(sch.get_sblock("y"))[0], [None, 16])
    sch.vectorize(inner)
    return sch, tvm.compile(sch.mod, target=tvm.target.Target(target.tvm_target))


@pytest.mark.parametrize("name", sorted(_FUNCTIONS))
def test_results_are_close_and_nan_stays_nan(host, name):
    inputs = np.concatenate([_INPUTS, np.full(-len(_INPUTS) % 16 + 16, np.nan, np.float32)])
    _, lib = _rewritten_vectorized(name, len(inputs), host)
    got = run_module(lib, [inputs, np.zeros_like(inputs)])[1]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        want = _FUNCTIONS[name][1](inputs.astype(np.float64))
    nan = np.isnan(inputs)
    assert np.isnan(got[nan]).all()
    finite = ~nan & np.isfinite(want) & (np.abs(want) < 3e38)
    unit = np.maximum(np.spacing(np.abs(want[finite]).astype(np.float32)).astype(np.float64), np.spacing(np.float32(1e-3)))
    errors = np.abs(got[finite] - want[finite]) / unit
    assert errors.max() <= _MAX_ULP[name], (name, errors.max(), inputs[finite][errors.argmax()])


@pytest.mark.parametrize("name", sorted(_FUNCTIONS))
def test_no_libm_call_is_left(host, name):
    sch, lib = _rewritten_vectorized(name, 1024, host)
    assert f"T.{name}(" not in sch.mod.script()
    assembly = lib.mod.inspect_source("s")
    assert not re.findall(r"call\w*\s+\*?\w*(?:expf|tanhf|erff|exp2f|logf|log2f|log10f)", assembly)


@pytest.mark.parametrize("name", _LOGS)
def test_logarithms_are_close_over_the_whole_float32_range(host, name):
    subnormals = np.array([1e-45, 3e-42, 1e-39, 1.1754942e-38], np.float32)
    inputs = np.concatenate([subnormals, np.geomspace(1.2e-38, 3.4e38, 200_000), np.linspace(0.5, 2.0, 100_000)])
    inputs = np.concatenate([inputs, np.ones(-len(inputs) % 16)]).astype(np.float32)
    _, lib = _rewritten_vectorized(name, len(inputs), host)
    got = run_module(lib, [inputs, np.zeros_like(inputs)])[1]
    want = _FUNCTIONS[name][1](inputs.astype(np.float64))
    unit = np.maximum(np.spacing(np.abs(want).astype(np.float32)).astype(np.float64), np.spacing(np.float32(1e-3)))
    errors = np.abs(got - want) / unit
    assert errors.max() <= _MAX_ULP[name], (name, errors.max(), inputs[errors.argmax()])


@pytest.mark.parametrize("name", _LOGS)
def test_logarithms_of_special_values(host, name):
    inputs = np.array([0.0, -0.0, -1.0, -np.inf, np.inf, np.nan, 1.0, 2.0, 1024.0, 2.0**-140] + [1.0] * 6, np.float32)
    _, lib = _rewritten_vectorized(name, len(inputs), host)
    got = run_module(lib, [inputs, np.zeros_like(inputs)])[1]
    assert got[0] == got[1] == -np.inf
    assert np.isnan(got[2:4]).all() and np.isnan(got[5])
    assert got[4] == np.inf and got[6] == 0.0
    if name == "log2":
        assert got[7] == 1.0 and got[8] == 10.0 and got[9] == -140.0  # exact at powers of two


def test_a_dense_gelu_is_tuned_with_it_and_stays_correct(host):
    a = te.placeholder((16, 32), "float32", name="a")
    w = te.placeholder((32, 64), "float32", name="w")
    k = te.reduce_axis((0, 32), name="k")
    dense = te.compute((16, 64), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k), name="dense")
    gelu = te.compute((16, 64), lambda i, j: 0.5 * dense[i, j] * (1.0 + te.erf(dense[i, j] * 0.7071067811865476)), name="gelu")
    workload = Workload.from_module(te.create_prim_func([a, w, gelu]), name="dense_gelu")
    space = generate_space(workload, host)
    assert "rewrite-vector-math" in [v.name for v in space.validators]
    inputs = workload.random_inputs(0)
    want = workload.reference_outputs(inputs)[0]  # the unscheduled program, with libm's erf
    for candidate in RandomSearch(space, Rng(3)).next_batch(3):
        assert "T.erf(" not in candidate.mod.script()
        lib = compile_for(candidate.mod, host)
        got = run_module(lib, [*inputs, np.zeros((16, 64), "float32")])[2]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_gelu_rounded_to_bfloat16_is_rewritten_and_vectorized(host):
    """A bf16 model's GELU stores its result rounded to bfloat16, which TVM's legalization reads twice: the
    rewritten float is bound to a variable first, so that the copy vectorizes."""
    x = te.placeholder((16, 64), "float32", name="x")
    gelu = te.compute((16, 64), lambda i, j: (0.5 * x[i, j] * (1.0 + te.erf(x[i, j] * 0.7071067811865476))).astype(
        "bfloat16"), name="gelu")
    workload = Workload.from_module(te.create_prim_func([x, gelu]), name="gelu_bf16")
    inputs = workload.random_inputs(0)
    want = workload.reference_outputs(inputs)[0].astype(np.float32)
    for candidate in RandomSearch(generate_space(workload, host), Rng(3)).next_batch(3):
        assert "T.erf(" not in candidate.mod.script()
        lib = compile_for(candidate.mod, host)
        got = run_module(lib, [*inputs, np.zeros((16, 64), want.dtype).astype(workload.param_specs()[1][1])])[1]
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=2**-8, atol=1e-6)  # a bfloat16 step


def test_a_function_of_a_rewritten_function_keeps_its_library_call(host):
    """Mish, ``x * tanh(log(1 + exp(x)))``: TVM's lowering substitutes nested Let bindings into their uses, and three
    nested polynomials made LLVM's build far too slow; the outermost keeps its call, and the program stays correct."""
    from conftest import assert_samples_correct

    x = te.placeholder((1024,), "float32", name="x")
    y = te.compute(x.shape, lambda i: x[i] * te.tanh(te.log(1.0 + te.exp(x[i]))), name="mish")
    workload = Workload.from_module(te.create_prim_func([x, y]))
    sch = s_tir.Schedule(workload.mod)
    assert RewriteVectorMath().check(sch, context_of(sch, host)) is None
    script = sch.mod.script()
    assert "T.tanh(" in script and "T.log(" not in script  # the log (its argument a call) became a polynomial
    assert_samples_correct(workload, generate_space(workload, host), host, samples=2)


def _power(exponent: float, n: int, inner=lambda v: v, outer=lambda v: v) -> tvm.tirx.PrimFunc:
    x = te.placeholder((n,), "float32", name="x")
    y = te.compute((n,), lambda i: outer(tirx.pow(inner(x[i]), tirx.const(exponent, "float32"))), name="y")
    return te.create_prim_func([x, y])


def _rewritten_power(host, func: tvm.tirx.PrimFunc) -> tuple[str, object]:
    sch = s_tir.Schedule(func)
    assert RewriteVectorMath().check(sch, context_of(sch, host)) is None
    _, inner = sch.split(sch.get_loops(sch.get_sblock("y"))[0], [None, 16])
    sch.vectorize(inner)
    return sch.mod.script(), tvm.compile(sch.mod, target=tvm.target.Target(host.tvm_target))


@pytest.mark.parametrize("exponent", [1, 2, 3, 4])
def test_a_small_integer_power_is_products_of_its_base(host, exponent):
    inputs = np.concatenate([np.linspace(-30, 30, 4000), [0.0, -0.0, 1e-20, 1e20, -1e20, np.inf, -np.inf, np.nan]])
    inputs = np.concatenate([inputs, np.ones(-len(inputs) % 16)]).astype(np.float32)
    script, lib = _rewritten_power(host, _power(float(exponent), len(inputs)))
    assert "T.pow(" not in script
    assert not re.findall(r"call\w*\s+\*?\w*powf", lib.mod.inspect_source("s"))
    got = run_module(lib, [inputs, np.zeros_like(inputs)])[1]
    with np.errstate(over="ignore", invalid="ignore"):
        want = np.float32(1) * inputs
        for _ in range(exponent - 1):
            want = want * inputs  # numpy's float32 products, left to right
    np.testing.assert_array_equal(got, want)  # overflow to inf, signs of zeros and NaN included
    finite = np.isfinite(want) & (np.abs(want) > 1e-30)
    np.testing.assert_allclose(got[finite], np.power(inputs[finite].astype(np.float64), exponent), rtol=4e-7)


@pytest.mark.parametrize("exponent", [0.5, 2.5, 5.0, -1.0, 0.0])
def test_other_powers_keep_the_library_call(host, exponent):
    script, _ = _rewritten_power(host, _power(exponent, 64))
    assert "T.pow(" in script


def test_the_tanh_of_a_cube_rewrites_both(host):
    """GELU's tanh form, ``tanh(c * (x + 0.044715 * x**3))``: the cube's products leave the tanh's argument free of
    Let bindings, so the tanh becomes a polynomial too."""
    n = 4096
    inputs = np.linspace(-6, 6, n).astype(np.float32)
    func = _power(3.0, n, outer=lambda cube: te.tanh(0.7978845608 * cube))
    script, lib = _rewritten_power(host, func)
    assert "T.pow(" not in script and "T.tanh(" not in script
    got = run_module(lib, [inputs, np.zeros_like(inputs)])[1]
    np.testing.assert_allclose(got, np.tanh(0.7978845608 * inputs.astype(np.float64) ** 3), atol=2e-6)
