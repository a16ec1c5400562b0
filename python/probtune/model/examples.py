"""Small ONNX models built in code, with random weights: a quick start and the tests need no download.

``small_cnn``: convolution + batch norm + ReLU, a residual add, pooling, and
a fully connected layer behind a run-time shape computation (Shape -> Gather
-> Concat -> Reshape, as exporters write a flatten). ``encoder_layer``: one
transformer encoder layer (multi-head attention with matmuls and softmax,
layer norms, a feed-forward block with GELU).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["EXAMPLES", "IR_VERSION", "OPSET", "encoder_layer", "make_model", "small_cnn"]

OPSET = 17  # LayerNormalization is in the default domain from 17
IR_VERSION = 10  # onnxruntime 1.31 reads IR versions up to 13; onnx.helper writes newer ones


def _weights(rng: np.random.Generator, name: str, *shape: int, scale: float = 0.1) -> Any:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _ints(name: str, values: list[int]) -> Any:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def make_model(graph: Any, producer: str = "probtune") -> Any:
    """``graph`` as a checked model that onnxruntime reads (opset ``OPSET``, IR version ``IR_VERSION``)."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=producer)
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def small_cnn(channels: int = 16, size: int = 32, classes: int = 10, seed: int = 0) -> Any:
    """A residual CNN block with a classifier; the input ``x`` is (N, 3, size, size) with N left dynamic."""
    rng = np.random.default_rng(seed)
    c = channels
    weights = [
        _weights(rng, "conv1_w", c, 3, 3, 3), _weights(rng, "conv1_b", c),
        _weights(rng, "bn_scale", c, scale=1.0), _weights(rng, "bn_bias", c), _weights(rng, "bn_mean", c),
        _weights(rng, "conv2_w", c, c, 3, 3), _weights(rng, "conv3_w", 2 * c, c, 3, 3),
        _weights(rng, "fc_w", classes, 2 * c), _weights(rng, "fc_b", classes),
        _ints("zero", [0]), _ints("minus_one", [-1]),
    ]
    weights.append(numpy_helper.from_array((np.abs(rng.standard_normal(c)) + 0.5).astype(np.float32), "bn_var"))
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "conv1_w", "conv1_b"], ["conv1"], pads=[1, 1, 1, 1]),
        node("BatchNormalization", ["conv1", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["bn"]),
        node("Relu", ["bn"], ["relu1"]),
        node("Conv", ["relu1", "conv2_w"], ["conv2"], pads=[1, 1, 1, 1]),
        node("Add", ["conv2", "relu1"], ["residual"]),
        node("Relu", ["residual"], ["relu2"]),
        node("MaxPool", ["relu2"], ["pool"], kernel_shape=[2, 2], strides=[2, 2]),
        node("Conv", ["pool", "conv3_w"], ["conv3"], pads=[1, 1, 1, 1], strides=[2, 2]),
        node("Relu", ["conv3"], ["relu3"]),
        node("GlobalAveragePool", ["relu3"], ["gap"]),
        node("Shape", ["gap"], ["gap_shape"]),
        node("Gather", ["gap_shape", "zero"], ["batch"], axis=0),
        node("Concat", ["batch", "minus_one"], ["flat_shape"], axis=0),
        node("Reshape", ["gap", "flat_shape"], ["flat"]),
        node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "small_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        weights,
    )
    return make_model(graph)


def encoder_layer(hidden: int = 64, heads: int = 4, ffn: int = 128, seq: int = 32, seed: int = 0) -> Any:
    """A post-norm transformer encoder layer; the input ``x`` is (1, seq, hidden)."""
    rng = np.random.default_rng(seed)
    head = hidden // heads
    weights = [
        *(_weights(rng, f"{n}_w", hidden, hidden) for n in ("q", "k", "v", "o")),
        *(_weights(rng, f"{n}_b", hidden) for n in ("q", "k", "v", "o")),
        _weights(rng, "ffn1_w", hidden, ffn), _weights(rng, "ffn1_b", ffn),
        _weights(rng, "ffn2_w", ffn, hidden), _weights(rng, "ffn2_b", hidden),
        _weights(rng, "ln1_g", hidden, scale=1.0), _weights(rng, "ln1_b", hidden),
        _weights(rng, "ln2_g", hidden, scale=1.0), _weights(rng, "ln2_b", hidden),
        _ints("heads_shape", [1, seq, heads, head]), _ints("merged_shape", [1, seq, hidden]),
    ]
    weights += [numpy_helper.from_array(np.array(v, dtype=np.float32), n)
                for n, v in (("scale", 1.0 / np.sqrt(head)), ("sqrt2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5))]
    node = helper.make_node
    nodes = []
    for n in ("q", "k", "v"):
        nodes += [
            node("MatMul", ["x", f"{n}_w"], [f"{n}_mm"]),
            node("Add", [f"{n}_mm", f"{n}_b"], [f"{n}_proj"]),
            node("Reshape", [f"{n}_proj", "heads_shape"], [f"{n}_heads"]),
        ]
    nodes += [
        node("Transpose", ["q_heads"], ["q_t"], perm=[0, 2, 1, 3]),
        node("Transpose", ["k_heads"], ["k_t"], perm=[0, 2, 3, 1]),
        node("Transpose", ["v_heads"], ["v_t"], perm=[0, 2, 1, 3]),
        node("MatMul", ["q_t", "k_t"], ["scores_raw"]),
        node("Mul", ["scores_raw", "scale"], ["scores"]),
        node("Softmax", ["scores"], ["probs"], axis=-1),
        node("MatMul", ["probs", "v_t"], ["context_heads"]),
        node("Transpose", ["context_heads"], ["context_t"], perm=[0, 2, 1, 3]),
        node("Reshape", ["context_t", "merged_shape"], ["context"]),
        node("MatMul", ["context", "o_w"], ["o_mm"]),
        node("Add", ["o_mm", "o_b"], ["attn"]),
        node("Add", ["attn", "x"], ["res1"]),
        node("LayerNormalization", ["res1", "ln1_g", "ln1_b"], ["ln1"], axis=-1, epsilon=1e-5),
        node("MatMul", ["ln1", "ffn1_w"], ["ffn1_mm"]),
        node("Add", ["ffn1_mm", "ffn1_b"], ["ffn1"]),
        node("Div", ["ffn1", "sqrt2"], ["gelu_scaled"]),  # GELU(x) = 0.5 x (1 + erf(x / sqrt 2))
        node("Erf", ["gelu_scaled"], ["gelu_erf"]),
        node("Add", ["gelu_erf", "one"], ["gelu_sum"]),
        node("Mul", ["ffn1", "gelu_sum"], ["gelu_prod"]),
        node("Mul", ["gelu_prod", "half"], ["gelu"]),
        node("MatMul", ["gelu", "ffn2_w"], ["ffn2_mm"]),
        node("Add", ["ffn2_mm", "ffn2_b"], ["ffn2"]),
        node("Add", ["ffn2", "ln1"], ["res2"]),
        node("LayerNormalization", ["res2", "ln2_g", "ln2_b"], ["y"], axis=-1, epsilon=1e-5),
    ]
    graph = helper.make_graph(
        nodes, "encoder_layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])],
        weights,
    )
    return make_model(graph)


EXAMPLES: dict[str, Callable[[], Any]] = {"small-cnn": small_cnn, "encoder-layer": encoder_layer}
"""The example models by name (``probtune example-model NAME``), each at its default size."""
