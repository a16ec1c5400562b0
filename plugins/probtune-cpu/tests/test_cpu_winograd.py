"""The winograd-conv2d graph rewrite: its matrices, the convolutions it takes and keeps, the same outputs, the tasks."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
import tvm_ffi
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from probtune.cli import main
from probtune.model import extract_tasks, fuse, load_model, tune_model
from probtune.model.examples import make_model
from probtune.model.importer import InputSpec, Model
from probtune.model.precision import convert_precision
from probtune.model.rewrites import rewrite_counts
from probtune_cpu.winograd import WinogradConv2D, winograd_matrices


def conv_module(
    shape: tuple[int, int, int, int], cout: int, *, padding: tuple[int, ...] = (1, 1, 1, 1), strides=(1, 1),
    dilation=(1, 1), groups: int = 1, kernel: int = 3, constant_weight: bool = True, layout: str = "NHWC",
) -> tvm.IRModule:
    """``relu(conv2d(x, w) + b)`` with a constant bias (and weight, unless asked otherwise)."""
    rng = np.random.default_rng(0)
    channels = shape[3] if layout == "NHWC" else shape[1]
    kernel_layout = "HWIO" if layout == "NHWC" else "OIHW"
    w_shape = (kernel, kernel, channels // groups, cout) if layout == "NHWC" else (cout, channels // groups, kernel, kernel)
    weight_value = (rng.standard_normal(w_shape) * 0.1).astype("float32")
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    params = [x]
    if constant_weight:
        weight = relax.const(weight_value)
    else:
        weight = relax.Var("w", relax.TensorType(w_shape, "float32"))
        params.append(weight)
    builder = relax.BlockBuilder()
    with builder.function("main", params):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.conv2d(x, weight, strides, padding, dilation, groups,
                                                data_layout=layout, kernel_layout=kernel_layout))
            bias = relax.const(rng.standard_normal(cout).astype("float32"))
            y = builder.emit_output(relax.op.nn.relu(relax.op.add(y, bias) if layout == "NHWC" else y))
        builder.emit_func_output(y)
    return builder.get()


def run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.parametrize("tile", [2, 4])
def test_the_matrices_compute_a_correlation(tile):
    a_t, b_t, g = winograd_matrices(tile)
    rng = np.random.default_rng(tile)
    d, w = rng.standard_normal(tile + 2), rng.standard_normal(3)
    expected = [d[i : i + 3] @ w for i in range(tile)]
    np.testing.assert_allclose(a_t @ ((g @ w) * (b_t @ d)), expected, rtol=1e-12, atol=1e-12)


def test_too_large_a_tile_is_refused():
    with pytest.raises(ValueError, match="interpolation points"):
        winograd_matrices(8)


@pytest.mark.parametrize(
    ("shape", "cout", "padding", "tile"),
    [
        ((1, 16, 16, 64), 64, (1, 1, 1, 1), 4),  # sixteen whole 4x4 tiles
        ((1, 14, 14, 128), 96, (1, 1, 1, 1), 4),  # 4x4 tiles cropped at the edges
        ((2, 7, 9, 256), 256, (1, 0, 2, 1), 2),  # two images, uneven padding: 4x4 tiles would be too few
    ],
)
def test_rewritten_convolutions_give_the_direct_results(shape, cout, padding, tile, host):
    mod = conv_module(shape, cout, padding=padding)
    rewritten, count = WinogradConv2D().rewrite(mod, host)
    assert count == 1
    assert not any(_ops(rewritten, "relax.nn.conv2d"))
    (packed,) = [var for var, value in _bindings(rewritten) if "winograd_data_pack" in str(value.args[0])]
    assert int(packed.ty.shape[0]) == (tile + 2) ** 2
    x = np.random.default_rng(1).standard_normal(shape).astype("float32")
    expected, got = run(mod, x), run(rewritten, x)
    scale = float(np.sqrt(np.mean(expected**2)))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * scale)


@pytest.mark.parametrize(
    "options",
    [
        {"strides": (2, 2)},
        {"dilation": (2, 2)},
        {"groups": 2},
        {"kernel": 1, "padding": (0, 0, 0, 0)},
        {"constant_weight": False},  # a kernel known only at run time would be transformed on every call
        {"layout": "NCHW"},
    ],
)
def test_convolutions_it_does_not_apply_to_are_kept(options, host):
    assert WinogradConv2D().rewrite(conv_module((1, 16, 16, 64), 64), host)[1] == 1  # as it is, it would be rewritten
    shape = (1, 64, 16, 16) if options.get("layout") == "NCHW" else (1, 16, 16, 64)
    mod = conv_module(shape, 64, **options)
    rewritten, count = WinogradConv2D().rewrite(mod, host)
    assert count == 0
    assert tvm_ffi.structural_equal(rewritten, mod)


@pytest.mark.parametrize(
    ("shape", "cout"),
    [
        ((1, 56, 56, 16), 16),  # the dense transforms would cost about what the product saves
        ((1, 56, 56, 16), 64),  # few channels in: the passes over the transformed tensors cost more than it saves
        ((1, 13, 13, 64), 256),  # 4x4 tiles over a 13x13 output compute 256 outputs for 169
        ((1, 4, 4, 256), 256),  # four 2x2 tiles, too few to read the transformed kernel for
    ],
)
def test_convolutions_with_few_channels_or_small_outputs_are_kept(shape, cout, host):
    assert WinogradConv2D().rewrite(conv_module(shape, cout), host)[1] == 0


def test_lifted_limits_rewrite_what_the_rule_keeps(host):
    """A benchmark times the Winograd form where the rule would not take it: the limits are the rewrite's own."""
    mod = conv_module((1, 56, 56, 16), 64)
    assert WinogradConv2D().rewrite(mod, host)[1] == 0
    assert WinogradConv2D(max_work_ratio=1.0, min_channel_mean=0).rewrite(mod, host)[1] == 1
    too_few_tiles = conv_module((1, 4, 4, 256), 256)
    assert WinogradConv2D(max_work_ratio=1.0, min_channel_mean=0).rewrite(too_few_tiles, host)[1] == 0


