"""A model's tasks: one per distinct fused PrimFunc, weighted by its call sites."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from probtune.model import extract_tasks, fuse, load_model, tune_model
from probtune.model.examples import IR_VERSION, OPSET
from probtune.targets import resolve_target


def test_the_cnn_tasks_cover_every_call(small_cnn_onnx):
    fused = fuse(load_model(small_cnn_onnx, {"x": (1, 3, 16, 16)}), resolve_target("host"))
    tasks = extract_tasks(fused)
    names = {name for task in tasks for name in task.functions}
    assert any("conv2d" in name for name in names) and any("matmul" in name for name in names)
    assert sum(task.weight for task in tasks) == str(fused["main"]).count("R.call_tir(")
    assert all(task.workload.num_inputs >= 1 for task in tasks)
    heaviest = tasks[0]
    assert "conv2d" in heaviest.name  # sorted by weight x flops


def test_the_encoder_projections_are_one_task(encoder_onnx):
    tasks = extract_tasks(fuse(load_model(encoder_onnx), resolve_target("host")))
    assert max(task.weight for task in tasks) >= 4  # q, k, v and output: one matmul + add, four calls
    hashes = [task.workload.structural_hash for task in tasks]
    assert len(hashes) == len(set(hashes))


def test_a_model_with_no_tunable_task_has_none_and_compiles_as_it_is(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.save(model, tmp_path / "identity.onnx")
    loaded = load_model(tmp_path / "identity.onnx")
    assert extract_tasks(fuse(loaded, resolve_target("host"))) == []
    result = tune_model(loaded, "host", trials=4, database=tmp_path / "db.sqlite")
    assert result.tasks == [] and result.trials == 0
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    compiled = result.compile()
    np.testing.assert_array_equal(compiled(x)[0], x)
