"""The CPU reference of a module fused for another target: default programs of the host's space, TVM's values."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import untuned_runner
from probtune.model import fuse, load_model
from probtune.model.host_reference import host_outputs
from probtune.model.precision import convert_precision
from probtune.targets import resolve_target


@pytest.mark.parametrize(("fixture", "shapes"), [("small_cnn_onnx", {"x": (1, 3, 16, 16)}), ("encoder_onnx", None)])
def test_a_module_fused_for_the_gpu_in_fp16_gives_the_plain_loops_outputs_on_this_cpu(fixture, shapes, request, host):
    model = load_model(request.getfixturevalue(fixture), shapes)
    fused = fuse(dataclasses.replace(model, mod=convert_precision(model.mod, "fp16")), resolve_target("cuda-sm90"))
    inputs = [spec.random(np.random.default_rng(0)) for spec in model.inputs]
    got = host_outputs(fused, inputs)
    want = untuned_runner(fused, host)(*inputs)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        scale = float(np.sqrt(np.mean(np.square(b.astype(np.float64)))))
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=1e-2, atol=1e-2 * scale)


def test_a_task_whose_space_has_no_valid_draw_keeps_tvms_loops_and_is_named(small_cnn_onnx, host, monkeypatch):
    from probtune.model import compile as compile_module

    model = load_model(small_cnn_onnx, {"x": (1, 3, 16, 16)})
    fused = fuse(model, host)
    monkeypatch.setattr(compile_module, "default_program", lambda space, seed=0, target=None: None)
    inputs = [spec.random(np.random.default_rng(1)) for spec in model.inputs]
    with pytest.warns(UserWarning, match="no draw of the space"):
        got = host_outputs(fused, inputs)
    for a, b in zip(got, untuned_runner(fused, host)(*inputs)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
