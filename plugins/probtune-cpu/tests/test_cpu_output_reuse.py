"""The output-reuse rewrite: softmax keeps its exponentials in the output, and no reader sees an overwritten element."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import s_tir, te

from conftest import assert_program_correct, run_module, softmax_samples_with
from probtune import Rng, generate_space
from probtune.workloads.catalog import BUILTIN_WORKLOADS
from probtune_cpu.output_reuse import RewriteOutputReuse

CATALOG = {spec.name: spec for spec in BUILTIN_WORKLOADS}


def _allocated(mod: tvm.IRModule) -> set[str]:
    return {buffer.name for buffer in mod["main"].body.block.alloc_buffers}


@pytest.mark.parametrize("location", [0, -1])  # every producer in the rows' loop, or each in its own pass
def test_softmax_computes_its_exponentials_in_the_output(host, location):
    workload = CATALOG["softmax"].instantiate((4, 256))
    space = generate_space(workload, host)
    locations = {i: location for i, inst in enumerate(space.trace.instructions) if inst.kind == "sample_compute_location"}
    sch, rejected = space.realize(space.trace.with_decisions(locations), Rng(0))
    assert rejected is None
    assert "T_softmax_exp" not in _allocated(sch.mod)
    assert "T_softmax_expsum" in _allocated(sch.mod)
    exponentials = sch.tvm.get(sch.tvm.get_sblock("T_softmax_exp"))
    assert [region.source.name for region in exponentials.writes] == ["T_softmax_norm"]
    assert_program_correct(workload, sch.mod, host)


def test_softmax_samples_stay_correct(host):
    """Every sample matches numpy; a sample that recomputes the sum inside the normalisation's loop over j, after
    the row's first elements are overwritten, keeps its exponentials apart."""
    samples = softmax_samples_with("rewrite-output-reuse", host, samples=8)
    assert any("T_softmax_exp" not in _allocated(candidate.mod) for candidate in samples)


@pytest.mark.parametrize("name", ["dense_bias_relu", "matmul"])
def test_an_intermediate_with_one_consumer_stays(host, name):
    """Dense's accumulator and matmul's write-back cache have only their producer and the output's writer."""
    workload = CATALOG[name].instantiate(CATALOG[name].small_shape)
    space = generate_space(workload, host)
    sch, rejected = space.realize(space.trace.with_decisions({}), Rng(0))
    assert rejected is None
    before = sch.tvm.mod
    assert RewriteOutputReuse().check(sch.tvm, None) is None
    assert sch.tvm.mod.same_as(before)


def _neighbours(row_shift: int) -> tuple[tvm.tirx.PrimFunc, np.ndarray]:
    """``out[i, j] = e[i, j] + e[(i - row_shift) % m, (j + 1) % n]``, ``e = 2a``: ``t`` reads e at another element."""
    m, n = 8, 16
    a = te.placeholder((m, n), "float32", name="a")
    e = te.compute((m, n), lambda i, j: a[i, j] * 2.0, name="e")
    t = te.compute((m, n), lambda i, j: e[(i + m - row_shift) % m, (j + 1) % n], name="t")
    out = te.compute((m, n), lambda i, j: e[i, j] + t[i, j], name="out")
    values = np.arange(m * n, dtype=np.float32).reshape(m, n)
    doubled = 2 * values
    expected = doubled + np.roll(np.roll(doubled, row_shift, axis=0), -1, axis=1)
    return te.create_prim_func([a, out]), (values, expected)


@pytest.mark.parametrize(("row_shift", "reused"), [(0, True), (1, False)])
def test_a_reader_sharing_the_rows_loop_must_read_its_own_row(host, row_shift, reused):
    """``t`` computed in ``out``'s loop over rows: reading row i is safe; reading row i - 1, which the previous
    iteration's ``out`` has overwritten by then, is not, and the rewrite leaves the program alone."""
    func, (values, expected) = _neighbours(row_shift)
    sch = s_tir.Schedule(func)
    rows = sch.get_loops(sch.get_sblock("out"))[0]
    sch.compute_at(sch.get_sblock("t"), rows)
    assert RewriteOutputReuse().check(sch, None) is None
    assert ("e" not in _allocated(sch.mod)) is reused
    lib = tvm.compile(sch.mod, target=tvm.target.Target(host.tvm_target))
    (got,) = run_module(lib, [values, np.zeros_like(values)])[1:]
    np.testing.assert_array_equal(got, expected)


def test_a_reader_after_the_output_writer_keeps_the_intermediate(host):
    m, n = 8, 16
    a = te.placeholder((m, n), "float32", name="a")
    e = te.compute((m, n), lambda i, j: a[i, j] * 2.0, name="e")
    out = te.compute((m, n), lambda i, j: e[i, j] + 1.0, name="out")
    total = te.compute((m,), lambda i: e[i, 0] + e[i, n - 1], name="total")
    sch = s_tir.Schedule(te.create_prim_func([a, out, total]))  # ``total`` runs after ``out``
    assert RewriteOutputReuse().check(sch, None) is None
    assert "e" in _allocated(sch.mod)


def test_a_producer_recomputed_inside_the_output_writers_loop_keeps_the_intermediate(host):
    """``e`` and the row sum placed in ``out``'s loop over j: each iteration recomputes and sums the whole row of
    ``e``; in the output, both would meet the elements already finished."""
    m, n = 4, 16
    a = te.placeholder((m, n), "float32", name="a")
    e = te.compute((m, n), lambda i, j: a[i, j] * 2.0, name="e")
    k = te.reduce_axis((0, n), name="k")
    total = te.compute((m,), lambda i: te.sum(e[i, k], axis=k), name="total")
    out = te.compute((m, n), lambda i, j: e[i, j] / total[i], name="out")
    sch = s_tir.Schedule(te.create_prim_func([a, out]))
    columns = sch.get_loops(sch.get_sblock("out"))[1]
    sch.compute_at(sch.get_sblock("total"), columns)
    sch.compute_at(sch.get_sblock("e"), columns)
    assert RewriteOutputReuse().check(sch, None) is None
    assert "e" in _allocated(sch.mod)
    values = np.arange(1, m * n + 1, dtype=np.float32).reshape(m, n)
    lib = tvm.compile(sch.mod, target=tvm.target.Target(host.tvm_target))
    (got,) = run_module(lib, [values, np.zeros_like(values)])[1:]
    np.testing.assert_allclose(got, values / values.sum(axis=1, keepdims=True), rtol=1e-6)
