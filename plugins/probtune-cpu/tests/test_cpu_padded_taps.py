"""The padded-taps graph rewrite: the bands of outputs, the convolutions it splits and keeps, the same outputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
import tvm_ffi
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from probtune.model import fuse, load_model, tune_model
from probtune.model.rewrites import rewrite_counts
from probtune_cpu.padded_taps import MAX_WORK_SHARE, Band, PaddedTaps, bands


def dilated_conv(size: int, dilation: int, cin: int = 8, cout: int = 16) -> tvm.IRModule:
    """``relu(conv2d(x, w) + b)``, 3x3 dilated by ``dilation`` and padded as much (the output is the input's size)."""
    rng = np.random.default_rng(dilation)
    x = relax.Var("x", relax.TensorType((1, size, size, cin), "float32"))
    weight = relax.const((rng.standard_normal((3, 3, cin, cout)) * 0.1).astype("float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.conv2d(x, weight, 1, dilation, dilation, 1, data_layout="NHWC",
                                                kernel_layout="HWIO"))
            bias = relax.const(rng.standard_normal(cout).astype("float32"))
            y = builder.emit_output(relax.op.nn.relu(relax.op.add(y, bias)))
        builder.emit_func_output(y)
    return builder.get()


def run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def conv_calls(mod: tvm.IRModule) -> list[relax.Call]:
    found: list[relax.Call] = []
    tvm_ffi.structural_walk(mod["main"], (relax.Call, lambda call: found.append(call)
                                          if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d" else None))
    return found


def test_the_outputs_are_banded_by_the_taps_that_read_the_map():
    # rate 24 over 32: the first 8 outputs reach the map with taps 1-2, the middle 16 with the centre only
    assert bands(32, 32, 3, 1, 24, 24) == [Band(0, 8, 1, 2), Band(8, 24, 1, 1), Band(24, 32, 0, 1)]
    assert bands(32, 32, 3, 1, 36, 36) == [Band(0, 32, 1, 1)]  # only the centre tap ever reads the map
    assert bands(32, 32, 3, 1, 1, 1) == [Band(0, 1, 1, 2), Band(1, 31, 0, 2), Band(31, 32, 0, 1)]
    assert bands(4, 6, 3, 1, 1, 3) is None  # padded by more than the kernel reaches: an output reads only padding


@pytest.mark.parametrize("size, dilation, convolutions", [(12, 12, 1), (12, 8, 9)])
def test_a_convolution_mostly_on_padding_is_split_and_computes_the_same(size, dilation, convolutions):
    mod = dilated_conv(size, dilation)
    rewritten, count = PaddedTaps().rewrite(mod, None)
    assert count == 1
    calls = conv_calls(rewritten)
    assert len(calls) == convolutions
    macs = sum(int(np.prod([int(d) for d in c.ty.shape])) * int(np.prod([int(d) for d in c.args[1].ty.shape][:3]))
               for c in calls)
    assert macs <= MAX_WORK_SHARE * size * size * 16 * 9 * 8
    x = np.random.default_rng(1).standard_normal((1, size, size, 8)).astype("float32")
    np.testing.assert_allclose(run(rewritten, x), run(mod, x), rtol=1e-5, atol=1e-5)


def test_a_region_that_reads_the_whole_map_reads_it_without_a_copy():
    # rate 24 over 32: the four corner regions' taps reach the whole map, the other five a slice of it
    rewritten, _ = PaddedTaps().rewrite(dilated_conv(32, 24), None)
    regions = conv_calls(rewritten)
    assert len(regions) == 9
    whole = [c for c in regions if isinstance(c.args[0], relax.Var) and c.args[0].same_as(rewritten["main"].params[0])]
    assert len(whole) == 4
    x = np.random.default_rng(2).standard_normal((1, 32, 32, 8)).astype("float32")
    np.testing.assert_allclose(run(rewritten, x), run(dilated_conv(32, 24), x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("size, dilation", [(32, 1), (32, 2), (32, 8)])
def test_a_convolution_that_reads_the_map_with_most_taps_is_kept(size, dilation):
    assert PaddedTaps().rewrite(dilated_conv(size, dilation), None)[1] == 0


def _atrous_onnx(tmp_path, rates=(12, 24, 36)):
    """An atrous pyramid as DeepLabV3 has it: parallel 3x3 convolutions at wide rates over one map, concatenated."""
    rng = np.random.default_rng(0)
    nodes, weights, branches = [], [], []
    for rate in rates:
        name = f"w{rate}"
        weights.append(numpy_helper.from_array((rng.standard_normal((8, 16, 3, 3)) * 0.1).astype(np.float32), name))
        nodes += [helper.make_node("Conv", ["x", name], [f"c{rate}"], kernel_shape=[3, 3], dilations=[rate, rate],
                                   pads=[rate] * 4),
                  helper.make_node("Relu", [f"c{rate}"], [f"r{rate}"])]
        branches.append(f"r{rate}")
    nodes.append(helper.make_node("Concat", branches, ["y"], axis=1))
    graph = helper.make_graph(nodes, "aspp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8 * len(rates), 32, 32])],
                              weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "aspp.onnx"
    onnx.save(model, path)
    return path


def test_an_atrous_pyramid_is_split_and_matches_onnxruntime(tmp_path, host):
    path = _atrous_onnx(tmp_path)
    counts = rewrite_counts(fuse(load_model(path), host))
    assert counts["padded-taps"] == 3  # rates 12, 24 and 36 over 32 x 32 skip 44%, 75% and 89% of the multiplies
    compiled = tune_model(path, trials=0, database=tmp_path / "t.db").compile()
    assert compiled.check.reference == "onnxruntime"
