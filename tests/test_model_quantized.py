"""Quantized models, as onnxruntime's own quantizer writes them: integer operators, outputs checked against onnxruntime.

The static cases are QDQ files from ``quantize_static`` (per-channel int8
weights, uint8 activations with nonzero zero points where a tensor is not
after a ReLU); the dynamic cases are ``quantize_dynamic``'s MatMulInteger and ConvInteger forms.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic
from tvm import relax
from tvm.ir.expr import Constant

from conftest import quantized_cnn
from probtune.model import load_model, tune_model
from probtune.model.check import check_outputs
from probtune.model.quantized import INTEGER_OPERATORS, integer_operators
from probtune.model.tasks import extract_tasks, fuse
from probtune.targets import resolve_target

SHAPES = {"x": (1, 3, 16, 16)}
FAST = dict(batch_size=4, confirm=0)


def _calls(mod) -> list[relax.Call]:
    calls: list[relax.Call] = []
    relax.analysis.post_order_visit(
        mod["main"].body, lambda e: calls.append(e) if isinstance(e, relax.Call) and hasattr(e.op, "name") else None
    )
    return calls


def _steps_apart(got: np.ndarray, want: np.ndarray, step: float) -> np.ndarray:
    return np.round(np.abs(got.astype(np.float64) - want) / step)


def test_every_quantized_convolution_and_product_becomes_integer(qdq_cnn):
    graph = onnx.load(qdq_cnn).graph
    products = sum(node.op_type in ("Conv", "Gemm", "MatMul") for node in graph.node)
    model = load_model(qdq_cnn, SHAPES)
    mod, rewritten, left = integer_operators(model.mod)
    assert rewritten == products == 4 and left == []
    assert "relax.quantize" in {c.op.name for c in _calls(model.mod)}  # the model's own module is left as it was
    calls = _calls(mod)
    # per-tensor (de)quantizations are elementwise operators now; a batch norm's per-channel weights stay constants
    assert not [c for c in calls if c.op.name == "relax.quantize"]
    assert all(isinstance(c.args[0], Constant) for c in calls if c.op.name == "relax.dequantize")
    assert "relax.nn.pad" in {c.op.name for c in calls}  # the input's zero point is not 0: its padding reads it


def test_a_qdq_model_compiles_to_onnxruntimes_integers(qdq_cnn):
    model = load_model(qdq_cnn, SHAPES)
    result = tune_model(model, "host", trials=0, **FAST)
    assert result.graph_rewrites[INTEGER_OPERATORS] == 4
    compiled = result.compile()
    assert compiled.check is not None and compiled.check.stepped is not None
    assert "quantization step" in str(compiled.check)
    step = float(numpy_helper.to_array(next(i for i in onnx.load(qdq_cnn).graph.initializer
                                            if i.name == "logits_scale")))
    for seed in range(3):
        inputs = model.random_inputs(seed)
        session = onnxruntime.InferenceSession(str(qdq_cnn), providers=["CPUExecutionProvider"])
        want = session.run(None, {"x": inputs[0]})[0]
        apart = _steps_apart(compiled(*inputs)[0], want, step)
        assert apart.max() <= 1 and np.mean(apart == 0) >= 0.9


def test_weights_with_zero_points_stay_dequantized_and_still_match(small_cnn_onnx, tmp_path):
    path = quantized_cnn(small_cnn_onnx, tmp_path / "u8_weights.onnx", weight_type=QuantType.QUInt8)
    model = load_model(path, SHAPES)
    _, rewritten, left = integer_operators(model.mod)
    assert rewritten == 0 and sorted(left) == ["relax.matmul", *["relax.nn.conv2d"] * 3]
    with pytest.warns(UserWarning, match=r"4 quantized operator\(s\) \(relax.matmul, relax.nn.conv2d\) keep"):
        result = tune_model(model, "host", trials=0, **FAST)
    assert INTEGER_OPERATORS not in result.graph_rewrites
    assert result.compile().check is not None


def test_a_dynamically_quantized_encoder_matches_within_onnxruntimes_own_spread(encoder_onnx, tmp_path):
    path = tmp_path / "encoder.dynamic.onnx"
    quantize_dynamic(str(encoder_onnx), str(path), weight_type=QuantType.QInt8)
    products = sum(node.op_type == "MatMulInteger" for node in onnx.load(path).graph.node)
    model = load_model(path)
    mod, rewritten, _ = integer_operators(model.mod)
    assert rewritten == products > 0  # on the bytes: the activations' zero point comes off each column's sum
    assert all(c.args[0].ty.dtype == "uint8" for c in _calls(mod) if c.op.name == "relax.matmul" and c.attrs.out_dtype == "int32")
    compiled = tune_model(model, "host", trials=0, **FAST).compile()
    assert compiled.check.spread is not None and "quantizing model" in str(compiled.check)


def test_a_program_off_by_two_steps_is_refused(qdq_cnn):
    from probtune.errors import ModelCheckError

    model = load_model(qdq_cnn, SHAPES)
    session = onnxruntime.InferenceSession(str(qdq_cnn), providers=["CPUExecutionProvider"])
    step = float(numpy_helper.to_array(next(i for i in onnx.load(qdq_cnn).graph.initializer if i.name == "logits_scale")))

    def off(x):
        return [session.run(None, {"x": x})[0] + 2 * step]

    with pytest.raises(ModelCheckError, match="differs from onnxruntime"):
        check_outputs(model, off)
    assert check_outputs(model, lambda x: [session.run(None, {"x": x})[0] + step]).stepped[0] > 0


def test_an_output_may_lie_as_far_from_onnxruntime_as_its_own_two_graphs_do(qdq_cnn, monkeypatch):
    """Which of onnxruntime's integer kernels runs depends on the CPU; where its optimized graph lies several steps
    from its unoptimized one, a compiled model may lie as far (``SPREAD_MARGIN`` times) from the optimized one."""
    from probtune.errors import ModelCheckError
    from probtune.model import check as check_module

    model = load_model(qdq_cnn, SHAPES)
    session = onnxruntime.InferenceSession(str(qdq_cnn), providers=["CPUExecutionProvider"])
    step = float(numpy_helper.to_array(next(i for i in onnx.load(qdq_cnn).graph.initializer if i.name == "logits_scale")))

    def off(x):
        return [session.run(None, {"x": x})[0] + 2 * step]

    monkeypatch.setattr(check_module, "_reference_spread", lambda *args: {0: 1.5 * step})
    report = check_outputs(model, off)
    assert report.stepped[0] == report.stepped[1] and report.spread is not None
    monkeypatch.setattr(check_module, "_reference_spread", lambda *args: {0: 0.5 * step})
    with pytest.raises(ModelCheckError, match="differs from onnxruntime"):
        check_outputs(model, off)


def test_a_float_output_may_lie_as_far_as_onnxruntimes_own_moves_for_inputs_ulps_apart(encoder_onnx, tmp_path,
                                                                                      monkeypatch):
    """A dynamically quantized model whose two onnxruntime graphs run the same kernels agree to the last bit, but a
    flip in the last bits of a float moves its outputs as much as any other implementation's does: how far onnxruntime
    moves for inputs a few ulps apart bounds a float output too. An output dequantized from 8 bits keeps its steps."""
    from probtune.errors import ModelCheckError
    from probtune.model import check as check_module

    path = tmp_path / "encoder.dynamic.onnx"
    quantize_dynamic(str(encoder_onnx), str(path), weight_type=QuantType.QInt8)
    model = load_model(path)
    reference = check_module.onnxruntime_runner(model)
    inputs = model.random_inputs(0)
    noise = check_module._noise_spread(model, inputs, reference(*inputs))
    assert noise[0] > 0  # onnxruntime itself moves for inputs a few ulps apart
    rms = float(np.sqrt(np.mean(np.square(reference(*inputs)[0]))))

    def off(*x):
        return [reference(*x)[0] + 0.05 * rms]

    monkeypatch.setattr(check_module, "_reference_spread", lambda *args: {0: 0.0})
    monkeypatch.setattr(check_module, "_noise_spread", lambda *args: {0: 0.03 * rms})
    assert check_outputs(model, off).spread == pytest.approx(0.03, rel=1e-3)
    monkeypatch.setattr(check_module, "_noise_spread", lambda *args: {0: 0.02 * rms})
    with pytest.raises(ModelCheckError, match="differs from onnxruntime"):
        check_outputs(model, off)


def test_an_output_dequantized_from_8_bits_is_held_to_its_steps_whatever_the_noise(qdq_cnn, monkeypatch):
    from probtune.errors import ModelCheckError
    from probtune.model import check as check_module

    model = load_model(qdq_cnn, SHAPES)
    session = onnxruntime.InferenceSession(str(qdq_cnn), providers=["CPUExecutionProvider"])
    step = float(numpy_helper.to_array(next(i for i in onnx.load(qdq_cnn).graph.initializer if i.name == "logits_scale")))
    monkeypatch.setattr(check_module, "_reference_spread", lambda *args: {0: 0.0})
    monkeypatch.setattr(check_module, "_noise_spread", lambda *args: {0: 10 * step})
    with pytest.raises(ModelCheckError, match="differs from onnxruntime"):
        check_outputs(model, lambda x: [session.run(None, {"x": x})[0] + 2 * step])


def test_a_target_without_vnni_computes_the_same_integers(qdq_cnn):
    model = load_model(qdq_cnn, SHAPES)
    assert "vnni-dot-product" not in resolve_target("x86-avx2").modules
    compiled = tune_model(model, "x86-avx2", trials=0, **FAST).compile()  # the plain integer space
    assert compiled.check is not None and compiled.check.stepped is not None


def test_layers_of_one_shape_with_scales_of_their_own_are_one_task(encoder_onnx, tmp_path):
    path = tmp_path / "encoder.dynamic.onnx"
    quantize_dynamic(str(encoder_onnx), str(path), weight_type=QuantType.QInt8)
    tasks = extract_tasks(fuse(load_model(path), resolve_target("host")))
    # the query, key and value projections: one shape, three weight scales (arguments, not literals in the code)
    assert max(task.weight for task in tasks if "matmul" in task.name) >= 3


def _strided_conv1d(path) -> str:
    """A 1-D convolution of stride 2 with padding and a bias, as a speech encoder's front end."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((8, 4, 3)).astype(np.float32), "w"),
               numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")]
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1], strides=[2])], "conv1d",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return str(path)


