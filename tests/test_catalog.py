"""Tests of the built-in workload catalog: every entry builds, runs and matches numpy."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi

from probtune.errors import WorkloadShapeError
from probtune.workloads.catalog import BUILTIN_WORKLOADS, WorkloadSpec
from probtune.workloads.workload import Workload

SPECS = {spec.name: spec for spec in BUILTIN_WORKLOADS}
HOST = tvm.target.Target(
    {"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu(), "num-cores": 2}
)


def run_on_host(
    mod: tvm.IRModule, workload: Workload, inputs: list[np.ndarray]
) -> list[np.ndarray]:
    """Compile ``mod`` for this machine and run it with zero-initialised outputs."""
    device = tvm.cpu()
    outputs = [
        tvm.runtime.tensor(np.zeros(shape, dtype), device)
        for shape, dtype in workload.param_specs()[workload.num_inputs :]
    ]
    executable = tvm.compile(mod, target=HOST)
    executable["main"](*(tvm.runtime.tensor(a, device) for a in inputs), *outputs)
    return [output.numpy() for output in outputs]


def assert_matches_reference(workload: Workload, actual: list[np.ndarray], seed: int) -> None:
    expected = workload.reference_outputs(workload.random_inputs(seed))
    rtol, atol = workload.tolerance()
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def block_names(workload: Workload) -> list[str]:
    names: list[str] = []
    tvm_ffi.structural_walk(
        workload.prim_func.body, (tvm.s_tir.SBlock, lambda block: names.append(block.name_hint))
    )
    return names


def test_catalog_names_are_unique_and_complete() -> None:
    assert len(SPECS) == len(BUILTIN_WORKLOADS)
    assert set(SPECS) == {
        "matmul",
        "batch_matmul",
        "dense",
        "dense_bias_relu",
        "dense_bias_gelu",
        "conv2d_nchw",
        "conv2d_nhwc",
        "depthwise_conv2d_nchw",
        "softmax",
        "layer_norm",
    }


@pytest.mark.parametrize("spec", BUILTIN_WORKLOADS, ids=lambda spec: spec.name)
def test_untuned_module_matches_numpy_reference(spec: WorkloadSpec) -> None:
    workload = spec.instantiate(spec.small_shape, "float32")
    inputs = workload.random_inputs(seed=1)
    assert_matches_reference(workload, run_on_host(workload.mod, workload, inputs), seed=1)


@pytest.mark.parametrize("spec", BUILTIN_WORKLOADS, ids=lambda spec: spec.name)
def test_default_shape_builds_with_consistent_metadata(spec: WorkloadSpec) -> None:
    workload = spec.instantiate(spec.default_shape, "float32")
    assert workload.key == f"{spec.name}({','.join(map(str, spec.default_shape))}):float32"
    assert workload.prim_func.attrs["global_symbol"] == "main"
    assert workload.flops is not None and workload.flops > 0
    assert 1 <= workload.num_inputs < len(workload.param_specs())
    assert all(dtype == "float32" for _, dtype in workload.param_specs())
    assert len(spec.shape_params) == len(spec.default_shape) == len(spec.small_shape)


@pytest.mark.parametrize(
    ("name", "blocks"),
    [
        ("matmul", ["C"]),
        ("dense_bias_relu", ["T_dense", "T_bias_add", "T_relu"]),
        ("dense_bias_gelu", ["T_dense", "T_bias_add", "T_gelu"]),
        ("conv2d_nchw", ["pad_temp", "conv2d_nchw"]),
        ("softmax", ["T_softmax_maxelem", "T_softmax_exp", "T_softmax_expsum", "T_softmax_norm"]),
        ("layer_norm", ["T_layer_norm_sum", "T_layer_norm_sq_dev_sum", "T_layer_norm"]),
    ],
)
def test_block_names_are_readable(name: str, blocks: list[str]) -> None:
    spec = SPECS[name]
    assert block_names(spec.instantiate(spec.small_shape, "float32")) == [*blocks, "root"]


@pytest.mark.parametrize(
    "name",
    [
        "matmul",
        "batch_matmul",
        "dense",
        "dense_bias_relu",
        "conv2d_nchw",
        "conv2d_nhwc",
        "depthwise_conv2d_nchw",
    ],
)
def test_flop_formula_agrees_with_tvm_estimator(name: str) -> None:
    spec = SPECS[name]
    workload = spec.instantiate(spec.small_shape, "float32")
    assert workload.flops == tvm.s_tir.analysis.estimate_tir_flops(workload.mod)


def test_float64_workload_matches_reference_tightly() -> None:
    workload = SPECS["layer_norm"].instantiate((8, 40), "float64")
    inputs = workload.random_inputs(seed=2)
    assert all(array.dtype == np.float64 for array in inputs)
    rtol, atol = workload.tolerance()
    assert rtol < 1e-12 and atol < 1e-12
    assert_matches_reference(workload, run_on_host(workload.mod, workload, inputs), seed=2)


@pytest.mark.parametrize("name", ["conv2d_nchw", "depthwise_conv2d_nchw"])
def test_unpadded_convolution_has_no_padding_block(name: str) -> None:
    spec = SPECS[name]
    shape = (1, 4, 7, 9, 6, 3, 2, 1, 0) if name == "conv2d_nchw" else (1, 4, 7, 9, 3, 2, 2, 0)
    workload = spec.instantiate(shape, "float32")
    assert "pad_temp" not in block_names(workload)
    inputs = workload.random_inputs(seed=3)
    assert_matches_reference(workload, run_on_host(workload.mod, workload, inputs), seed=3)


def test_layouts_of_one_convolution_agree() -> None:
    shape = (1, 3, 6, 6, 5, 3, 3, 1, 1)
    nchw = SPECS["conv2d_nchw"].instantiate(shape, "float64")
    nhwc = SPECS["conv2d_nhwc"].instantiate(shape, "float64")
    data, weight = nchw.random_inputs(seed=4)
    (out_nchw,) = nchw.reference_outputs([data, weight])
    (out_nhwc,) = nhwc.reference_outputs(
        [data.transpose(0, 2, 3, 1).copy(), weight.transpose(2, 3, 1, 0).copy()]
    )
    np.testing.assert_allclose(out_nhwc, out_nchw.transpose(0, 2, 3, 1), rtol=1e-12, atol=1e-12)
    assert nchw.flops == nhwc.flops


def test_tolerance_accepts_a_reordered_reduction() -> None:
    """A tuned program sums in another order; the tolerance must allow for that."""
    workload = SPECS["matmul"].instantiate((32, 48, 1024), "float32")
    schedule = tvm.s_tir.Schedule(workload.mod)
    i, j, k = schedule.get_loops(schedule.get_sblock("C"))
    k_outer, k_inner = schedule.split(k, [None, 16])
    schedule.reorder(k_inner, i, j, k_outer)
    inputs = workload.random_inputs(seed=5)
    assert_matches_reference(workload, run_on_host(schedule.mod, workload, inputs), seed=5)


def test_tolerance_rejects_a_wrong_result() -> None:
    """Dropping one of K terms, a typical off-by-one, must not pass as a rounding error."""
    workload = SPECS["matmul"].instantiate((32, 48, 512), "float32")
    a, b = workload.random_inputs(seed=6)
    (expected,) = workload.reference_outputs([a, b])
    off_by_one = a[:, :-1] @ b[:-1, :]
    rtol, atol = workload.tolerance()
    assert not np.allclose(off_by_one, expected, rtol=rtol, atol=atol)


def test_softmax_tolerance_resolves_its_small_outputs() -> None:
    workload = SPECS["softmax"].instantiate((4, 1024), "float32")
    (x,) = workload.random_inputs(seed=7)
    (expected,) = workload.reference_outputs([x])
    rtol, atol = workload.tolerance()
    assert not np.allclose(expected * 1.01, expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    ("name", "shape", "message"),
    [
        ("matmul", (4, 4), r"matmul takes 3 shape parameters \(M, N, K\), got 2: \(4, 4\)"),
        ("matmul", (4, 0, 4), r"matmul shape parameter N must be positive, got 0"),
        ("conv2d_nchw", (1, 3, 8, 8, 4, 3, 3, 0, 1), r"stride must be positive"),
        ("conv2d_nchw", (1, 3, 8, 8, 4, 3, 3, 1, -1), r"pad must be non-negative"),
        ("conv2d_nhwc", (1, 3, 2, 8, 4, 5, 3, 1, 1), r"5x3 kernel does not fit a 2x8 input"),
        ("depthwise_conv2d_nchw", (1, 3, 8, 2, 3, 5, 1, 1), r"3x5 kernel does not fit a 8x2"),
        ("softmax", (4, 2.5), r"softmax shape parameter N must be an integer"),
    ],
)
def test_invalid_shapes_are_rejected(name: str, shape: tuple, message: str) -> None:
    with pytest.raises(WorkloadShapeError, match=message):
        SPECS[name].instantiate(shape, "float32")


def test_zero_padding_is_a_valid_shape() -> None:
    spec = SPECS["conv2d_nhwc"]
    assert spec.default_shape[-1] == 0
    workload = spec.instantiate(spec.default_shape, "float32")
    assert workload.param_specs()[-1] == ((1, 56, 56, 64), "float32")


def test_unsupported_dtype_is_rejected() -> None:
    with pytest.raises(WorkloadShapeError, match=r"matmul supports dtypes .*float32.*'int16'"):
        SPECS["matmul"].instantiate((4, 4, 4), "int16")


@pytest.mark.parametrize("name", ["conv2d_nchw", "conv2d_nhwc"])
def test_half_precision_convolution_sums_in_float32(name: str) -> None:
    """As the tensor cores and cuDNN do: float16 products summed in float32, the result rounded to float16 once."""
    workload = SPECS[name].instantiate((2, 8, 9, 9, 12, 3, 3, 2, 1), "float16")
    assert block_names(workload) == ["pad_temp", name, "conv2d_rounded", "root"]
    assert [dtype for _, dtype in workload.param_specs()] == ["float16"] * 3
    written: dict[str, str] = {}

    def record(block: tvm.s_tir.SBlock) -> None:
        written.update((block.name_hint, str(region.source.dtype)) for region in block.writes)

    tvm_ffi.structural_walk(workload.prim_func.body, (tvm.s_tir.SBlock, record))
    assert written[name] == "float32" and written["conv2d_rounded"] == "float16"
    assert_matches_reference(workload, run_on_host(workload.mod, workload, workload.random_inputs(seed=5)), seed=5)


@pytest.mark.parametrize("name,shape", [("matmul", (24, 40, 56)), ("batch_matmul", (3, 16, 24, 40)), ("dense", (16, 48, 40))])
def test_int8_products_are_summed_and_kept_in_int32(name: str, shape: tuple[int, ...]) -> None:
    """As ONNX's MatMulInteger and the tensor cores do: int8 inputs, int32 sums, nothing rounded back to int8."""
    workload = SPECS[name].instantiate(shape, "int8")
    assert [dtype for _, dtype in workload.param_specs()] == ["int8", "int8", "int32"]
    inputs = workload.random_inputs(seed=3)
    (expected,) = workload.reference_outputs(inputs)
    a, b = (x.astype(np.int64) for x in inputs)
    assert expected.dtype == np.int32
    np.testing.assert_array_equal(expected, a @ (b.T if name == "dense" else b))
    assert_matches_reference(workload, run_on_host(workload.mod, workload, inputs), seed=3)
