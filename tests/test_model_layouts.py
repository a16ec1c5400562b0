"""A model put in the target's layouts: convolutions channels-last on CPU targets, the same results, few transposes."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax, te, topi

from conftest import untuned_runner
from probtune.model import extract_tasks, fuse, load_model
from probtune.model.check import check_outputs
from probtune.model.examples import make_model
from probtune.model.layouts import lift_elementwise_calls
from probtune.targets import resolve_target


@pytest.fixture
def relu6_onnx(tmp_path):
    """Conv -> Clip(0, 6) -> Conv, as exporters write MobileNet's ReLU6 (bounds as constant inputs)."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "w1"),
               numpy_helper.from_array(rng.standard_normal((8, 8, 1, 1)).astype(np.float32), "w2"),
               numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
               numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c1", "lo", "hi"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "relu6", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 10, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 10, 10])], weights)
    path = tmp_path / "relu6.onnx"
    onnx.save(make_model(graph), path)
    return path


def _transposes(fused: tvm.IRModule) -> int:
    """Calls of a lone transpose (one not fused into a convolution's task) in the model's main."""
    callees = re.findall(r"R\.call_tir\((\w+),", str(fused["main"]))
    return sum("transpose" in name and "conv" not in name for name in callees)


def test_cpu_convolutions_are_channels_last_and_match_onnxruntime(small_cnn_onnx):
    host = resolve_target("host")
    model = load_model(small_cnn_onnx, {"x": (1, 3, 16, 16)})
    fused = fuse(model, host)
    convs = [task for task in extract_tasks(fused) if "conv2d" in task.name]
    assert convs and all("conv2d_nhwc" in task.workload.mod.script() for task in convs)
    assert _transposes(fused) <= 2  # the input into NHWC, and once before the classifier
    check_outputs(model, untuned_runner(fused, host))


def test_a_target_without_layouts_keeps_the_models(small_cnn_onnx):
    host = dataclasses.replace(resolve_target("host"), layouts={})
    fused = fuse(load_model(small_cnn_onnx, {"x": (1, 3, 16, 16)}), host)
    convs = [task for task in extract_tasks(fused) if "conv2d" in task.name]
    assert convs and all("conv2d_nchw" in task.workload.mod.script() for task in convs)
    assert _transposes(fused) == 0


def test_a_relu6_is_fused_into_its_channels_last_convolution(relu6_onnx):
    host = resolve_target("host")
    model = load_model(relu6_onnx)
    fused = fuse(model, host)
    names = [task.name for task in extract_tasks(fused)]
    assert any("conv2d" in name and "maximum" in name and "minimum" in name for name in names), names
    assert _transposes(fused) == 2  # in and out of the model; none around the clip
    check_outputs(model, untuned_runner(fused, host))


def _module_with_call_te(compute) -> tvm.IRModule:
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    with builder.function("main", [x]):
        out = builder.emit_te(compute, x, relax.const(1.5, "float32"))
        builder.emit_func_output(out)
    return builder.get()


def test_a_call_of_exactly_a_legalized_maximum_is_lifted_to_the_operator():
    lifted = lift_elementwise_calls(_module_with_call_te(topi.maximum))
    assert "R.maximum(" in str(lifted["main"]) and "call_tir" not in str(lifted["main"])
    assert not any(isinstance(func, tvm.tirx.PrimFunc) for func in lifted.functions.values())


def test_a_call_that_only_resembles_an_operator_is_kept():
    def max_plus_one(a, b):
        return te.compute(a.shape, lambda i, j: te.max(a[i, j], b()) + 1.0, name="T_maximum")

    mod = _module_with_call_te(max_plus_one)
    assert lift_elementwise_calls(mod) is mod


def _save(tmp_path, name, nodes, weights, x_shape, y_shape):
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))], weights)
    path = tmp_path / f"{name}.onnx"
    onnx.save(make_model(graph), path)
    return path


