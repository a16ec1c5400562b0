"""Graph rewrite sink-reshapes: a transformer's bias, residual add and GELU join its 2-D matrix products' kernels."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import untuned_runner
from probtune.model import extract_tasks, fuse, load_model
from probtune.model.check import check_outputs
from probtune.model.examples import make_model
from probtune.model.rewrites import rewrite_counts
from probtune.targets import resolve_target

pytestmark = pytest.mark.filterwarnings("ignore")

TOKENS, WIDTH = 8, 16


def _const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


@pytest.fixture(scope="module")
def encoder_layer(tmp_path_factory):
    """The tail of an encoder layer as exporters write it: 2-D products between reshapes, the residual added in 3-D,
    a layer norm, and an erf GELU computed on the product reshaped to 3-D and reshaped back."""
    rng = np.random.default_rng(0)
    weights = [_const(n, rng.standard_normal(s).astype(np.float32) / 4) for n, s in
               (("w1", (WIDTH, WIDTH)), ("b1", (WIDTH,)), ("w2", (WIDTH, 4 * WIDTH)), ("b2", (4 * WIDTH,)),
                ("w3", (4 * WIDTH, WIDTH)), ("gamma", (WIDTH,)), ("beta", (WIDTH,)))]
    weights += [_const("flat", np.array([TOKENS, WIDTH])), _const("tokens", np.array([1, TOKENS, WIDTH])),
                _const("wide", np.array([1, TOKENS, 4 * WIDTH])), _const("wide_flat", np.array([TOKENS, 4 * WIDTH])),
                _const("root2", np.float32(1.4142135)), _const("one", np.float32(1.0)), _const("half", np.float32(0.5))]
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["x2"]),
             helper.make_node("MatMul", ["x2", "w1"], ["p1"]),
             helper.make_node("Add", ["p1", "b1"], ["h1"]),
             helper.make_node("Reshape", ["h1", "tokens"], ["h1_3d"]),
             helper.make_node("Add", ["h1_3d", "x"], ["residual"]),
             helper.make_node("LayerNormalization", ["residual", "gamma", "beta"], ["n"], axis=-1, epsilon=1e-5),
             helper.make_node("Reshape", ["n", "flat"], ["n2"]),
             helper.make_node("MatMul", ["n2", "w2"], ["p2"]),
             helper.make_node("Add", ["p2", "b2"], ["h2"]),
             helper.make_node("Reshape", ["h2", "wide"], ["g"]),
             helper.make_node("Div", ["g", "root2"], ["g1"]),
             helper.make_node("Erf", ["g1"], ["g2"]),
             helper.make_node("Add", ["g2", "one"], ["g3"]),
             helper.make_node("Mul", ["g", "g3"], ["g4"]),
             helper.make_node("Mul", ["g4", "half"], ["g5"]),
             helper.make_node("Reshape", ["g5", "wide_flat"], ["g6"]),
             helper.make_node("MatMul", ["g6", "w3"], ["y"])]
    graph = helper.make_graph(nodes, "encoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, TOKENS, WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [TOKENS, WIDTH])], weights)
    path = tmp_path_factory.mktemp("models") / "encoder.onnx"
    onnx.save(make_model(graph), path)
    return load_model(path)


def _fused_functions(fused) -> list[str]:
    return sorted(name for task in extract_tasks(fused) for name in task.functions)


def test_the_bias_residual_and_gelu_run_in_the_products_kernels(encoder_layer):
    cuda = resolve_target("cuda-sm90")
    before, after = fuse(encoder_layer, cuda, rewrites=[]), fuse(encoder_layer, cuda)
    assert rewrite_counts(after)["sink-reshapes"] > 0
    assert not [name for name in _fused_functions(after) if "matmul" not in name and "layer_norm" not in name]
    assert any("matmul" in name and "erf" in name for name in _fused_functions(after))
    assert len(_fused_functions(after)) < len(_fused_functions(before))


def test_the_rewritten_model_computes_what_onnxruntime_does(encoder_layer):
    host = resolve_target("host")
    fused = fuse(encoder_layer, host, rewrites=["sink-reshapes"])
    assert rewrite_counts(fused)["sink-reshapes"] > 0
    check_outputs(encoder_layer, untuned_runner(fused, host))


def test_a_reshape_is_left_where_the_other_operand_does_not_broadcast_over_the_axes_it_keeps(tmp_path):
    """``reshape(x, (4, 6)) + b`` with ``b`` of shape (6,) is not ``reshape(x + b)`` for an ``x`` of shape (6, 4)."""
    weights = [_const("shape", np.array([4, 6])), _const("b", np.arange(6, dtype=np.float32))]
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Add", ["r", "b"], ["y"])]
    graph = helper.make_graph(nodes, "mix", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])], weights)
    onnx.save(make_model(graph), tmp_path / "mix.onnx")
    model = load_model(tmp_path / "mix.onnx")
    host = resolve_target("host")
    fused = fuse(model, host, rewrites=["sink-reshapes"])
    assert rewrite_counts(fused).get("sink-reshapes", 0) == 0
    check_outputs(model, untuned_runner(fused, host))
