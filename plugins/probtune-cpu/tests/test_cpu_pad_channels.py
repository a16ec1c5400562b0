"""The pad-channels graph rewrite: which channel counts it pads, where the crops go, the same outputs, the tasks."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
import tvm_ffi
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from probtune.model import extract_tasks, fuse, load_model, tune_model
from probtune.model.examples import make_model
from probtune.model.importer import InputSpec, Model
from probtune.targets import resolve_target
from probtune_cpu.pad_channels import PadChannels, padded_channels


@pytest.fixture
def avx512():
    """A target of 16 lanes whatever this machine's: the rewrite only reads the target (the outputs run anywhere)."""
    return resolve_target("x86-avx512")


@pytest.mark.parametrize(
    ("channels", "lanes", "padded"),
    [
        (116, 16, 128), (58, 16, 64), (232, 16, 240), (1000, 16, 1008),  # whole vectors for at most an eighth more
        (36, 16, 40), (116, 8, 120),  # else half vectors
        (64, 16, 64), (24, 16, 24), (40, 16, 40),  # already whole vectors, or half ones that whole ones cost too much for
        (18, 16, 18), (3, 16, 3),  # padding would cost too much
    ],
)
def test_channels_are_padded_to_whole_vectors_where_it_costs_little(channels, lanes, padded):
    assert padded_channels(channels, lanes) == padded


def _rng_const(rng: np.random.Generator, shape: tuple[int, ...]) -> relax.Constant:
    return relax.const((rng.standard_normal(shape) * 0.2).astype("float32"))


def shuffle_unit(channels: int = 58) -> tvm.IRModule:
    """ShuffleNet's branch, channels-last: 1x1 conv, ReLU, 3x3 depthwise conv, 1x1 conv, ReLU, a squeeze-excite
    scale, a residual add and a concatenation with the input."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 8, 8, channels), "float32"))
    bias = lambda: _rng_const(rng, (1, 1, 1, channels))  # noqa: E731
    pointwise = lambda: _rng_const(rng, (1, 1, channels, channels))  # noqa: E731
    conv = relax.op.nn.conv2d
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.relu(relax.op.add(conv(x, pointwise(), data_layout="NHWC", kernel_layout="HWIO"), bias())))
            y = builder.emit(relax.op.add(conv(y, _rng_const(rng, (3, 3, 1, channels)), padding=(1, 1, 1, 1), groups=channels,
                                               data_layout="NHWC", kernel_layout="HWIO"), bias()))
            y = builder.emit(relax.op.nn.relu(relax.op.add(conv(y, pointwise(), data_layout="NHWC", kernel_layout="HWIO"), bias())))
            scale = builder.emit(relax.op.sigmoid(relax.op.mean(y, axis=[1, 2], keepdims=True)))
            y = builder.emit(relax.op.add(relax.op.multiply(y, scale), y))
            y = builder.emit(relax.op.divide(y, relax.const(np.full((channels,), 2.0, "float32"))))
            y = builder.emit_output(relax.op.concat([x, y], axis=3))
        builder.emit_func_output(y)
    return builder.get()


def run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def _calls(mod: tvm.IRModule, name: str) -> list[relax.Call]:
    found: list[relax.Call] = []
    tvm_ffi.structural_walk(
        mod["main"], (relax.Call, lambda call: found.append(call) if getattr(call.op, "name", None) == name else None)
    )
    return found


def test_a_branch_runs_padded_from_its_first_convolution_to_the_concatenation(avx512):
    mod = shuffle_unit()
    rewritten, count = PadChannels().rewrite(mod, avx512)
    assert count > 0
    convs = _calls(rewritten, "relax.nn.conv2d")
    assert [int(c.ty.shape[-1]) for c in convs] == [64, 64, 64]  # each convolution writes whole vectors
    assert [int(c.args[0].ty.shape[-1]) for c in convs] == [58, 64, 64]  # and reads the padded tensor whole
    assert int(convs[1].attrs.groups) == 64  # the depthwise one has zero channels of its own
    (crop,) = _calls(rewritten, "relax.strided_slice")  # the one crop is left before the concatenation
    assert [int(d) for d in crop.ty.shape] == [1, 8, 8, 58]
    x = np.random.default_rng(1).standard_normal((1, 8, 8, 58)).astype("float32")
    np.testing.assert_allclose(run(rewritten, x), run(mod, x), rtol=1e-5, atol=1e-5)


def test_a_grouped_convolution_reads_the_added_channels_as_groups_of_its_own(avx512):
    """RegNet's 104 channels in groups of 8, padded to 112: fourteen groups, the last with a zero kernel."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 6, 6, 16), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.conv2d(x, _rng_const(rng, (1, 1, 16, 104)), data_layout="NHWC", kernel_layout="HWIO"))
            y = builder.emit_output(relax.op.nn.conv2d(y, _rng_const(rng, (3, 3, 8, 104)), padding=(1, 1, 1, 1), groups=13,
                                                       data_layout="NHWC", kernel_layout="HWIO"))
        builder.emit_func_output(y)
    mod = builder.get()
    rewritten, _ = PadChannels().rewrite(mod, avx512)
    grouped = _calls(rewritten, "relax.nn.conv2d")[1]
    assert (int(grouped.attrs.groups), int(grouped.ty.shape[-1])) == (14, 112)
    x_value = np.random.default_rng(1).standard_normal((1, 6, 6, 16)).astype("float32")
    np.testing.assert_allclose(run(rewritten, x_value), run(mod, x_value), rtol=1e-5, atol=1e-5)


