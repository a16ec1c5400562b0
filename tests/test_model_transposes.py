"""Transposes carried forward past layout-agnostic operators and joined (probtune.model.transposes)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from conftest import untuned_runner
from probtune.model import fuse, load_model
from probtune.model.check import check_outputs
from probtune.model.examples import make_model
from probtune.model.layouts import convert_layouts
from probtune.model.transposes import reshape_groups, transposed_elements
from probtune.targets import resolve_target


@pytest.mark.parametrize(("before", "after", "groups"), [
    ((1, 116, 28, 28), (1, 2, 58, 28, 28), [([0], [0]), ([1], [1, 2]), ([2], [3]), ([3], [4])]),
    ((1, 58, 2, 28, 28), (1, 116, 28, 28), [([0], [0]), ([1, 2], [1]), ([3], [2]), ([4], [3])]),
    ((1, 8, 4, 4), (1, 8, 16), [([0], [0]), ([1], [1]), ([2, 3], [2])]),
    ((6, 1), (6,), [([0, 1], [0])]),
    ((6,), (2, 3, 1), [([0], [0, 1, 2])]),
    ((4, 6), (3, 8), [([0, 1], [0, 1])]),  # axes that straddle each other's bounds make one group
])
def test_a_reshape_is_grouped_into_the_smallest_runs_of_equal_size(before, after, groups):
    assert reshape_groups(before, after) == groups


@pytest.mark.parametrize(("before", "after"), [((4, 6), (5, 5)), ((6,), (7,)), ((6, 2), (6,))])
def test_shapes_of_different_sizes_have_no_groups(before, after):
    assert reshape_groups(before, after) is None


def _model(tmp_path, name, nodes, weights, inputs, outputs):
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in outputs]
    path = tmp_path / f"{name}.onnx"
    onnx.save(make_model(helper.make_graph(nodes, name, info, outs, weights)), path)
    return load_model(path)


def _const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _permutes(mod: tvm.IRModule) -> list[list[int]]:
    """The shapes of the data transposes of ``mod``'s main (the weights' are folded away as constants)."""
    found = []
    for binding in mod["main"].body.blocks[0].bindings:
        value = binding.value
        if isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.permute_dims":
            if not isinstance(value.args[0], tvm.ir.expr.Constant):
                found.append([int(d) for d in value.ty.shape])
    return found


def test_a_channel_shuffle_is_done_channels_last_and_matches_onnxruntime(tmp_path):
    """ShuffleNet's unit as torchvision exports it: Concat, Reshape into groups, Transpose, Reshape back, then
    Slices that feed a convolution and the next Concat, and a convolution. With the convolutions NHWC, the shuffle is a transpose of
    the channels' groups in NHWC, and no transpose is left between the convolutions."""
    rng = np.random.default_rng(0)
    weights = [_const("w1", rng.standard_normal((4, 4, 3, 3)).astype(np.float32)),
               _const("w2", rng.standard_normal((4, 4, 1, 1)).astype(np.float32)),
               _const("w3", rng.standard_normal((8, 8, 1, 1)).astype(np.float32)),
               _const("shape5", np.array([1, 2, 4, 6, 6])), _const("shape4", np.array([1, 8, 6, 6])),
               _const("zero", np.array([0])), _const("four", np.array([4])), _const("eight", np.array([8])),
               _const("one", np.array([1]))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1] * 4),
             helper.make_node("Conv", ["c1", "w2"], ["c0"]),
             helper.make_node("Relu", ["c0"], ["r"]),
             helper.make_node("Concat", ["c1", "r"], ["cat"], axis=1),
             helper.make_node("Reshape", ["cat", "shape5"], ["g"]),
             helper.make_node("Transpose", ["g"], ["t"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["t", "shape4"], ["s"]),
             helper.make_node("Slice", ["s", "zero", "four", "one"], ["left"]),
             helper.make_node("Slice", ["s", "four", "eight", "one"], ["right"]),
             helper.make_node("Conv", ["right", "w2"], ["c2"]),
             helper.make_node("Concat", ["left", "c2"], ["cat2"], axis=1),
             helper.make_node("Conv", ["cat2", "w3"], ["y"])]
    model = _model(tmp_path, "shuffle", nodes, weights, [("x", (1, 4, 6, 6))], [("y", (1, 8, 6, 6))])
    host = resolve_target("host")
    shapes = _permutes(convert_layouts(model.mod, host.layouts))
    assert shapes == [[1, 6, 6, 4], [1, 6, 6, 4, 2], [1, 8, 6, 6]]  # into NHWC, the shuffle, out of NHWC
    check_outputs(model, untuned_runner(fuse(model, host), host))


def test_a_channels_last_convolution_flattened_to_tokens_needs_no_transpose(tmp_path):
    """A vision transformer's patch embedding: Conv, Reshape to (N, C, tokens), Transpose to (N, tokens, C). In
    NHWC the convolution's output is already tokens by channels: the reshape reads it as it lies."""
    rng = np.random.default_rng(0)
    weights = [_const("w", rng.standard_normal((8, 3, 2, 2)).astype(np.float32)),
               _const("shape", np.array([1, 8, 16]))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2]),
             helper.make_node("Reshape", ["c", "shape"], ["f"]),
             helper.make_node("Transpose", ["f"], ["y"], perm=[0, 2, 1])]
    model = _model(tmp_path, "patches", nodes, weights, [("x", (1, 3, 8, 8))], [("y", (1, 16, 8))])
    host = resolve_target("host")
    assert _permutes(convert_layouts(model.mod, host.layouts)) == [[1, 8, 8, 3]]  # the input into NHWC only
    check_outputs(model, untuned_runner(fuse(model, host), host))


