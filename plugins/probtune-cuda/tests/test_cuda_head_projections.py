"""Graph rewrite head-projections: attention's queries, keys and values come out of batched products, untransposed."""

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


def _transposing(fused) -> int:
    """How many calls of the fused model transpose."""
    return sum(task.weight for task in extract_tasks(fused) if "transpose" in task.name)


def test_an_encoders_projections_read_and_write_heads_where_attention_has_them(encoder_onnx, monkeypatch):
    """Queries, keys and values come out per head, the keys read transposed by QK^T, and the output projection
    reads the heads' outputs where they lie, with the bias and the residual in its epilogue: no transposes left.
    (Copy reads, which would take the transposes into the products otherwise, are left out to compare.)"""
    import probtune.model.tasks

    monkeypatch.setattr(probtune.model.tasks, "read_copies_in_products", lambda mod: (mod, 0))
    model = load_model(encoder_onnx)
    cuda = resolve_target("cuda-sm90")
    before, after = fuse(model, cuda, rewrites=["sink-reshapes"]), fuse(model, cuda, ["head-projections", "sink-reshapes"])
    assert rewrite_counts(after)["head-projections"] == 4
    assert _transposing(before) == 4 and _transposing(after) == 0
    names = [task.name for task in extract_tasks(after)]
    assert any(name.startswith("fused_NT_matmul") for name in names)
    assert any(name.startswith("fused_heads_matmul_add") for name in names)
    calls = sum(task.weight for task in extract_tasks(after))
    assert calls == sum(task.weight for task in extract_tasks(before)) - 4


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_the_rewritten_encoder_computes_what_onnxruntime_does(encoder_onnx, precision):
    """Built by TVM for this CPU as it is, in float32 and in float16 (the rewrite is the same for every target)."""
    model = load_model(encoder_onnx)
    host = resolve_target("host")
    converted = dataclasses.replace(model, mod=convert_precision(model.mod, precision))
    fused = fuse(converted, host, rewrites=["head-projections", "sink-reshapes"])
    assert rewrite_counts(fused)["head-projections"] == 4
    check_outputs(model, untuned_runner(fused, host), precision=precision)