@pytest.fixture
def detector_onnx(tmp_path):
    """What a mobile text detector has after its convolutions: hard-swish three ways (HardSwish; Add/Clip/Div/Mul;
    a squeeze-excite's HardSigmoid), SiLU, nearest resize, concatenation, batch norm and a transposed convolution."""
    rng = np.random.default_rng(0)
    weights, nodes = [], []

    def const(name, value):
        weights.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def weight(name, *shape):
        return const(name, rng.standard_normal(shape) * 0.2)

    def node(op, inputs, out, **attrs):
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    const("three", 3.0), const("six", 6.0), const("zero", 0.0), const("scales", [1, 1, 2, 2])
    const("var", np.abs(rng.standard_normal(8)) + 0.5)
    x = node("HardSwish", [node("Conv", ["x", weight("w1", 8, 3, 3, 3), weight("b1", 8)], "c1", pads=[1] * 4,
                                strides=[2, 2])], "hs1")
    c2 = node("Conv", [x, weight("w2", 16, 8, 3, 3)], "c2", pads=[1] * 4)
    hs2 = node("Mul", [c2, node("Div", [node("Clip", [node("Add", [c2, "three"], "a"), "zero", "six"], "cl"), "six"],
                                "d")], "hs2")
    squeeze = node("Relu", [node("Conv", [node("GlobalAveragePool", [hs2], "gap"), weight("ws1", 4, 16, 1, 1)], "s1")],
                   "sr")
    gate = node("HardSigmoid", [node("Conv", [squeeze, weight("ws2", 16, 4, 1, 1)], "s2")], "hsig", alpha=0.2, beta=0.5)
    se = node("Mul", [hs2, gate], "se")
    c3 = node("Conv", [se, weight("w3", 16, 16, 3, 3)], "c3", pads=[1] * 4, strides=[2, 2])
    silu = node("Mul", [c3, node("Sigmoid", [c3], "sg")], "silu")
    cat = node("Concat", [node("Resize", [silu, "", "scales"], "up", mode="nearest"), se], "cat", axis=1)
    bn = node("BatchNormalization", [node("Conv", [cat, weight("w4", 8, 32, 3, 3)], "c4", pads=[1] * 4),
                                     weight("g", 8), weight("be", 8), weight("m", 8), "var"], "bn")
    up = node("ConvTranspose", [node("Relu", [bn], "r4"), weight("wt", 8, 4, 2, 2), weight("bt", 4)], "ct",
              strides=[2, 2])
    node("Sigmoid", [up], "y")
    return _save(tmp_path, "detector", nodes, weights, (1, 3, 32, 32), (1, 4, 32, 32))


def test_a_detectors_elementwise_resize_concat_and_transposed_convolution_stay_channels_last(detector_onnx):
    host = resolve_target("host")
    model = load_model(detector_onnx)
    fused = fuse(model, host)
    names = [task.name for task in extract_tasks(fused)]
    assert _transposes(fused) == 2, names  # into the model's NCHW input's layout and out of it; none around an operator
    assert any("conv2d_transpose" in name for name in names)
    assert all("conv2d_nhwc" in task.workload.mod.script() or "conv2d" not in task.name
               for task in extract_tasks(fused) if "transpose" not in task.name)
    check_outputs(model, untuned_runner(fused, host))