def _changed(counts: dict[str, int]) -> dict[str, int]:
    """The rewrites that changed something (a host with VNNI also runs pad-vnni-channels)."""
    return {name: count for name, count in counts.items() if count}


def _model(mod: tvm.IRModule) -> Model:
    shape = tuple(int(d) for d in mod["main"].params[0].ty.shape)
    return Model("conv", mod, (InputSpec("x", shape, "float32"),))


def test_a_rewritten_convolution_is_three_tasks_with_the_epilogue_fused(host):
    fused = fuse(_model(conv_module((1, 16, 16, 64), 64)), host)
    assert _changed(rewrite_counts(fused)) == {"winograd-conv2d": 1}  # the host's other rewrites change nothing
    names = sorted(task.name for task in extract_tasks(fused))
    assert len(names) == 3, names
    assert any(name.startswith("winograd_data_pack") for name in names)  # padding inside
    assert any("matmul" in name for name in names)
    assert any(name.startswith("fused_winograd_inverse_add_relu") for name in names)  # bias and ReLU fused in


def test_it_can_be_turned_off(host):
    kept = fuse(_model(conv_module((1, 16, 16, 64), 64)), host, rewrites=())
    assert rewrite_counts(kept) == {}
    assert [task.name for task in extract_tasks(kept)] == ["fused_conv2d_add_relu"]


@pytest.fixture
def conv_onnx(tmp_path):
    """Conv 3x3 (64 -> 64, with bias) -> Relu on a 16x16 image: a convolution the rewrite takes."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((64, 64, 3, 3)) * 0.05).astype(np.float32), "w"),
               numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 16, 16])], weights)
    path = tmp_path / "conv.onnx"
    onnx.save(make_model(graph), path)
    return path


def test_tune_model_says_what_it_rewrote(conv_onnx, tmp_path, capsys):
    args = ["tune-model", str(conv_onnx), "--trials", "0", "--confirm", "0"]
    assert main([*args, "--database", str(tmp_path / "a.db")]) == 0
    out = capsys.readouterr().out
    assert "graph rewrite winograd-conv2d: 1 operators rewritten" in out and "winograd_data_pack" in out
    assert main([*args, "--database", str(tmp_path / "b.db"), "--graph-rewrites", ""]) == 0
    out = capsys.readouterr().out
    assert "graph rewrite" not in out and "winograd" not in out and "conv2d" in out


def test_a_tuned_winograd_model_matches_onnxruntime(conv_onnx, tmp_path):
    result = tune_model(load_model(conv_onnx), "host", trials=12, database=tmp_path / "db.sqlite", seed=0, batch_size=4)
    assert _changed(result.graph_rewrites) == {"winograd-conv2d": 1}
    assert {row.program for row in result.tasks} == {"tuned"}
    assert sum("winograd" in row.name for row in result.tasks) == 2  # with the batch matmul: the transposes are the rest
    compiled = result.compile()
    assert compiled.check is not None and "match onnxruntime" in str(compiled.check)


def _bindings(mod: tvm.IRModule) -> list[tuple[relax.Var, relax.Call]]:
    return [(b.var, b.value) for block in mod["main"].body.blocks for b in block.bindings if isinstance(b.value, relax.Call)]


def _ops(mod: tvm.IRModule, name: str) -> list[relax.Call]:
    found: list[relax.Call] = []
    tvm_ffi.structural_walk(
        mod["main"], (relax.Call, lambda call: found.append(call) if getattr(call.op, "name", None) == name else None)
    )
    return found


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_convolution_that_sums_narrow_operands_in_float32_keeps_the_direct_form(precision, host):
    """A float16 or bfloat16 model's convolutions sum in float32: the transforms would round in the narrow type (and
    the rewrite, typing them so, broke every CNN with such convolutions at import)."""
    mod = convert_precision(conv_module((1, 16, 16, 64), 64), precision)
    rewritten, count = WinogradConv2D().rewrite(mod, host)
    assert count == 0 and tvm_ffi.structural_equal(rewritten, mod)


def test_a_float16_model_with_such_convolutions_compiles_and_matches_onnxruntime(conv_onnx, tmp_path):
    result = tune_model(load_model(conv_onnx), "host", trials=0, database=tmp_path / "db.sqlite", precision="fp16")
    assert "winograd-conv2d" not in _changed(result.graph_rewrites)
    compiled = result.compile()
    assert compiled.check is not None and "match onnxruntime" in str(compiled.check)