def _projection(path, perm: list[int]):
    """Tokens projected by a constant and split into 2 heads of 4, then transposed by ``perm``."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((6, 8)).astype(np.float32), "w"),
               numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b"),
               numpy_helper.from_array(np.array([5, 6]), "flat"), numpy_helper.from_array(np.array([1, 5, 2, 4]), "heads")]
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["x2"]), helper.make_node("MatMul", ["x2", "w"], ["p"]),
             helper.make_node("Add", ["p", "b"], ["h"]), helper.make_node("Reshape", ["h", "heads"], ["r"]),
             helper.make_node("Transpose", ["r"], ["y"], perm=perm)]
    out = [[1, 5, 2, 4][axis] for axis in perm]
    graph = helper.make_graph(nodes, "projection", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], weights)
    onnx.save(make_model(graph), path)
    return load_model(path)


@pytest.mark.parametrize(("perm", "rewritten"), [([0, 2, 1, 3], 1), ([0, 2, 3, 1], 1), ([0, 1, 3, 2], 0)])
def test_only_a_transpose_that_puts_the_heads_first_is_rewritten(tmp_path, perm, rewritten):
    model = _projection(tmp_path / "p.onnx", perm)
    host = resolve_target("host")
    fused = fuse(model, host, rewrites=["head-projections"])
    assert rewrite_counts(fused).get("head-projections", 0) == rewritten
    check_outputs(model, untuned_runner(fused, host))


def _merge(path, perm: list[int]):
    """Two heads of (5 tokens x 4), transposed by ``perm``, merged into 8 features and projected by a constant."""
    rng = np.random.default_rng(1)
    weights = [numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32), "w"),
               numpy_helper.from_array(np.array([5, 8]), "flat")]
    nodes = [helper.make_node("Transpose", ["a"], ["t"], perm=perm), helper.make_node("Reshape", ["t", "flat"], ["m"]),
             helper.make_node("MatMul", ["m", "w"], ["y"])]
    graph = helper.make_graph(nodes, "merge", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 2, 5, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 6])], weights)
    onnx.save(make_model(graph), path)
    return load_model(path)


@pytest.mark.parametrize(("perm", "rewritten"), [([0, 2, 1, 3], 1), ([0, 2, 3, 1], 0)])
def test_only_heads_merged_back_token_by_token_are_read_in_place(tmp_path, perm, rewritten):
    """``[0, 2, 3, 1]`` lays (2 heads x 4 width) out as (4 x 2) per token: a product over heads and width would
    sum the wrong products."""
    model = _merge(tmp_path / "m.onnx", perm)
    host = resolve_target("host")
    fused = fuse(model, host, rewrites=["head-projections"])
    assert rewrite_counts(fused).get("head-projections", 0) == rewritten
    check_outputs(model, untuned_runner(fused, host))


def _packed_attention(path, extra_output: bool = False):
    """Attention as PyTorch's ``nn.MultiheadAttention`` exports it (ViT): one product to queries, keys and values,
    reshaped to (tokens, 1, 3, features), expanded, transposed, squeezed and taken apart, each part's heads
    transposed before the tokens, queries and keys scaled; the heads' outputs merged back token by token into the
    output projection. ``extra_output`` also returns the queries as taken apart (5 tokens, 2 heads of 4)."""
    rng = np.random.default_rng(2)
    constants = {"w": rng.standard_normal((8, 24)), "b": rng.standard_normal(24), "wo": rng.standard_normal((8, 8)),
                 "scale": np.array(0.5), "packed": np.array([5, 1, 3, 8]), "heads": np.array([5, 2, 4]),
                 "first": np.array([1, 2, 5, 4]), "tokens": np.array([5, 8]), "zero": np.array([0]),
                 "three": np.array([3]), **{f"i{n}": np.array(n) for n in range(3)}}
    weights = [numpy_helper.from_array(v.astype(np.float32 if v.dtype.kind == "f" else np.int64), k)
               for k, v in constants.items()]
    node = helper.make_node
    nodes = [node("MatMul", ["x", "w"], ["p"]), node("Add", ["p", "b"], ["pb"]), node("Reshape", ["pb", "packed"], ["r"]),
             node("Unsqueeze", ["r", "zero"], ["u"]), node("Transpose", ["u"], ["t"], perm=[3, 1, 2, 0, 4]),
             node("Squeeze", ["t", "three"], ["s"])]
    for n, part in enumerate("qkv"):
        nodes += [node("Gather", ["s", f"i{n}"], [part]), node("Reshape", [part, "heads"], [part + "h"]),
                  node("Transpose", [part + "h"], [part + "p"], perm=[1, 0, 2]),
                  node("Reshape", [part + "p", "first"], [part + "4"])]
    nodes += [node("Mul", ["q4", "scale"], ["qs"]), node("Transpose", ["k4"], ["kT"], perm=[0, 1, 3, 2]),
              node("Mul", ["kT", "scale"], ["ks"]), node("MatMul", ["qs", "ks"], ["a"]), node("Softmax", ["a"], ["sm"]),
              node("MatMul", ["sm", "v4"], ["o"]), node("Transpose", ["o"], ["ot"], perm=[2, 0, 1, 3]),
              node("Reshape", ["ot", "tokens"], ["om"]), node("MatMul", ["om", "wo"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 8])]
    if extra_output:
        outputs.append(helper.make_tensor_value_info("q", TensorProto.FLOAT, [5, 1, 8]))
    graph = helper.make_graph(nodes, "packed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 8])],
                              outputs, weights)
    onnx.save(make_model(graph), path)
    return load_model(path)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_packed_projections_taken_apart_are_written_per_head(tmp_path, precision):
    """Whatever moves lay the parts out (an expand, a transpose, a squeeze and a take here), the element numbers
    they move decide: each part is a product per head, the scale applied per head, nothing left to transpose."""
    model = _packed_attention(tmp_path / "a.onnx")
    converted = dataclasses.replace(model, mod=convert_precision(model.mod, precision))
    fused = fuse(converted, resolve_target("cuda-sm90"))
    assert rewrite_counts(fused)["head-projections"] == 4  # queries, keys, values and the output projection
    assert _transposing(fused) == 0 and not [t.name for t in extract_tasks(fused) if "take" in t.name]
    host = resolve_target("host")
    check_outputs(model, untuned_runner(fuse(converted, host, rewrites=["head-projections"]), host), precision=precision)


def test_a_product_another_reader_keeps_is_not_computed_again_per_head(tmp_path):
    model = _packed_attention(tmp_path / "a.onnx", extra_output=True)
    host = resolve_target("host")
    fused = fuse(model, host, rewrites=["head-projections"])
    assert rewrite_counts(fused)["head-projections"] == 1  # the output projection alone
    assert sum(task.weight for task in extract_tasks(fused) if "matmul" in task.name) == 4  # 2 products, 2 attention
    check_outputs(model, untuned_runner(fused, host))


def _timm_attention(path):
    """Attention as timm exports it (DeiT): one product reshaped to (1, tokens, 3, heads, width), transposed to
    (3, 1, heads, tokens, width), split along its first axis and squeezed; the keys transposed after their scale."""
    rng = np.random.default_rng(3)
    constants = {"w": rng.standard_normal((8, 24)), "b": rng.standard_normal(24), "wo": rng.standard_normal((8, 8)),
                 "scale": np.array(0.5), "packed": np.array([1, 5, 3, 2, 4]), "ones": np.array([1, 1, 1]),
                 "zero": np.array([0]), "tokens": np.array([5, 8])}
    weights = [numpy_helper.from_array(v.astype(np.float32 if v.dtype.kind == "f" else np.int64), k)
               for k, v in constants.items()]
    node = helper.make_node
    nodes = [node("MatMul", ["x", "w"], ["p"]), node("Add", ["p", "b"], ["pb"]), node("Reshape", ["pb", "packed"], ["r"]),
             node("Transpose", ["r"], ["t"], perm=[2, 0, 3, 1, 4]), node("Split", ["t", "ones"], ["q5", "k5", "v5"], axis=0)]
    nodes += [node("Squeeze", [part + "5", "zero"], [part]) for part in "qkv"]
    nodes += [node("Mul", ["q", "scale"], ["qs"]), node("Mul", ["k", "scale"], ["ks"]),
              node("Transpose", ["ks"], ["kT"], perm=[0, 1, 3, 2]), node("MatMul", ["qs", "kT"], ["a"]),
              node("Softmax", ["a"], ["sm"]), node("MatMul", ["sm", "v"], ["o"]),
              node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]), node("Reshape", ["ot", "tokens"], ["om"]),
              node("MatMul", ["om", "wo"], ["y"])]
    graph = helper.make_graph(nodes, "timm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 8])], weights)
    onnx.save(make_model(graph), path)
    return load_model(path)


def test_parts_split_along_another_axis_are_written_per_head(tmp_path):
    """A split's part is traced as the range it takes; the keys' scale goes before their transpose, which the
    attention product then reads directly."""
    model = _timm_attention(tmp_path / "a.onnx")
    converted = dataclasses.replace(model, mod=convert_precision(model.mod, "fp16"))
    fused = fuse(converted, resolve_target("cuda-sm90"))
    assert rewrite_counts(fused)["head-projections"] == 4
    assert _transposing(fused) == 0 and not [t.name for t in extract_tasks(fused) if "split" in t.name]
    host = resolve_target("host")
    check_outputs(model, untuned_runner(fuse(converted, host, rewrites=["head-projections"]), host), precision="fp16")


def test_a_classifier_reading_a_flattened_map_is_left(tmp_path):
    """(1, 8, 1, 1) reshaped to (1, 8) lays 8 "heads" of width 1 side by side already: a view, nothing to rewrite."""
    weights = [numpy_helper.from_array(np.ones((8, 3), np.float32), "w"), numpy_helper.from_array(np.array([1, 8]), "flat")]
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["f"]), helper.make_node("MatMul", ["f", "w"], ["y"])]
    graph = helper.make_graph(nodes, "classifier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 1, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], weights)
    onnx.save(make_model(graph), tmp_path / "c.onnx")
    fused = fuse(load_model(tmp_path / "c.onnx"), resolve_target("cuda-sm90"))
    assert not rewrite_counts(fused).get("head-projections")


def _split_attention(path, axis: int = 2, extra_reader: bool = False):
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
def test_a_product_split_three_ways_is_written_per_head(tmp_path, precision):
    """Each part of the split is traced as the range of columns it takes: one product per head and part, no split
    and no transpose left."""
    model = _split_attention(tmp_path / "a.onnx")
    converted = dataclasses.replace(model, mod=convert_precision(model.mod, precision))
    fused = fuse(converted, resolve_target("cuda-sm90"))
    assert rewrite_counts(fused)["head-projections"] == 3
    names = [t.name for t in extract_tasks(fused)]
    assert not [name for name in names if "split" in name or "transpose" in name]
    host = resolve_target("host")
    check_outputs(model, untuned_runner(fuse(converted, host, rewrites=["head-projections"]), host), precision=precision)


@pytest.mark.parametrize("axis, extra_reader", [(1, False), (2, True)])
def test_a_split_of_tokens_or_of_a_product_read_elsewhere_is_left(tmp_path, axis, extra_reader):
    """Tokens split apart are no heads; a product the model also returns is kept, and not computed again per head."""
    model = _split_attention(tmp_path / "a.onnx", axis=axis, extra_reader=extra_reader)
    host = resolve_target("host")
    fused = fuse(model, host, rewrites=["head-projections"])
    assert not rewrite_counts(fused).get("head-projections")
    check_outputs(model, untuned_runner(fused, host))
