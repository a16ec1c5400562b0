"""The polynomial exp rewrite: accurate over float32's whole range, vectorized, and applied where it should be."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import s_tir, te

from conftest import context_of, run_module, softmax_samples_with
from probtune import SpaceContext
from probtune.targets import resolve_target
from probtune.workloads.catalog import BUILTIN_WORKLOADS
from probtune_cpu.llvm_features import llvm_target_has
from probtune_cpu.polynomial_exp import RewriteExpPolynomial, _is_float32_exp
from probtune_cpu.stored_values import workload_stores_any

CATALOG = {spec.name: spec for spec in BUILTIN_WORKLOADS}
_SPECIAL = [0.0, -0.0, 1e-30, -1e-30, 1.0, -1.0, 88.7, 88.72, 88.73, 89.0, -87.3, -87.4, -100.0, -103.9, -104.5,
            -1000.0, 1000.0, np.inf, -np.inf, np.nan]


def _exp_function(n: int, dtype: str = "float32") -> tvm.tirx.PrimFunc:
    x = te.placeholder((n,), dtype, name="x")
    y = te.compute((n,), lambda i: te.exp(x[i]), name="y")
    return te.create_prim_func([x, y])


def _compiled_rewritten_exp(target, n: int, lanes: int):
    sch = s_tir.Schedule(_exp_function(n))
    assert RewriteExpPolynomial().check(sch, context_of(sch, target)) is None
    if lanes > 1:
        _, inner = sch.split(sch.get_loops(sch.get_sblock("y"))[0], [None, lanes])
        sch.vectorize(inner)
    return sch.mod, tvm.compile(sch.mod, target=tvm.target.Target(target.tvm_target))


def _targets_that_run_here(host):
    """The host, and AVX2 (the exponent-bits form of 2^n) if the host is an AVX-512 CPU (the ldexp form)."""
    if llvm_target_has(host.tvm_target, "avx512f"):
        return [host, resolve_target("x86-avx2")]
    return [host]


_ACCURACY_INPUTS = np.concatenate([np.linspace(-110, 95, 200_000), _SPECIAL]).astype(np.float32)
_ACCURACY_INPUTS = np.concatenate([_ACCURACY_INPUTS, np.zeros(-len(_ACCURACY_INPUTS) % 16, np.float32)])


@pytest.mark.parametrize("lanes", [1, 16])
def test_polynomial_exp_is_within_two_ulp_and_keeps_the_special_values(host, lanes):
    inputs = _ACCURACY_INPUTS
    results = []
    for target in _targets_that_run_here(host):
        mod, lib = _compiled_rewritten_exp(target, len(inputs), lanes)
        assert "T.exp(" not in mod.script()
        results.append(run_module(lib, [inputs, np.zeros_like(inputs)])[1])
    # ldexp and the exponent bits both round 2^n * exp(r) once: the same bits
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])
    got = results[0]
    with np.errstate(over="ignore"):
        exact = np.exp(inputs.astype(np.float64))
        rounded = exact.astype(np.float32)
    normal = (exact >= np.finfo(np.float32).tiny) & np.isfinite(rounded)
    ulps = np.abs(got[normal] - exact[normal]) / np.spacing(rounded[normal]).astype(np.float64)
    assert ulps.max() <= 2.0
    subnormal = (exact < np.finfo(np.float32).tiny) & (exact > 0)
    np.testing.assert_allclose(got[subnormal], exact[subnormal], rtol=0, atol=4 * 2.0**-149)
    np.testing.assert_array_equal(got[np.isinf(rounded)], np.inf)
    assert np.isnan(got[np.isnan(inputs)]).all()
    assert got[inputs == -1000.0][0] == 0.0 and got[inputs == -np.inf][0] == 0.0


def test_rewrite_reaches_exp_under_casts_and_selects(host):
    x = te.placeholder((64,), "float32", name="x")
    y = te.compute(
        (64,), lambda i: tvm.tirx.Select(x[i] > 0, te.exp(x[i]).astype("float64"), tvm.tirx.const(-1.0, "float64")),
        name="y",
    )
    sch = s_tir.Schedule(te.create_prim_func([x, y]))
    assert RewriteExpPolynomial().check(sch, context_of(sch, host)) is None
    assert "T.exp(" not in sch.mod.script()
    inputs = np.linspace(-3, 3, 64).astype(np.float32)
    (got,) = run_module(tvm.compile(sch.mod, target=tvm.target.Target(host.tvm_target)),
                        [inputs, np.zeros(64, np.float64)])[1:]
    np.testing.assert_allclose(got, np.where(inputs > 0, np.exp(inputs.astype(np.float64)), -1.0), rtol=3e-7)


def test_rewrite_leaves_float64_exp_and_exp_free_blocks_alone(host):
    for func in (_exp_function(16, "float64"), CATALOG["matmul"].instantiate((8, 8, 8)).prim_func):
        sch = s_tir.Schedule(func)
        before = sch.mod
        assert RewriteExpPolynomial().check(sch, context_of(sch, host)) is None
        assert sch.mod.same_as(before)


def test_rewrite_walks_no_program_of_a_workload_without_exp(host):
    """Scheduling makes no new arithmetic: the workload is asked once, and a program is not walked."""
    softmax, matmul = CATALOG["softmax"].instantiate((4, 16)), CATALOG["matmul"].instantiate((8, 8, 8))
    assert workload_stores_any(softmax.mod, _is_float32_exp)
    assert not workload_stores_any(matmul.mod, _is_float32_exp)
    sch = s_tir.Schedule(_exp_function(16))
    before = sch.mod
    assert RewriteExpPolynomial().check(sch, SpaceContext(workload=matmul, target=host)) is None
    assert sch.mod.same_as(before)


def test_softmax_space_uses_the_polynomial_and_stays_correct(host):
    for candidate in softmax_samples_with("rewrite-exp-polynomial", host):
        assert "T.exp(" not in candidate.mod.script()


def test_two_to_the_n_is_one_vscalefps_on_avx512_and_exponent_bits_elsewhere():
    def assembly(target_name: str) -> tuple[str, str]:
        mod, lib = _compiled_rewritten_exp(resolve_target(target_name), 64, 16)
        return mod.script(), lib.mod.imports[0].inspect_source("s") if lib.mod.imports else lib.mod.inspect_source("s")

    script, asm = assembly("x86-avx512")
    assert "llvm.ldexp" in script and "vscalefps" in asm and "ldexpf" not in asm
    script, asm = assembly("x86-avx2")
    assert "llvm.ldexp" not in script and "ldexpf" not in asm
