"""The rounded reference: an ONNX model whose float32 products read their operands rounded to a narrow type."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

from probtune.model.examples import make_model
from probtune.model.rounded_reference import rounded_operands


def _model():
    """A float32 matrix product whose result a second product and an integer-indexed gather read."""
    w = onnx.numpy_helper.from_array(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Gemm", ["h", "w"], ["g"]),
             helper.make_node("Gather", ["g", "i"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8]),
              helper.make_tensor_value_info("i", TensorProto.INT64, [1])]
    graph = helper.make_graph(nodes, "m", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [w])
    return make_model(graph)


@pytest.mark.parametrize("precision, narrow", [("fp16", np.float16), ("bf16", None)])
def test_products_read_their_operands_rounded_and_nothing_else_changes(precision, narrow):
    original = _model()
    rounded = rounded_operands(original, precision)
    casts = [n for n in rounded.graph.node if n.op_type == "Cast"]
    assert len(casts) == 8  # two operands of each of the two products, each cast there and back
    assert [n.op_type for n in rounded.graph.node if n.op_type != "Cast"] == ["MatMul", "Gemm", "Gather"]
    assert [n.op_type for n in original.graph.node] == ["MatMul", "Gemm", "Gather"]  # the original is untouched
    x, i = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32) * 3, np.array([1])

    def run(model):
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, {"x": x, "i": i})[0]

    got, want = run(rounded), run(original)
    assert not np.array_equal(got, want)
    if narrow is not None:
        w = onnx.numpy_helper.to_array(original.graph.initializer[0])
        hidden = _round(x, narrow) @ _round(w, narrow)
        np.testing.assert_allclose(got, (_round(hidden, narrow) @ _round(w, narrow))[i], rtol=1e-5, atol=1e-5)


def _round(array, narrow):
    return array.astype(narrow).astype(np.float32)
