"""pad-vnni-channels and pad-bf16-channels: convolutions whose channels miss a dot-product instruction's blocks run
padded, and compute what onnxruntime does."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import numpy_helper

from conftest import quantized_cnn
from probtune.model import load_model, tune_model
from probtune.model.examples import small_cnn
from probtune.model.layouts import convert_layouts
from probtune.model.precision import convert_precision
from probtune.model.quantized import integer_operators
from probtune.model.tasks import extract_tasks, fuse
from probtune.targets import resolve_target
from probtune_cpu.host_cpu import cpu_features
from probtune_x86 import AMX_BF16_FEATURE, BF16_FEATURE, VNNI_FEATURE
from probtune_x86.bf16 import PadBF16Channels
from probtune_x86.dot_channels import dot_channels
from probtune_x86.vnni import PadVNNIChannels

HAS_VNNI = VNNI_FEATURE in cpu_features()
HAS_BF16 = BF16_FEATURE in cpu_features()
HAS_AMX = AMX_BF16_FEATURE in cpu_features()
SHAPES = {"x": (1, 3, 16, 16)}


@pytest.fixture(scope="module")
def qdq_cnn_24(tmp_path_factory):
    """examples.small_cnn with 24 channels (3 -> 24 -> 24 -> 48, a residual add between), quantized by onnxruntime."""
    folder = tmp_path_factory.mktemp("vnni_channels")
    onnx.save(small_cnn(channels=24, size=16), folder / "cnn.onnx")
    return quantized_cnn(folder / "cnn.onnx", folder / "cnn.qdq.onnx")


@pytest.mark.parametrize(
    ("channels", "block", "max_extra_work", "padded"),
    [(24, 16, 1.0, 32), (8, 16, 1.0, 16), (40, 16, 1.0, 48), (48, 16, 1.0, 48), (3, 4, 1.0, 4), (2, 4, 1.0, 4),
     (1, 4, 1.0, 1), (5, 16, 1.0, 5), (24, 16, 0.5, 32), (8, 16, 0.5, 8), (3, 2, 0.5, 4), (1, 2, 0.5, 1)],
)
def test_channels_are_padded_to_the_block_where_that_adds_at_most_the_allowed_work(channels, block, max_extra_work, padded):
    assert dot_channels(channels, block, max_extra_work) == padded


def _conv_kernels(mod, dtype: str = "int8") -> list[tuple[int, ...]]:
    """The kernel's shape (HWIO) of each convolution task whose kernel is ``dtype``."""
    shapes = []
    for task in extract_tasks(mod):
        func = task.workload.prim_func
        if "conv2d" in task.name and str(func.params[1].dtype) == dtype:
            shapes.append(tuple(int(d) for d in func.params[1].shape))
    return shapes


@pytest.mark.skipif(not HAS_VNNI, reason="this CPU has no AVX-512 VNNI")
def test_odd_channels_run_padded_and_the_model_matches_onnxruntime(qdq_cnn_24):
    model = load_model(qdq_cnn_24, SHAPES)
    host = resolve_target("host")
    kernels = _conv_kernels(fuse(model, host))
    assert (3, 3, 4, 32) in kernels  # the stem: 3 input channels read as 4, 24 output ones computed as 32
    assert all(k[2] % 4 == 0 and k[3] % 16 == 0 for k in kernels)
    result = tune_model(model, "host", trials=0, batch_size=4, confirm=0)
    assert result.graph_rewrites[PadVNNIChannels.name] >= 3
    compiled = result.compile()
    step = float(numpy_helper.to_array(next(i for i in onnx.load(qdq_cnn_24).graph.initializer if i.name == "logits_scale")))
    session = onnxruntime.InferenceSession(str(qdq_cnn_24), providers=["CPUExecutionProvider"])
    for seed in range(3):
        inputs = model.random_inputs(seed)
        want, got = session.run(None, {"x": inputs[0]})[0], compiled(*inputs)[0]
        assert got.shape == want.shape and np.abs(got - want).max() <= step * 1.01  # at most one quantization step


def test_a_target_without_vnni_is_left_as_it_is(qdq_cnn_24):
    """The same channels-last integer module: padded for a CPU with VNNI, left as it is for one without."""
    model = load_model(qdq_cnn_24, SHAPES)
    integer, _, _ = integer_operators(model.mod)
    plain, vnni = resolve_target("llvm"), resolve_target("x86-avx512")  # znver4: its LLVM CPU has VNNI
    mod = convert_layouts(integer, vnni.layouts)
    assert PadVNNIChannels().rewrite(mod, vnni)[1] >= 3
    rewritten, count = PadVNNIChannels().rewrite(mod, plain)
    assert count == 0 and rewritten.same_as(mod)
    assert PadVNNIChannels.name not in plain.graph_rewrites


@pytest.fixture(scope="module")
def cnn_24(tmp_path_factory):
    """examples.small_cnn with 24 channels, in float32."""
    path = tmp_path_factory.mktemp("bf16_channels") / "cnn.onnx"
    onnx.save(small_cnn(channels=24, size=16), path)
    return path


@pytest.mark.skipif(not HAS_BF16, reason="this CPU has no AVX512-BF16")
def test_bf16_convolutions_run_padded_and_the_model_matches_onnxruntime(cnn_24, tmp_path):
    model = load_model(cnn_24, SHAPES)
    bf16 = dataclasses.replace(model, mod=convert_precision(model.mod, "bf16"))
    kernels = _conv_kernels(fuse(bf16, resolve_target("host")), "bfloat16")
    # the stem: 3 input channels read as 4, 24 output ones computed as 32; with AMX tiles, its 3 window columns of 4
    # channels folded into 32 channels (test_x86_window_channels)
    assert ((3, 1, 32, 32) if HAS_AMX else (3, 3, 4, 32)) in kernels
    assert all(k[2] % 2 == 0 and k[3] % 16 == 0 for k in kernels)
    result = tune_model(model, "host", trials=0, database=tmp_path / "t.db", precision="bf16", batch_size=4, confirm=0)
    assert result.graph_rewrites[PadBF16Channels.name] >= 3
    compiled = result.compile()  # checked against onnxruntime's float32 with bf16's tolerance, or it raises
    assert compiled.check.precision == "bf16" and compiled.check.reference == "onnxruntime"


def test_a_target_without_bf16_is_left_as_it_is(cnn_24):
    model = load_model(cnn_24, SHAPES)
    plain, bf16 = resolve_target("llvm"), resolve_target("x86-avx512")  # znver4: its LLVM CPU has AVX512-BF16
    mod = convert_layouts(convert_precision(model.mod, "bf16"), bf16.layouts)
    assert PadBF16Channels().rewrite(mod, bf16)[1] >= 3
    rewritten, count = PadBF16Channels().rewrite(mod, plain)
    assert count == 0 and rewritten.same_as(mod)
    assert PadBF16Channels.name not in plain.graph_rewrites
