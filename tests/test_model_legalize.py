"""probtune's lowerings before TVM's own (probtune.model.legalize): the same values as TOPI's, in fewer steps."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax, topi

from conftest import untuned_runner
from probtune.model import extract_tasks, fuse, load_model
from probtune.model.check import check_outputs
from probtune.model.examples import make_model
from probtune.model.legalize import SEPARABLE_MODES, bilinear_upsampling
from probtune.targets import resolve_target


def _run(compute, x: np.ndarray) -> np.ndarray:
    data = relax.Var("x", relax.TensorType(x.shape, "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [data]):
        with builder.dataflow():
            out = builder.emit_output(builder.emit_te(compute, data))
        builder.emit_func_output(out)
    vm = relax.VirtualMachine(tvm.compile(builder.get(), target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.parametrize("mode", SEPARABLE_MODES)
@pytest.mark.parametrize(("layout", "shape", "size"), [
    ("NCHW", (1, 3, 5, 7), (11, 13)), ("NHWC", (2, 5, 7, 3), (16, 9)), ("NCHW", (1, 2, 4, 4), (9, 3)),
])
def test_a_bilinear_upsampling_in_two_passes_is_topis_value_for_value(mode, layout, shape, size):
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    ours = _run(lambda d: bilinear_upsampling(d, size, layout, mode), x)
    topis = _run(lambda d: topi.image.resize2d(d, [0.0] * 4, size, layout, "linear", mode), x)
    np.testing.assert_array_equal(ours, topis)


@pytest.mark.parametrize(("size", "two_passes"), [(16, True), (4, False)])
def test_a_models_bilinear_upsampling_is_lowered_in_two_passes_and_matches_onnxruntime(tmp_path, size, two_passes):
    """A segmentation head: a convolution, then a bilinear Resize to the output's size. Upsampled, the resize is
    the two passes; downsampled, TVM's own lowering."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
               numpy_helper.from_array(np.array([1, 4, size, size]), "sizes")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4),
             helper.make_node("Resize", ["c", "", "", "sizes"], ["y"], mode="linear")]
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, size, size])], weights)
    path = tmp_path / "head.onnx"
    onnx.save(make_model(graph), path)
    model = load_model(path)
    host = resolve_target("host")
    fused = fuse(model, host)
    scripts = [task.workload.mod.script() for task in extract_tasks(fused) if "resize" in task.name]
    assert len(scripts) == 1 and ('"resize_width"' in scripts[0]) == two_passes
    check_outputs(model, untuned_runner(fused, host))


@pytest.mark.parametrize(("exponent", "products"), [
    (np.float32(3.0), True), (np.array([2.0], np.float32), True), (np.float32(1.0), True),
    (np.float32(2.5), False), (np.float32(5.0), False),
])
def test_a_power_by_a_small_integer_constant_is_a_product_and_matches_onnxruntime(tmp_path, capfd, exponent, products):
    """A tanh-GELU's cube: ``x ** 3`` as ``x * x * x``, without TVM's warning about ``pow`` of a negative base at each
    call site; other exponents keep ``pow``."""
    nodes = [helper.make_node("Pow", ["x", "c"], ["p"]), helper.make_node("Add", ["p", "x"], ["y"])]
    graph = helper.make_graph(nodes, "cube", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
                              [numpy_helper.from_array(np.asarray(exponent), "c")])
    path = tmp_path / "cube.onnx"
    onnx.save(make_model(graph), path)
    model = load_model(path)
    host = resolve_target("host")
    capfd.readouterr()
    fused = fuse(model, host)
    (script,) = [task.workload.mod.script() for task in extract_tasks(fused)]
    assert ("T.pow" in script) != products
    if products:
        assert "Detected pow" not in capfd.readouterr().err
    check_outputs(model, untuned_runner(fused, host))


def test_a_gather_clamps_a_computed_index_out_of_range():
    """An ONNX Gather's take ("fast": TVM reads whatever memory an index points to, and TOPI warns at each call) is
    lowered with its indices clamped to the table, by the lowering TVM's passes look up (constant folding's too)."""
    table = np.arange(12, dtype="float32").reshape(4, 3)
    index = relax.Var("i", relax.TensorType((3,), "int64"))
    builder = relax.BlockBuilder()
    with builder.function("main", [index]):
        with builder.dataflow():
            shifted = builder.emit(relax.op.add(index, relax.const(2, "int64")))
            out = builder.emit_output(relax.op.take(relax.const(table), shifted, axis=0, mode="fast"))
        builder.emit_func_output(out)
    lowered = relax.transform.LegalizeOps()(builder.get())
    assert "T.min" in lowered["take"].script() and "T.max" in lowered["take"].script()
    vm = relax.VirtualMachine(tvm.compile(lowered, target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(np.array([0, 1, 5], dtype="int64"))).numpy()
    np.testing.assert_array_equal(got, table[[2, 3, 3]])
