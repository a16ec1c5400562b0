"""Graph rewrite split-projections: a product split along its features becomes one product per part."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import untuned_runner
from probtune.model import extract_tasks, fuse, load_model
from probtune.model.check import check_outputs
from probtune.model.examples import make_model
from probtune.model.precision import convert_precision
from probtune.model.rewrites import rewrite_counts
from probtune.targets import resolve_target

pytestmark = pytest.mark.filterwarnings("ignore")


def _attention(path, axis: int = 2, extra_reader: bool = False):
    """GPT-2's attention on 5 tokens of 8 features in 2 heads: one product to 24 features and a bias, split three
    ways into queries, keys and values (``axis`` 1 splits the tokens instead; ``extra_reader`` also returns the
    product's sum before the split)."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((8, 24)).astype(np.float32), "w"),
               numpy_helper.from_array(rng.standard_normal(24).astype(np.float32), "b"),
               numpy_helper.from_array(np.array([5, 8]), "tokens"), numpy_helper.from_array(np.array([1, 5, 24]), "qkv"),
               numpy_helper.from_array(np.array([1, 5, 2, 4]), "heads"),
               numpy_helper.from_array(np.array([8, 8, 8] if axis == 2 else [1, 2, 2]), "parts")]
    node = helper.make_node
    nodes = [node("Reshape", ["x", "tokens"], ["x2"]), node("MatMul", ["x2", "w"], ["p"]), node("Add", ["p", "b"], ["h"]),
             node("Reshape", ["h", "qkv"], ["h3"]), node("Split", ["h3", "parts"], ["q", "k", "v"], axis=axis)]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 5, 4] if axis == 2 else [1, 5, 24])]
    if axis == 2:
        for name, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
            nodes += [node("Reshape", [name, "heads"], [name + "4"]), node("Transpose", [name + "4"], [name + "t"], perm=perm)]
        nodes += [node("MatMul", ["qt", "kt"], ["s"]), node("Softmax", ["s"], ["a"]), node("MatMul", ["a", "vt"], ["y"])]
    else:
        nodes += [node("Concat", ["v", "k", "q"], ["y"], axis=1)]
    if extra_reader:
        outputs.append(helper.make_tensor_value_info("h", TensorProto.FLOAT, [5, 24]))
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 8])],
                              outputs, weights)
    onnx.save(make_model(graph), path)
    return load_model(path)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_split_projection_becomes_three_that_write_heads(tmp_path, precision):
    """The parts' products are then written per head by head-projections: no split and no transpose is left."""
    model = _attention(tmp_path / "a.onnx")
    converted = dataclasses.replace(model, mod=convert_precision(model.mod, precision))
    cuda, host = resolve_target("cuda-sm90"), resolve_target("host")
    fused = fuse(converted, cuda)
    assert rewrite_counts(fused)["split-projections"] == 3 and "split" not in str([t.name for t in extract_tasks(fused)])
    if precision == "fp16":  # its weights folded into constants, which head-projections reads
        assert rewrite_counts(fused)["head-projections"] == 3
        assert not [t.name for t in extract_tasks(fused) if "transpose" in t.name]
    rewritten = fuse(converted, host, rewrites=["split-projections", "head-projections"])
    check_outputs(model, untuned_runner(rewritten, host), precision=precision)


@pytest.mark.parametrize("axis, extra_reader", [(1, False), (2, True)])
def test_a_split_of_tokens_or_of_a_product_read_elsewhere_is_left(tmp_path, axis, extra_reader):
    model = _attention(tmp_path / "a.onnx", axis=axis, extra_reader=extra_reader)
    host = resolve_target("host")
    fused = fuse(model, host, rewrites=["split-projections"])
    assert not rewrite_counts(fused).get("split-projections")
    check_outputs(model, untuned_runner(fused, host))