def test_a_variable_divisor_keeps_its_crop(avx512):
    """Padded channels may be zero: a padded tensor is never a divisor, so its crop stays before the division."""
    x = relax.Var("x", relax.TensorType((1, 4, 4, 16), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.conv2d(x, _rng_const(np.random.default_rng(0), (1, 1, 16, 58)),
                                                data_layout="NHWC", kernel_layout="HWIO"))
            y = builder.emit_output(relax.op.divide(relax.const(1.0), relax.op.add(relax.op.abs(y), relax.const(1.0))))
        builder.emit_func_output(y)
    mod = builder.get()
    rewritten, _ = PadChannels().rewrite(mod, avx512)
    (divide,) = _calls(rewritten, "relax.divide")
    assert int(divide.ty.shape[-1]) == 58
    x_value = np.random.default_rng(1).standard_normal((1, 4, 4, 16)).astype("float32")
    np.testing.assert_allclose(run(rewritten, x_value), run(mod, x_value), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("channels", [64, 18])
def test_channels_that_need_no_padding_or_too_much_are_kept(channels, avx512):
    mod = shuffle_unit(channels)
    rewritten, count = PadChannels().rewrite(mod, avx512)
    assert count == 0
    assert tvm_ffi.structural_equal(rewritten, mod)


def test_the_padded_convolutions_are_the_tasks(avx512):
    model = Model("unit", shuffle_unit(), (InputSpec("x", (1, 8, 8, 58), "float32"),))
    fused = fuse(model, avx512)
    widths = {int(p.ty.shape[-1]) for task in extract_tasks(fused) for p in task.workload.mod["main"].params
              if "conv2d" in task.name and len(p.ty.shape) == 4}
    assert 64 in widths


@pytest.fixture
def shuffle_onnx(tmp_path):
    """Conv 1x1 (16 -> 58, bias) -> Relu -> depthwise Conv 3x3 -> Concat with a second Conv's 58 channels: NCHW, as
    PyTorch exports it."""
    rng = np.random.default_rng(0)
    w = lambda name, shape: numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)  # noqa: E731
    weights = [w("w1", (58, 16, 1, 1)), w("b1", (58,)), w("w2", (58, 1, 3, 3)), w("w3", (58, 16, 1, 1))]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], group=58, pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "w3"], ["c3"]),
        helper.make_node("Concat", ["c2", "c3"], ["y"], axis=1),
    ]
    graph = helper.make_graph(nodes, "shuffle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 116, 8, 8])], weights)
    path = tmp_path / "shuffle.onnx"
    onnx.save(make_model(graph), path)
    return path


def test_a_tuned_padded_model_matches_onnxruntime(shuffle_onnx, tmp_path):
    """58 channels are padded to 64 for vectors of 16 lanes and of 8 alike."""
    result = tune_model(load_model(shuffle_onnx), "host", trials=8, database=tmp_path / "db.sqlite", seed=0,
                        batch_size=4)
    assert result.graph_rewrites["pad-channels"] > 0
    compiled = result.compile()
    assert compiled.check is not None and "match onnxruntime" in str(compiled.check)