def test_a_transpose_that_would_only_move_is_left_where_the_model_has_it(tmp_path):
    """Attention's heads merged back (Transpose, then Reshape of the heads and their width) after a MatMul: carried
    past the reshape, the transpose would be done in two parts, neither of which meets another transpose; the
    model keeps its one."""
    rng = np.random.default_rng(0)
    weights = [_const("w", rng.standard_normal((4, 3, 1, 1)).astype(np.float32)),
               _const("m", rng.standard_normal((4, 4)).astype(np.float32)), _const("shape", np.array([1, 16, 8]))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("MatMul", ["h", "m"], ["a"]),
             helper.make_node("Transpose", ["a"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["t", "shape"], ["y"])]
    model = _model(tmp_path, "heads", nodes, weights, [("x", (1, 3, 4, 4)), ("h", (1, 2, 16, 4))],
                   [("c", (1, 4, 4, 4)), ("y", (1, 16, 8))])
    host = resolve_target("host")
    converted = convert_layouts(model.mod, host.layouts)
    assert sorted(_permutes(converted)) == [[1, 4, 4, 3], [1, 4, 4, 4], [1, 16, 2, 4]]
    assert transposed_elements(converted) == 48 + 64 + 128
    check_outputs(model, untuned_runner(fuse(model, host), host))


def test_a_fold_that_fails_leaves_the_layout_passs_transposes_with_a_warning(small_cnn_onnx, monkeypatch):
    from probtune.model import layouts

    def refuse(mod):
        raise tvm.error.InternalError("a rewritten call TVM refuses")

    monkeypatch.setattr(layouts, "fold_transposes", refuse)
    host = resolve_target("host")
    model = load_model(small_cnn_onnx, {"x": (1, 3, 16, 16)})
    with pytest.warns(UserWarning, match="transposes are left where the layout pass put them"):
        fused = fuse(model, host)
    check_outputs(model, untuned_runner(fused, host))


@pytest.mark.parametrize(("size", "mode", "transposed"), [
    (16, "linear", [[1, 8, 8, 3], [1, 4, 8, 8]]),  # upsampled in two passes: laid out back before, on the smaller side
    (4, "linear", [[1, 8, 8, 3], [1, 4, 4, 4]]),  # shrunk: laid out back after it
    (16, "nearest", [[1, 8, 8, 3], [1, 4, 16, 16]]),  # not two passes: left after it, where the layout pass put it
])
def test_a_bilinear_upsampling_at_the_output_is_laid_out_back_before_it(tmp_path, size, mode, transposed):
    """A segmentation head: a convolution, then a Resize to the output's size. The convolution's output is NHWC,
    the model's NCHW; the transpose between them is done before a bilinear upsampling (two passes, whole rows in
    either layout), after any other resize."""
    rng = np.random.default_rng(0)
    weights = [_const("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32)),
               _const("sizes", np.array([1, 4, size, size]))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4),
             helper.make_node("Resize", ["c", "", "", "sizes"], ["y"], mode=mode)]
    model = _model(tmp_path, "head", nodes, weights, [("x", (1, 3, 8, 8))], [("y", (1, 4, size, size))])
    host = resolve_target("host")
    assert _permutes(convert_layouts(model.mod, host.layouts)) == transposed
    check_outputs(model, untuned_runner(fuse(model, host), host))


def test_tokens_laid_out_channels_first_upsampled_and_concatenated_need_no_transpose(tmp_path):
    """SegFormer's decode head: token maps (N, H x W, C) of two sizes reshaped to (N, H, W, C) and transposed
    channels first by the model, upsampled to one size, concatenated and fed to a convolution. Carried past the
    resizes and the concatenation, the model's transposes meet the layout pass's into NHWC and cancel."""
    rng = np.random.default_rng(0)
    weights = [_const("w", rng.standard_normal((4, 6, 1, 1)).astype(np.float32)),
               _const("hw8", np.array([1, 8, 8, 3])), _const("hw4", np.array([1, 4, 4, 3])),
               _const("sizes", np.array([1, 3, 16, 16]))]
    nodes = [helper.make_node("Reshape", ["a", "hw8"], ["a4"]), helper.make_node("Reshape", ["b", "hw4"], ["b4"]),
             helper.make_node("Transpose", ["a4"], ["at"], perm=[0, 3, 1, 2]),
             helper.make_node("Transpose", ["b4"], ["bt"], perm=[0, 3, 1, 2]),
             helper.make_node("Resize", ["at", "", "", "sizes"], ["ar"], mode="linear"),
             helper.make_node("Resize", ["bt", "", "", "sizes"], ["br"], mode="linear"),
             helper.make_node("Concat", ["ar", "br"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "w"], ["c"]),
             helper.make_node("Relu", ["c"], ["y"])]
    model = _model(tmp_path, "decode_head", nodes, weights, [("a", (1, 64, 3)), ("b", (1, 16, 3))],
                   [("y", (1, 4, 16, 16))])
    host = resolve_target("host")
    assert _permutes(convert_layouts(model.mod, host.layouts)) == [[1, 4, 16, 16]]  # the output's, out of NHWC
    check_outputs(model, untuned_runner(fuse(model, host), host))
