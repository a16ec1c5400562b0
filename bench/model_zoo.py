"""The benchmark models, written in code with onnx.helper and random weights: ResNet-50, MobileNetV2, BERT-base, and
ResNet-18 held out.

They follow the published architectures layer for layer (torchvision's
ResNet-50 v1.5 and MobileNetV2, and the BERT-base encoder: 12 layers, hidden
768, 12 heads, feed-forward 3072, erf GELU), so that their tasks are those of
the exported models, without torch in the benchmark environment. Batch
normalizations are kept as nodes, as exporters write them in inference mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from probtune.model import examples


class Graph:
    """A graph under construction: unique names, random weights, nodes in order."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[Any] = []
        self.weights: list[Any] = []
        self._count = 0

    def name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}_{self._count}"

    def weight(self, shape: tuple[int, ...], scale: float | None = None, positive: bool = False) -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        values = self.rng.standard_normal(shape) * (scale if scale is not None else 1.0 / np.sqrt(fan_in))
        name = self.name("w")
        array = np.abs(values).astype(np.float32) + 0.5 if positive else values.astype(np.float32)
        self.weights.append(numpy_helper.from_array(array, name))
        return name

    def const(self, values: Any, dtype: Any = np.float32) -> str:
        name = self.name("c")
        self.weights.append(numpy_helper.from_array(np.asarray(values, dtype=dtype), name))
        return name

    def op(self, kind: str, inputs: list[str], **attrs: Any) -> str:
        out = self.name(kind.lower())
        self.nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out

    def conv_bn(self, x: str, cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, act: str | None = "Relu") -> str:
        w = self.weight((cout, cin // groups, kernel, kernel))
        pad = kernel // 2
        y = self.op("Conv", [x, w], kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4, group=groups)
        y = self.op("BatchNormalization", [y, self.weight((cout,), 1.0, True), self.weight((cout,), 0.1),
                                            self.weight((cout,), 0.1), self.weight((cout,), 1.0, True)])
        if act == "Relu":
            return self.op("Relu", [y])
        if act == "Relu6":
            return self.op("Clip", [y, self.const(0.0), self.const(6.0)])
        return y

    def model(self, name: str, inputs: list[Any], outputs: list[Any]) -> Any:
        return examples.make_model(helper.make_graph(self.nodes, name, inputs, outputs, self.weights), "probtune-bench")


def _classifier(g: Graph, x: str, channels: int, classes: int = 1000) -> str:
    pooled = g.op("GlobalAveragePool", [x])
    flat = g.op("Flatten", [pooled], axis=1)
    return g.op("Gemm", [flat, g.weight((classes, channels)), g.weight((classes,), 0.01)], transB=1)


def resnet50(seed: int = 0) -> Any:
    """ResNet-50 v1.5 (the stride on the 3x3 convolution of each first bottleneck), input (N, 3, 224, 224)."""
    g = Graph(seed)
    x = g.conv_bn("input", 3, 64, 7, stride=2)
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for index in range(blocks):
            s = stride if index == 0 else 1
            y = g.conv_bn(x, cin, width, 1)
            y = g.conv_bn(y, width, width, 3, stride=s)
            y = g.conv_bn(y, width, width * 4, 1, act=None)
            shortcut = g.conv_bn(x, cin, width * 4, 1, stride=s, act=None) if index == 0 else x
            x = g.op("Relu", [g.op("Add", [y, shortcut])])
            cin = width * 4
    logits = _classifier(g, x, cin)
    return g.model("resnet50", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 224, 224])],
                   [helper.make_tensor_value_info(logits, TensorProto.FLOAT, ["N", 1000])])


def resnet18(seed: int = 0) -> Any:
    """ResNet-18 (basic blocks of two 3x3 convolutions), input (N, 3, 224, 224): a model none of probtune's defaults
    were chosen on, measured to see that what helps the three benchmark models is not fitted to them."""
    g = Graph(seed)
    x = g.conv_bn("input", 3, 64, 7, stride=2)
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for index in range(2):
            s = stride if index == 0 else 1
            y = g.conv_bn(g.conv_bn(x, cin, width, 3, stride=s), width, width, 3, act=None)
            shortcut = g.conv_bn(x, cin, width, 1, stride=s, act=None) if s != 1 or cin != width else x
            x = g.op("Relu", [g.op("Add", [y, shortcut])])
            cin = width
    logits = _classifier(g, x, cin)
    return g.model("resnet18", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 224, 224])],
                   [helper.make_tensor_value_info(logits, TensorProto.FLOAT, ["N", 1000])])


