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
