from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from conftest import untuned_runner
from probtune.model import extract_tasks, fuse, load_model
from probtune.model.batch_norms import AFFINE_BATCH_NORMS, affine_batch_norms
from probtune.model.check import check_outputs
from probtune.model.examples import make_model
from probtune.model.precision import convert_precision
from probtune.model.rewrites import rewrite_counts
from probtune.targets import resolve_target

pytestmark = pytest.mark.filterwarnings("ignore")

TOKENS, FEATURES, HIDDEN = 16, 32, 64


@pytest.fixture
def linear_batch_norm_onnx(tmp_path):
    """LeViT's linear layer as timm exports it: the tokens flattened to 2-D around a BatchNorm1d of the product, then
    reshaped back and added to the residual."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((FEATURES, HIDDEN)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((HIDDEN, FEATURES)).astype(np.float32), "w2"),
        numpy_helper.from_array(np.array([TOKENS, HIDDEN], np.int64), "flat"),
        numpy_helper.from_array(np.array([1, TOKENS, HIDDEN], np.int64), "tokens"),
    ]
    stats = []
    for kind in ("g", "b", "m", "v"):
        value = rng.standard_normal(HIDDEN).astype(np.float32)
        weights.append(numpy_helper.from_array(np.abs(value) + 0.5 if kind == "v" else value, kind))
        stats.append(kind)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"]),
        helper.make_node("Reshape", ["p", "flat"], ["p2"]),
        helper.make_node("BatchNormalization", ["p2", *stats], ["n"], epsilon=1e-5),
        helper.make_node("Reshape", ["n", "tokens"], ["n3"]),
        helper.make_node("Relu", ["n3"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["q"]),
        helper.make_node("Add", ["q", "x"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "linear_bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, TOKENS, FEATURES])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, TOKENS, FEATURES])], weights)
    path = tmp_path / "linear_bn.onnx"
    onnx.save(make_model(graph), path)
    return path


def _ops(mod) -> list[str]:
    found: list[str] = []
    relax.analysis.post_order_visit(
        mod["main"], lambda e: found.append(str(e.op.name)) if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None
    )
    return found


def test_an_inference_batch_norm_becomes_a_multiply_and_an_add(linear_batch_norm_onnx):
    model = load_model(linear_batch_norm_onnx)
    affine, count = affine_batch_norms(model.mod)
    assert count == 1
    assert "relax.nn.batch_norm" in _ops(model.mod) and "relax.nn.batch_norm" not in _ops(affine)
    assert {"relax.multiply", "relax.add"} <= set(_ops(affine))


def test_on_the_gpu_the_batch_norm_runs_in_the_products_epilogue(linear_batch_norm_onnx):
    """With the norm elementwise, sink-reshapes carries the reshape past it: the product, the norm, the ReLU and the
    cast are one function, and the model still computes what onnxruntime does."""
    model = load_model(linear_batch_norm_onnx)
    converted = dataclasses.replace(model, mod=convert_precision(model.mod, "fp16"))
    fused = fuse(converted, resolve_target("cuda-sm90"))
    assert rewrite_counts(fused)[AFFINE_BATCH_NORMS] == 1
    names = [task.name for task in extract_tasks(fused)]
    assert any("_matmul" in name and "multiply" in name and "relu" in name for name in names), names
    assert not any("batch_norm" in name for name in names)
    check_outputs(model, untuned_runner(fused, resolve_target("host")), precision="fp16")


def test_on_the_host_it_computes_what_onnxruntime_does(linear_batch_norm_onnx):
    model = load_model(linear_batch_norm_onnx)
    host = resolve_target("host")
    check_outputs(model, untuned_runner(fuse(model, host), host))


def test_a_batch_norm_whose_statistics_are_computed_is_left_to_its_lowering():
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    mean = relax.Var("mean", relax.TensorType((4,), "float32"))
    ones = relax.const(np.ones(4, np.float32))
    builder = relax.BlockBuilder()
    with builder.function("main", [x, mean]):
        with builder.dataflow():
            norm = builder.emit(relax.op.nn.batch_norm(x, ones, ones, mean, ones, axis=1))
            out = builder.emit_output(relax.TupleGetItem(norm, 0))
        builder.emit_func_output(out)
    mod = builder.get()
    assert affine_batch_norms(mod) == (mod, 0)
