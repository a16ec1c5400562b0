"""pad-vnni-channels: integer convolutions whose channels miss VNNI's blocks run padded, and compute what onnxruntime does."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from probtune.model import load_model, tune_model
from probtune.model.examples import small_cnn
from probtune.model.layouts import convert_layouts
from probtune.model.quantized import integer_operators
from probtune.model.tasks import extract_tasks, fuse
from probtune.targets import resolve_target
from probtune_cpu.host_cpu import cpu_features
from probtune_x86 import VNNI_FEATURE
from probtune_x86.vnni_channels import PadVNNIChannels, vnni_channels

HAS_VNNI = VNNI_FEATURE in cpu_features()
SHAPES = {"x": (1, 3, 16, 16)}


class _RandomSamples(CalibrationDataReader):
    def __init__(self, count: int = 4) -> None:
        rng = np.random.default_rng(0)
        self.left = iter([{"x": rng.standard_normal(SHAPES["x"]).astype(np.float32)} for _ in range(count)])

    def get_next(self) -> dict | None:
        return next(self.left, None)


@pytest.fixture(scope="module")
def qdq_cnn_24(tmp_path_factory):
    """examples.small_cnn with 24 channels (3 -> 24 -> 24 -> 48, a residual add between), quantized by onnxruntime."""
    folder = tmp_path_factory.mktemp("vnni_channels")
    onnx.save(small_cnn(channels=24, size=16), folder / "cnn.onnx")
    quantize_static(str(folder / "cnn.onnx"), str(folder / "cnn.qdq.onnx"), _RandomSamples(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return folder / "cnn.qdq.onnx"


@pytest.mark.parametrize(("channels", "block", "padded"), [(24, 16, 32), (8, 16, 16), (40, 16, 48), (48, 16, 48),
                                                         (3, 4, 4), (2, 4, 4), (1, 4, 1), (5, 16, 5)])
def test_channels_are_padded_to_the_block_where_that_at_most_doubles_the_work(channels, block, padded):
    assert vnni_channels(channels, block) == padded


def _conv_kernels(mod) -> list[tuple[int, ...]]:
    """The int8 kernel's shape (HWIO) of each convolution task."""
    shapes = []
    for task in extract_tasks(mod):
        func = task.workload.prim_func
        if "conv2d" in task.name and str(func.params[1].dtype) == "int8":
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
