"""The vector-math rewrite: tanh, erf, sigmoid and exp2 as arithmetic that vectorizes, accurate and NaN-keeping."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import tvm
from tvm import s_tir, te, tirx

from probtune import Rng, generate_space
from probtune.codegen import compile_program
from probtune.search import RandomSearch
from probtune.workload import Workload
from probtune_cpu.vector_math import RewriteVectorMath

from conftest import context_of, run_module

_FUNCTIONS = {
    "tanh": (te.tanh, np.tanh),
    "erf": (te.erf, np.vectorize(math.erf, otypes=[np.float64])),
    "sigmoid": (te.sigmoid, lambda x: 1.0 / (1.0 + np.exp(-x))),
    "exp2": (lambda x: tirx.exp2(x), np.exp2),
}
# largest errors measured on the inputs below (float32 spacing of the result where it is above 1e-3 in size,
# else absolute), with a margin of about 2x: what a change to the approximations must keep
_MAX_ULP = {"tanh": 8, "erf": 8, "sigmoid": 4, "exp2": 2}
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
    with np.errstate(over="ignore"):
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
    assert not re.findall(r"call\w*\s+\*?\w*(?:expf|tanhf|erff|exp2f)", assembly)


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
        lib = compile_program(candidate.mod, host.tvm_target, stack_buffer_bytes=host.stack_buffer_bytes)
        got = run_module(lib, [*inputs, np.zeros((16, 64), "float32")])[2]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
