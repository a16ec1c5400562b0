"""probtune's lowerings before TVM's own (probtune.model.legalize): the same values as TOPI's, in fewer steps."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax, topi

import probtune
from conftest import untuned_runner
from probtune.model import extract_tasks, fuse, load_model
from probtune.model.check import check_outputs
from probtune.model.examples import make_model
from probtune.model.legalize import SEPARABLE_MODES, bilinear_upsampling, legalize
from probtune.targets import resolve_target
from probtune_cpu.host_cpu import cpu_features


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


def _bf16_max_pool() -> tvm.IRModule:
    """A channels-last 3x3, stride-2 max pool of bfloat16, as a bf16 CNN's after its stem."""
    data = relax.Var("x", relax.TensorType((1, 16, 16, 32), "bfloat16"))
    builder = relax.BlockBuilder()
    with builder.function("main", [data]):
        with builder.dataflow():
            out = builder.emit_output(relax.op.nn.max_pool2d(data, (3, 3), (2, 2), (1, 1, 1, 1), layout="NHWC"))
        builder.emit_func_output(out)
    return builder.get()


def test_a_bfloat16_max_pool_compares_in_float32_and_picks_what_tvms_picks():
    mod = _bf16_max_pool()
    x = tvm.runtime.tensor(np.random.default_rng(0).standard_normal((1, 16, 16, 32)).astype(ml_dtypes.bfloat16))
    ours, tvms = (relax.VirtualMachine(tvm.compile(lowered, target="llvm"), tvm.cpu())["main"](x).numpy()
                  for lowered in (legalize(mod), relax.transform.LegalizeOps()(mod)))
    assert ours.dtype == tvms.dtype and np.array_equal(ours.view(np.uint16), tvms.view(np.uint16))
    pool = next(func for gvar, func in legalize(mod).functions_items() if gvar.name_hint.startswith("max_pool"))
    assert "float32" in pool.script()


@pytest.mark.skipif("avx512_bf16" not in cpu_features(), reason="the host target offers no bf16 without AVX512-BF16")
def test_a_bfloat16_max_pools_vectorized_programs_build(tmp_path):
    """TVM 0.27 cannot store a vector of bfloat16 constants: a vectorized pool of its own form (its initial value)
    does not build."""
    (task,) = extract_tasks(fuse(load_model(_bf16_max_pool()), resolve_target("host")))
    result = probtune.tune(task.workload, "host", 8, database=tmp_path / "t.db", seed=0)
    assert result.best is not None and set(result.statuses) == {"ok"}, dict(result.statuses)