def mobilenet_v2(seed: int = 0) -> Any:
    """MobileNetV2 (width 1.0): inverted residuals with depthwise convolutions and ReLU6, input (N, 3, 224, 224)."""
    g = Graph(seed)
    x = g.conv_bn("input", 3, 32, 3, stride=2, act="Relu6")
    cin = 32
    for expand, cout, repeats, stride in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                                          (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        for index in range(repeats):
            s = stride if index == 0 else 1
            hidden = cin * expand
            y = g.conv_bn(x, cin, hidden, 1, act="Relu6") if expand != 1 else x
            y = g.conv_bn(y, hidden, hidden, 3, stride=s, groups=hidden, act="Relu6")
            y = g.conv_bn(y, hidden, cout, 1, act=None)
            x = g.op("Add", [x, y]) if s == 1 and cin == cout else y
            cin = cout
    x = g.conv_bn(x, cin, 1280, 1, act="Relu6")
    logits = _classifier(g, x, 1280)
    return g.model("mobilenet_v2", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 224, 224])],
                   [helper.make_tensor_value_info(logits, TensorProto.FLOAT, ["N", 1000])])


def _layer_norm(g: Graph, x: str, hidden: int) -> str:
    return g.op("LayerNormalization", [x, g.weight((hidden,), 0.1, True), g.weight((hidden,), 0.1)], axis=-1,
                epsilon=1e-12)


def _dense(g: Graph, x: str, cin: int, cout: int) -> str:
    return g.op("Add", [g.op("MatMul", [x, g.weight((cin, cout))]), g.weight((cout,), 0.02)])


def bert_base(seq: int = 128, layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 3072,
              vocab: int = 30522, seed: int = 0) -> Any:
    """The BERT-base encoder: embeddings (word, position, token type), ``layers`` post-norm layers; input_ids (1, seq)."""
    g = Graph(seed)
    head = hidden // heads
    words = g.op("Gather", [g.weight((vocab, hidden), 0.02), "input_ids"], axis=0)
    positions = g.const(g.rng.standard_normal((1, seq, hidden)) * 0.02)
    types = g.const(g.rng.standard_normal((hidden,)) * 0.02)
    x = _layer_norm(g, g.op("Add", [g.op("Add", [words, positions]), types]), hidden)
    split = g.const([1, seq, heads, head], np.int64)
    merged = g.const([1, seq, hidden], np.int64)
    for _ in range(layers):
        q, k, v = (g.op("Reshape", [_dense(g, x, hidden, hidden), split]) for _ in range(3))
        q = g.op("Transpose", [q], perm=[0, 2, 1, 3])
        k = g.op("Transpose", [k], perm=[0, 2, 3, 1])
        v = g.op("Transpose", [v], perm=[0, 2, 1, 3])
        scores = g.op("Div", [g.op("MatMul", [q, k]), g.const(np.sqrt(head))])
        context = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
        context = g.op("Reshape", [g.op("Transpose", [context], perm=[0, 2, 1, 3]), merged])
        x = _layer_norm(g, g.op("Add", [_dense(g, context, hidden, hidden), x]), hidden)
        h = _dense(g, x, hidden, ffn)
        gelu = g.op("Mul", [g.op("Mul", [h, g.op("Add", [g.op("Erf", [g.op("Div", [h, g.const(np.sqrt(2.0))])]),
                                                         g.const(1.0)])]), g.const(0.5)])
        x = _layer_norm(g, g.op("Add", [_dense(g, gelu, ffn, hidden), x]), hidden)
    return g.model("bert_base", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq])],
                   [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, seq, hidden])])


MODELS: dict[str, tuple[Callable[[], Any], dict[str, tuple[int, ...]]]] = {
    "resnet50": (resnet50, {"input": (1, 3, 224, 224)}),
    "resnet18": (resnet18, {"input": (1, 3, 224, 224)}),  # held out: a model the defaults were not chosen on
    "mobilenet_v2": (mobilenet_v2, {"input": (1, 3, 224, 224)}),
    "bert_base": (bert_base, {}),
    "small_cnn": (lambda: examples.small_cnn(channels=8, size=16), {"x": (1, 3, 16, 16)}),  # for a quick check
}
"""Each model's builder and the input shapes it is benchmarked at."""