@pytest.mark.parametrize(
    "attrs, groups",
    [({"strides": [2, 2]}, 1), ({"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}, 1),
     ({"strides": [3, 2], "pads": [0, 1, 2, 0], "dilations": [2, 1]}, 1), ({"strides": [2, 2], "pads": [1] * 4}, 4)],
)
def test_a_transposed_convolution_after_a_channels_last_convolution_compiles_and_matches(tmp_path, attrs, groups):
    rng = np.random.default_rng(1)
    weights = [numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "w"),
               numpy_helper.from_array(rng.standard_normal((8, 8 // groups, 3, 3)).astype(np.float32), "wt"),
               numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "bt")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4),
             helper.make_node("ConvTranspose", ["c", "wt", "bt"], ["y"], group=groups, **attrs)]
    path = _save(tmp_path, "deconv", nodes, weights, (1, 4, 7, 9), ("n", "c", "h", "w"))
    host = resolve_target("host")
    model = load_model(path)
    fused = fuse(model, host)
    assert "conv2d_transpose" in str(fused) and _transposes(fused) == 2
    check_outputs(model, untuned_runner(fused, host))


def test_a_model_tvms_layout_pass_fails_on_keeps_its_layouts_and_compiles(tmp_path):
    """TVM's ConvertLayout crashes on a Dropout's tuple (and a variadic Max): the model keeps NCHW, with a warning."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4),
             helper.make_node("Dropout", ["c"], ["d"]),
             helper.make_node("Max", ["d", "c", "x4"], ["y"])]
    graph = helper.make_graph(nodes, "dropout", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6]),
                                                 helper.make_tensor_value_info("x4", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])], weights)
    onnx.save(make_model(graph), tmp_path / "dropout.onnx")
    host = resolve_target("host")
    model = load_model(tmp_path / "dropout.onnx")
    with pytest.warns(UserWarning, match="keeps its own data layouts: TVM's ConvertLayout failed"):
        fused = fuse(model, host)
    assert all("conv2d_nchw" in task.workload.mod.script() for task in extract_tasks(fused) if "conv" in task.name)
    check_outputs(model, untuned_runner(fused, host))


def test_a_models_own_channels_last_transposes_cancel_with_the_layout_passs(tmp_path):
    """A ConvNeXt block as PyTorch exports it: Conv, Transpose to NHWC, LayerNormalization over channels, Transpose
    back, a per-channel scale and the residual add in NCHW, Conv. With the convolutions NHWC, the model's transposes
    are carried past the scale and the add and cancel with the layout pass's."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name) for name, shape in
               (("w1", (8, 3, 3, 3)), ("gamma", (8,)), ("beta", (8,)), ("scale", (8, 1, 1)), ("w2", (8, 8, 3, 3)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1] * 4),
             helper.make_node("Transpose", ["c1"], ["t1"], perm=[0, 2, 3, 1]),
             helper.make_node("LayerNormalization", ["t1", "gamma", "beta"], ["n"], axis=-1),
             helper.make_node("Transpose", ["n"], ["t2"], perm=[0, 3, 1, 2]),
             helper.make_node("Mul", ["scale", "t2"], ["s"]),
             helper.make_node("Add", ["s", "c1"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1] * 4)]
    path = _save(tmp_path, "convnext_block", nodes, weights, (1, 3, 8, 8), (1, 8, 8, 8))
    host = resolve_target("host")
    model = load_model(path)
    assert _transposes(fuse(model, dataclasses.replace(host, layouts={}))) == 2  # the model's own
    fused = fuse(model, host)
    assert _transposes(fused) == 2, [task.name for task in extract_tasks(fused)]  # into NHWC and out: none between
    check_outputs(model, untuned_runner(fused, host))


def test_a_speech_front_ends_convolutions_are_the_sequence_the_transformer_reads(tmp_path):
    """Whisper's and wav2vec2's front end: 1-D convolutions over time (the second strided), activations, then a Transpose
    to (batch, time, channels) for the transformer. With the convolutions channels-last their output already lies
    so: the model's transpose cancels with the layout pass's, and only the input is transposed."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.3, name)
               for name, shape in (("w1", (16, 8, 3)), ("w2", (16, 16, 3)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1]),
             helper.make_node("Sigmoid", ["c1"], ["g1"]),
             helper.make_node("Conv", ["g1", "w2"], ["c2"], pads=[1, 1], strides=[2]),
             helper.make_node("Relu", ["c2"], ["g2"]),
             helper.make_node("Transpose", ["g2"], ["y"], perm=[0, 2, 1])]
    path = _save(tmp_path, "speech_front_end", nodes, weights, (1, 8, 64), (1, 32, 16))
    host = resolve_target("host")
    model = load_model(path)
    fused = fuse(model, host)
    convs = [task for task in extract_tasks(fused) if "conv1d" in task.name]
    assert len(convs) == 2 and all("conv1d_nwc" in task.workload.mod.script() for task in convs)
    assert _transposes(fused) == 1  # the input into NWC only
    check_outputs(model, untuned_runner(fused, host))


def test_a_video_models_3d_convolutions_are_channels_last_and_match_onnxruntime(tmp_path):
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.3, name)
               for name, shape in (("w1", (8, 3, 3, 3, 3)), ("w2", (8, 8, 1, 3, 3)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1] * 6),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["y"], pads=[0, 1, 1, 0, 1, 1], strides=[1, 2, 2])]
    path = _save(tmp_path, "video", nodes, weights, (1, 3, 4, 8, 8), (1, 8, 4, 4, 4))
    host = resolve_target("host")
    model = load_model(path)
    fused = fuse(model, host)
    convs = [task for task in extract_tasks(fused) if "conv3d" in task.name]
    assert len(convs) == 2 and all("conv3d_ndhwc" in task.workload.mod.script() for task in convs)
    check_outputs(model, untuned_runner(fused, host))
