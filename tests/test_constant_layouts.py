"""A model task's candidates are timed as the compiled model runs them: a constant weight's layout copy made beforehand."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import s_tir

from conftest import run_module
from probtune import Rng
from probtune.measure import LocalBuilder, LocalRunner, prepare_reference
from probtune.measure.codegen import compile_for
from probtune.measure.constant_layouts import MeasuredForm, layout_copies, read_constants_packed
from probtune.measure.pipeline import measure
from probtune.model import extract_tasks, fuse, load_model
from probtune.search.search_strategy import RandomSearch
from probtune.space.space_generator import generate_space

WEIGHT = 1  # a dense layer's weight: the second parameter, a constant in the model


@pytest.fixture(scope="module")
def dense_task(encoder_onnx, host):
    """A dense layer of the encoder, and two samples of its space: one that copies its weight into panels, one that does not."""
    task = next(t for t in extract_tasks(fuse(load_model(encoder_onnx), host)) if "matmul" in t.name)
    space = generate_space(task.workload, host)
    copying, plain = None, None
    for candidate in RandomSearch(space, Rng(1)).next_batch(32):
        copies = any(copy.param == WEIGHT for copy in layout_copies(candidate.mod["main"]))
        if copies and copying is None:
            copying = candidate
        elif not copies and plain is None:
            plain = candidate
    assert copying is not None and plain is not None, "the samples lack a program with (or without) a weight copy"
    return task, copying, plain


def test_a_dense_task_knows_its_weight_is_constant(dense_task):
    task, _, _ = dense_task
    assert WEIGHT in task.constants and 0 not in task.constants  # the activations change between calls


def test_the_copy_of_a_constant_is_folded_into_the_parameter(dense_task):
    _, copying, _ = dense_task
    program, layouts = read_constants_packed(copying.mod, {WEIGHT})
    assert list(layouts) == [WEIGHT]
    assert not [copy for copy in layout_copies(program["main"]) if copy.param == WEIGHT]
    assert len(program["main"].params[WEIGHT].shape) == 3  # panels: [j // w, k, j % w]
    unchanged, none = read_constants_packed(copying.mod, set())  # not a constant: its copy stays
    assert none == {} and unchanged.same_as(copying.mod)


def _refuse_inlining(monkeypatch):
    """TVM's schedule refuses with a ScheduleError, as for a copy whose buffer a tensorized block matches."""
    from tvm.s_tir.schedule.schedule import ScheduleError

    def refuse(self, block):
        raise ScheduleError("The buffer to be inlined has opaque access")

    monkeypatch.setattr(s_tir.Schedule, "compute_inline", refuse)


def test_a_copy_that_cannot_be_inlined_becomes_the_parameter(dense_task, monkeypatch, host):
    _, copying, _ = dense_task
    _refuse_inlining(monkeypatch)
    program, layouts = read_constants_packed(copying.mod, {WEIGHT})
    assert list(layouts) == [WEIGHT] and len(program["main"].params[WEIGHT].shape) == 3
    assert not [copy for copy in layout_copies(program["main"]) if copy.param == WEIGHT]
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-1, 1, shape).astype(dtype) for shape, dtype in _param_specs(copying.mod)]
    want = run_module(compile_for(copying.mod, host), inputs)[-1]
    inputs[WEIGHT] = layouts[WEIGHT].map_tensor(tvm.runtime.tensor(inputs[WEIGHT])).numpy()
    np.testing.assert_array_equal(run_module(compile_for(program, host), inputs)[-1], want)


def test_a_copy_tvm_cannot_fold_is_left_as_it_is(dense_task, monkeypatch):
    """Neither inlined nor taken as the parameter (TVM's pass refuses too): the program copies on every call."""
    _, copying, _ = dense_task
    _refuse_inlining(monkeypatch)

    def refuse_pass(*args, **kwargs):
        raise RuntimeError("the pass refuses")

    monkeypatch.setattr(s_tir.transform, "RemoveWeightLayoutRewriteBlock", refuse_pass)
    program, layouts = read_constants_packed(copying.mod, {WEIGHT})
    assert layouts == {} and program.same_as(copying.mod)


def _param_specs(mod):
    return [([int(d) for d in p.shape], str(p.dtype)) for p in mod["main"].params]


def test_without_constants_every_program_is_timed_as_it_is(dense_task, tmp_path):
    task, copying, _ = dense_task
    reference = prepare_reference(task.workload, tmp_path)
    program, got = MeasuredForm(reference)(copying.program)
    assert program is copying.program and got == reference


def test_packed_programs_run_against_inputs_in_their_layout_and_compute_the_same(dense_task, tmp_path, host):
    task, copying, plain = dense_task
    form = MeasuredForm(prepare_reference(task.workload, tmp_path), task.constants)
    (_, packed_reference), (_, reference) = form(copying.program), form(plain.program)
    assert reference == form.reference and packed_reference != reference
    assert form(copying.mod)[1] is packed_reference  # written once per set of layouts
    with np.load(packed_reference.path) as packed, np.load(reference.path) as saved:
        assert packed[f"input_{WEIGHT}"].ndim == 3 and np.array_equal(packed["output_0"], saved["output_0"])

    with LocalBuilder(workers=1) as builder, LocalRunner() as runner:
        outcomes = list(measure([copying, plain], builder, runner, form, host, str(tmp_path), None))
    assert [(candidate is copying, status) for candidate, status, *_ in outcomes] == [(True, "ok"), (False, "ok")]
