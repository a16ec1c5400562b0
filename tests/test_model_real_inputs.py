"""What real exported models bring that ours did not, through the whole path (import, tune, compile, check)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from probtune.model import load_model, tune_model
from probtune.model.examples import make_model

FAST = dict(batch_size=2, confirm=0)


def _save(tmp_path, name, nodes, inputs, outputs, weights=()):
    graph = helper.make_graph(nodes, name, inputs, outputs, list(weights))
    path = tmp_path / f"{name}.onnx"
    onnx.save(make_model(graph), path)
    return path


def _tensor(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def test_a_task_named_by_a_long_chain_of_operators_is_tuned(tmp_path):
    """A real model's fused task can be named by tens of operators, longer than a file name may be."""
    from tvm import relax, topi

    name = "fused_" + "_".join(f"transpose{i}_tir_clip{i}_multiply{i}" for i in range(12))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.call_te(topi.multiply, x, relax.const(0.5, "float32"), primfunc_name_hint=name))
        bb.emit_func_output(out)
    result = tune_model(bb.get(), trials=2, database=tmp_path / "t.db", **FAST)
    assert len(result.tasks[0].name) > 255 and result.tasks[0].program == "tuned"
    result.compile()


def test_a_model_with_an_unused_input_takes_it_and_ignores_it(tmp_path):
    """The frontend drops the unused input and renames the other (PyTorch's ``input.1`` becomes ``input_1``)."""
    nodes = [helper.make_node("Relu", ["input.1"], ["y"])]
    path = _save(tmp_path, "unused", nodes, [_tensor("attention.mask", [2, 8]), _tensor("input.1", [2, 8])],
                 [_tensor("y", [2, 8])])
    model = load_model(path)
    assert [spec.name for spec in model.inputs] == ["attention.mask", "input.1"]
    compiled = tune_model(model, trials=2, database=tmp_path / "t.db", **FAST).compile()
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    np.testing.assert_array_equal(compiled(np.zeros((2, 8), np.float32), x)[0], np.maximum(x, 0))


def test_two_outputs_of_different_dtypes_are_both_checked(tmp_path):
    nodes = [helper.make_node("Softmax", ["x"], ["probs"], axis=-1),
             helper.make_node("ArgMax", ["x"], ["label"], axis=-1, keepdims=0)]
    path = _save(tmp_path, "two_outputs", nodes, [_tensor("x", [3, 10])],
                 [_tensor("probs", [3, 10]), _tensor("label", [3], TensorProto.INT64)])
    compiled = tune_model(path, trials=2, database=tmp_path / "t.db", **FAST).compile()
    assert compiled.check.reference == "onnxruntime"
    x = np.random.default_rng(0).standard_normal((3, 10)).astype(np.float32)
    probs, label = compiled(x)
    assert label.dtype == np.int64 and np.array_equal(label, x.argmax(-1))
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("direction, trials", [("forward", 0), ("bidirectional", 2)])  # one tuned: the runs' kernels
def test_an_lstm_whose_sequence_length_is_given_as_an_input_shape(tmp_path, direction, trials):
    rng = np.random.default_rng(0)
    directions, hidden, features = (2 if direction == "bidirectional" else 1), 8, 6
    weights = [numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
               for name, shape in (("W", (directions, 4 * hidden, features)), ("R", (directions, 4 * hidden, hidden)),
                                   ("B", (directions, 8 * hidden)))]
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "h"], hidden_size=hidden, direction=direction)]
    path = _save(tmp_path, "lstm", nodes, [_tensor("x", ["seq", 1, features])],
                 [_tensor("y", ["seq", directions, 1, hidden]), _tensor("h", [directions, 1, hidden])], weights)
    with pytest.raises(Exception, match=r"input 'x' has a dynamic shape \(\?,1,6\); give it"):
        load_model(path)
    model = load_model(path, {"x": (5, 1, features)})
    compiled = tune_model(model, trials=trials, database=tmp_path / "t.db", **FAST).compile()
    assert compiled.check.reference == "onnxruntime"
    assert compiled(*model.random_inputs(1))[0].shape == (5, directions, 1, hidden)