@pytest.mark.parametrize("rank", [1, 2])
def test_a_dynamically_quantized_convolution_imports_and_matches_onnxruntime(rank, small_cnn_onnx, tmp_path):
    """``quantize_dynamic`` writes a convolution as ConvInteger, which TVM's frontend has no converter for (a vision
    transformer's patch embedding failed to import)."""
    source = str(small_cnn_onnx) if rank == 2 else _strided_conv1d(tmp_path / "conv1d.onnx")
    path = tmp_path / "dynamic.onnx"
    quantize_dynamic(source, str(path), weight_type=QuantType.QInt8)
    assert "ConvInteger" in {node.op_type for node in onnx.load(path).graph.node}
    model = load_model(path, SHAPES if rank == 2 else None)
    compiled = tune_model(model, "host", trials=0, **FAST).compile()
    assert compiled.check is not None and "outputs match onnxruntime" in str(compiled.check)


def test_a_qoperator_model_is_imported_and_computed_on_integers(small_cnn_onnx, tmp_path):
    path = tmp_path / "small_cnn.qoperator.onnx"
    quantized_cnn(small_cnn_onnx, path, quant_format=QuantFormat.QOperator, op_types_to_quantize=["Conv", "MatMul"])
    ops = {node.op_type for node in onnx.load(path).graph.node}
    assert "QLinearConv" in ops
    model = load_model(path, SHAPES)
    _, rewritten, left = integer_operators(model.mod)
    assert rewritten == sum(node.op_type == "QLinearConv" for node in onnx.load(path).graph.node) and left == []
    compiled = tune_model(model, "host", trials=0, **FAST).compile()
    assert compiled.check is not None


def test_a_model_the_integer_rewrite_fails_on_keeps_its_float_form_with_a_warning(qdq_cnn, monkeypatch):
    from probtune.model import tasks

    def refuse(mod):
        raise RuntimeError("TVM refused a pattern")

    monkeypatch.setattr(tasks, "integer_operators", refuse)
    with pytest.warns(UserWarning, match="keep their dequantized float32 form: rewriting them on integers failed"):
        result = tune_model(load_model(qdq_cnn, SHAPES), "host", trials=0, **FAST)
    assert INTEGER_OPERATORS not in result.graph_rewrites and result.compile().check is not None
