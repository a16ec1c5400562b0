"""An elementwise step that only a row reduction reads is computed inside the reduction's function."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from conftest import called_primfuncs, fused_ops, valid_samples
from probtune.model import extract_tasks, fuse, load_model, tune_model
from probtune.model.reduction_inputs import REDUCTION_INPUTS, is_row_reduction, reduction_inputs
from probtune.model.rewrites import REWRITES_ATTR
from probtune.space.space_generator import generate_space
from probtune.targets import resolve_target

pytestmark = pytest.mark.filterwarnings("ignore")


def _rms_norm(square_is_an_output: bool) -> tvm.IRModule:
    """``x / sqrt(mean(x * x) + eps)`` over rows of ``x`` (4, 16), as exporters write an RMS norm; the square is also
    returned when ``square_is_an_output``."""
    x = relax.Var("x", relax.TensorType((4, 16), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            square = builder.emit(relax.op.multiply(x, x))
            mean = builder.emit(relax.op.mean(square, axis=[-1], keepdims=True))
            scale = relax.op.divide(relax.const(1.0, "float32"), relax.op.sqrt(relax.op.add(mean, relax.const(1e-5, "float32"))))
            normed = builder.emit(relax.op.multiply(x, scale))
            result = builder.emit_output(relax.Tuple([normed, square]) if square_is_an_output else normed)
        builder.emit_func_output(result)
    return builder.get()


@pytest.mark.parametrize("square_is_an_output", [False, True])
def test_a_square_only_the_mean_reads_is_computed_in_the_means_function(square_is_an_output):
    """TVM's FuseOps leaves the square a call of its own (a mean has a product's pattern); joined, the norm is one
    call. A square the model also returns stays a call (joining it would compute it twice)."""
    grouped = fused_ops(_rms_norm(square_is_an_output))
    assert "multiply" in called_primfuncs(relax.transform.FuseTIR()(grouped))
    rewritten, count = reduction_inputs(grouped)
    fused = relax.transform.FuseTIR()(rewritten)
    assert count == (0 if square_is_an_output else 1)
    assert len(called_primfuncs(fused)) == (2 if square_is_an_output else 1)
    x = np.random.default_rng(0).standard_normal((4, 16)).astype("float32")
    vm = relax.VirtualMachine(tvm.compile(fused, target="llvm"), tvm.cpu())
    result = vm["main"](tvm.runtime.tensor(x))
    normed = (result[0] if square_is_an_output else result).numpy()
    np.testing.assert_allclose(normed, x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5), rtol=1e-5)


def test_a_product_is_no_row_reduction_and_keeps_its_input_apart():
    """An elementwise step before a matmul stays a call: a product's operands are tiled, not computed in its reads."""
    x = relax.Var("x", relax.TensorType((8, 8), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            result = builder.emit_output(relax.op.matmul(relax.op.exp(x), x))
        builder.emit_func_output(result)
    grouped = fused_ops(builder.get())
    products = [gv for gv in grouped.get_global_vars() if "matmul" in gv.name_hint]
    assert products and not any(is_row_reduction(grouped, gv) for gv in products)
    rewritten, count = reduction_inputs(grouped)
    assert count == 0 and rewritten.same_as(grouped)


def _rms_norm_onnx(tmp_path) -> str:
    """A projection, an RMS norm as PyTorch exports Llama's (Pow, ReduceMean, Add, Sqrt, Div, Mul) and another one."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(array.astype(np.float32), name) for name, array in (
        ("w1", rng.standard_normal((32, 64)) / 6), ("w2", rng.standard_normal((64, 32)) / 8),
        ("g", 1 + rng.standard_normal(64) / 10), ("two", np.array(2.0)), ("eps", np.array(1e-6)), ("one", np.array(1.0)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Pow", ["h", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["var"]),
             helper.make_node("Sqrt", ["var"], ["rms"]),
             helper.make_node("Div", ["one", "rms"], ["inv"]),
             helper.make_node("Mul", ["h", "inv"], ["normed"]),
             helper.make_node("Mul", ["normed", "g"], ["scaled"]),
             helper.make_node("MatMul", ["scaled", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "rms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 32])], weights)
    path = tmp_path / "rms.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return str(path)


def test_an_exported_rms_norm_is_one_task_that_matches_onnxruntime(tmp_path):
    path = _rms_norm_onnx(tmp_path)
    fused = fuse(load_model(path), resolve_target("host"))
    assert dict(fused.attrs[REWRITES_ATTR]).get(REDUCTION_INPUTS) == 1
    assert not any(name.startswith("power") for name in called_primfuncs(fused))
    compiled = tune_model(path, trials=0, database=tmp_path / "t.db").compile()
    assert compiled.check.reference == "onnxruntime"


def test_an_exported_rms_norm_in_fp16_builds_for_cuda(tmp_path):
    """Each task's space draws a program that builds; the joined norm's is one kernel, a row per thread block: the
    mean keeps its reduced axis, which makes it no product to tile."""
    from probtune.measure.codegen import compile_for
    from probtune.model.precision import convert_precision

    model = load_model(_rms_norm_onnx(tmp_path))
    target = resolve_target("cuda-sm90")
    tasks = extract_tasks(fuse(dataclasses.replace(model, mod=convert_precision(model.mod, "fp16")), target))
    assert any(task.name.startswith("fused_power_mean") for task in tasks)
    for task in tasks:
        candidate = valid_samples(generate_space(task.workload, target, seed=0), 1, tries=40)[0]
        source = compile_for(candidate.mod, target).mod.imports[0].inspect_source()
        kernels = set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)", source))
        assert kernels, task.name
        assert len(kernels) == 1 or not task.name.startswith("fused_power_mean"), kernels
