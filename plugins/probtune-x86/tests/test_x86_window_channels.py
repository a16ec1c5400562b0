"""fold-window-columns: a bf16 convolution with few input channels reads its window's columns as channels, computes
what it did, and then maps onto an AMX tile."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import onnx
import pytest
import tvm
from test_x86_amx import HAS_AMX, SAPPHIRE_RAPIDS
from tvm import relax

from probtune.model import load_model, tune_model
from probtune.model.examples import small_cnn
from probtune.model.precision import convert_precision
from probtune.model.tasks import extract_tasks, fuse
from probtune.targets import resolve_target
from probtune_x86.amx import AMX_BF16, amx_plan
from probtune_x86.window_channels import FoldWindowColumns, folded_channels

BF16 = ("bfloat16", "bfloat16", "float32")
INT8 = ("uint8", "int8", "int32")


@pytest.mark.parametrize(
    ("columns", "channels", "terms", "folded"),
    [(7, 4, 32, 32), (3, 4, 32, 32), (7, 4, 64, 64), (3, 4, 64, None), (3, 32, 32, None), (1, 4, 32, None),
     (3, 16, 32, 64), (5, 12, 32, 64)],
)
def test_window_columns_fold_into_whole_tiles_of_terms_that_are_mostly_their_own(columns, channels, terms, folded):
    assert folded_channels(columns, channels, terms) == folded


def _conv_module(types, shape, kernel, strides, padding) -> tvm.IRModule:
    """A module of one NHWC convolution with a constant HWIO kernel of ``types`` (data, kernel, sums)."""
    rng = np.random.default_rng(1)
    data_type, kernel_type, sum_type = types
    if kernel_type == "int8":
        weights = rng.integers(-128, 128, kernel).astype("int8")
    else:
        weights = rng.standard_normal(kernel).astype(ml_dtypes.bfloat16)
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, data_type))
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit_output(relax.op.nn.conv2d(x, relax.const(weights), strides, padding, (1, 1), 1, "NHWC",
                                                       "HWIO", "NHWC", sum_type))
        builder.emit_func_output(y)
    return builder.get()


def _run(mod: tvm.IRModule, data: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(data)).numpy()


def _data(shape) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize(
    ("types", "shape", "kernel", "strides", "padding"),
    [
        (BF16, (1, 32, 32, 4), (7, 7, 4, 16), (2, 2), (3, 3, 3, 3)),  # a ResNet stem
        (BF16, (1, 16, 18, 4), (3, 3, 4, 32), (1, 1), (1, 0, 1, 2)),  # uneven padding, stride 1
        (BF16, (1, 17, 33, 2), (3, 5, 2, 16), (2, 2), (0, 1, 0, 0)),  # the last columns left out by the stride
    ],
)
def test_a_folded_convolution_computes_what_the_convolution_did(types, shape, kernel, strides, padding):
    mod = _conv_module(types, shape, kernel, strides, padding)
    folded, count = FoldWindowColumns().rewrite(mod, SAPPHIRE_RAPIDS)
    assert count == 1
    conv = next(b.value for b in folded["main"].body.blocks[0].bindings if "conv2d" in str(b.value.op))
    assert int(conv.args[1].ty.shape[1]) == 1 and int(conv.args[0].ty.shape[3]) % 32 == 0
    data = _data(shape)
    want, got = _run(mod, data), _run(folded, data)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_convolutions_that_fill_a_tile_8_bit_ones_or_a_target_without_tiles_are_left_as_they_are():
    wide = _conv_module(BF16, (1, 16, 16, 32), (3, 3, 32, 32), (1, 1), (1, 1, 1, 1))
    assert FoldWindowColumns().rewrite(wide, SAPPHIRE_RAPIDS) == (wide, 0)
    int8 = _conv_module(INT8, (1, 32, 32, 4), (7, 7, 4, 16), (2, 2), (3, 3, 3, 3))
    assert FoldWindowColumns().rewrite(int8, SAPPHIRE_RAPIDS) == (int8, 0)
    stem = _conv_module(BF16, (1, 32, 32, 4), (7, 7, 4, 16), (2, 2), (3, 3, 3, 3))
    no_tiles = resolve_target("x86-avx512")  # znver4: AVX512-BF16, no AMX
    rewritten, count = FoldWindowColumns().rewrite(stem, no_tiles)
    assert count == 0 and rewritten.same_as(stem)
    assert FoldWindowColumns.name in SAPPHIRE_RAPIDS.graph_rewrites
    assert FoldWindowColumns.name not in no_tiles.graph_rewrites


def test_a_stem_maps_onto_a_tile_only_once_folded():
    mod = _conv_module(BF16, (1, 64, 64, 4), (7, 7, 4, 64), (2, 2), (3, 3, 3, 3))
    folded, _ = FoldWindowColumns().rewrite(mod, SAPPHIRE_RAPIDS)

    def plans(module: tvm.IRModule) -> list:
        lowered = relax.transform.LegalizeOps()(module)
        found = []
        for gvar, func in lowered.functions_items():
            if gvar.name_hint.startswith("conv2d"):
                sch = tvm.s_tir.Schedule(func)
                found.append(amx_plan(sch, sch.get_sblock("conv2d_nhwc"), AMX_BF16))
        return found

    assert plans(mod) == [None]
    assert [plan is not None for plan in plans(folded)] == [True]


@pytest.mark.skipif(not HAS_AMX, reason="this CPU has no AMX tiles")
def test_a_bf16_model_runs_its_stem_folded_and_matches_onnxruntime(tmp_path):
    onnx.save(small_cnn(channels=24, size=16), tmp_path / "cnn.onnx")
    model = load_model(tmp_path / "cnn.onnx", {"x": (1, 3, 16, 16)})
    bf16 = dataclasses.replace(model, mod=convert_precision(model.mod, "bf16"))
    kernels = [tuple(int(d) for d in task.workload.prim_func.params[1].shape)
               for task in extract_tasks(fuse(bf16, resolve_target("host"))) if "conv2d" in task.name]
    assert (3, 1, 32, 32) in kernels  # the stem's 3 x 4 window columns and channels read as 32 channels
    result = tune_model(model, "host", trials=0, database=tmp_path / "t.db", precision="bf16", batch_size=4, confirm=0)
    assert result.graph_rewrites[FoldWindowColumns.name] == 1
    compiled = result.compile()  # checked against onnxruntime's float32 with bf16's tolerance, or it raises
    assert compiled.check.precision == "bf16" and compiled.check.reference == "onnxruntime"
