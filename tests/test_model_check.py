"""The model check: NaNs where the reference has them, a reference onnxruntime cannot compute, real mismatches."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from probtune.errors import ModelCheckError
from probtune.model import check as check_module
from probtune.model import load_model
from probtune.model.check import check_outputs
from probtune.model.examples import make_model


@pytest.fixture
def sqrt_model(tmp_path):
    """Sqrt of U(-1, 1) inputs: NaN wherever an input is negative, in onnxruntime's outputs as in a compiled model's."""
    graph = helper.make_graph([helper.make_node("Sqrt", ["x"], ["y"])], "sqrt",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    onnx.save(make_model(graph), tmp_path / "sqrt.onnx")
    return load_model(tmp_path / "sqrt.onnx")


def _sqrt(x):
    with np.errstate(invalid="ignore"):
        return [np.sqrt(x)]


def test_nans_where_the_reference_has_them_match(sqrt_model):
    report = check_outputs(sqrt_model, _sqrt)
    assert report.reference == "onnxruntime" and report.max_abs_error == 0.0


def test_a_nan_where_the_reference_has_a_number_is_a_mismatch(sqrt_model):
    def wrong(x):
        y = np.sqrt(np.abs(x))
        y[0, 0] = np.nan
        return [y]

    with pytest.raises(ModelCheckError, match="differs from onnxruntime's"):
        check_outputs(sqrt_model, wrong)
    with pytest.raises(ModelCheckError, match="differs"):  # a number where the reference has NaN
        check_outputs(sqrt_model, lambda x: [np.sqrt(np.abs(x))])


def test_a_model_onnxruntime_cannot_run_is_checked_against_the_untuned_build(sqrt_model, monkeypatch):
    def refuse(model, threads=None):
        raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : no kernel for this operator")

    monkeypatch.setattr(check_module, "onnxruntime_runner", refuse)
    report = check_outputs(sqrt_model, _sqrt)
    assert report.reference.startswith("untuned build (onnxruntime cannot run the model: RuntimeError")


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "int64", "bool", "bfloat16"])
def test_outputs_are_copied_out_whatever_their_dtype(dtype):
    """Through DLPack where numpy views the dtype, else ``.numpy()`` (bfloat16); either way a copy of its own."""
    import tvm

    from probtune.model.check import outputs_to_numpy
    from probtune.model.compile import _numpy_view

    values = np.arange(6).reshape(2, 3) % 2
    if dtype == "bfloat16":
        tensor = tvm.runtime.empty((2, 3), dtype, tvm.cpu())
        tensor.copyfrom(values.astype(tensor.numpy().dtype))  # ml_dtypes' bfloat16, as TVM gives it
    else:
        tensor = tvm.runtime.tensor(values.astype(dtype))
    first, second = outputs_to_numpy((tensor, (tensor,)))
    assert str(first.dtype) == dtype and first.shape == (2, 3)
    np.testing.assert_array_equal(first.astype("float32"), values.astype("float32"))
    first[...] = 0
    np.testing.assert_array_equal(second.astype("float32"), values.astype("float32"))  # each output is its own copy
    view = _numpy_view(tensor)
    assert (view is None) == (dtype == "bfloat16")
    if view is not None:
        np.copyto(view, np.zeros((2, 3), dtype))
        assert not tensor.numpy().any()  # a view of the tensor's memory: the staged input a call copies into


@pytest.fixture
def cancelling_model(tmp_path):
    """``x @ A - x @ B`` with ``B`` within 1e-3 of ``A``: rounding the weights to float16 moves the small difference
    by far more than fp16's tolerance, as it does in every float16 deployment of such a model."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 8)).astype(np.float32)
    b = (a + 1e-3 * rng.standard_normal((64, 8))).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "a"], ["xa"]), helper.make_node("MatMul", ["x", "b"], ["xb"]),
             helper.make_node("Sub", ["xa", "xb"], ["y"])]
    weights = [onnx.numpy_helper.from_array(a, "a"), onnx.numpy_helper.from_array(b, "b")]
    graph = helper.make_graph(nodes, "cancel", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], weights)
    onnx.save(make_model(graph), tmp_path / "cancel.onnx")
    return load_model(tmp_path / "cancel.onnx"), a, b


def _rounded(array):
    return array.astype(np.float16).astype(np.float32)


def test_an_fp16_model_may_move_as_far_as_rounding_its_operands_moves_onnxruntime(cancelling_model):
    model, a, b = cancelling_model

    def fp16(x):
        return [_rounded(x) @ _rounded(a) - _rounded(x) @ _rounded(b)]

    report = check_outputs(model, fp16, precision="fp16")
    assert report.max_rel_error > check_module.TOLERANCES["fp16"][1]  # beyond the fixed tolerance, yet right
    assert report.rounding is not None and report.rounding >= report.max_rel_error / check_module.ROUNDING_MARGIN
    assert "rounded to fp16" in str(report)
    with pytest.raises(ModelCheckError, match="differs"):  # a wrong program is still caught
        check_outputs(model, lambda x: [fp16(x)[0] + np.sqrt(np.mean(np.square(fp16(x)[0])))], precision="fp16")
    with pytest.raises(ModelCheckError, match="differs"):  # and float32's tolerance has no such allowance
        check_outputs(model, fp16)
