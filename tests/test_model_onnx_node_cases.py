"""ONNX's own backend node tests (the cases the onnx package ships) through probtune's model path: a sample for CI.

Each case is imported, compiled with default programs (trials=0), checked
against onnxruntime (or TVM's untuned build, where onnxruntime cannot run the
case's opset) and compared with the outputs the case expects. The sample
holds the kinds that once failed here: operators TVM's frontend lacks,
layout rules that crashed, functions outside their domain on random inputs,
a model with nothing to tune. ``bench/onnx_node_tests.py`` runs them all.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx.backend.test.loader import load_model_tests

from probtune.errors import ProbtuneError
from probtune.model import load_model, tune_model
from probtune.model.check import flat_outputs

SAMPLE = [
    "test_lstm_defaults", "test_lstm_batchwise", "test_gru_with_initial_bias",
    "test_gru_batchwise", "test_simple_rnn_defaults", "test_rnn_seq_length", "test_celu", "test_swish",
    "test_lpnormalization_default", "test_max_example", "test_mean_example", "test_dropout_default", "test_sqrt_example",
    "test_log_example", "test_pow_example", "test_acosh", "test_batchnorm_example", "test_size", "test_clip_default_inbounds",
    "test_depthtospace_example", "test_dynamicquantizelinear", "test_optional_get_element_tensor",
    "test_conv_with_strides_padding", "test_convtranspose_pads", "test_hardswish", "test_hardsigmoid",
    "test_softmax_axis_1", "test_range_float_type_positive_delta", "test_optional_get_element_optional_tensor",
    "test_split_to_sequence_nokeepdims",  # a sequence output: its tensors come as outputs of their own
    # quantized operators (integer inputs and outputs), on integers through probtune.model.quantized
    "test_qlinearconv", "test_qlinearmatmul_2D_uint8_float32", "test_qlinearmatmul_3D_int8_float32", "test_matmulinteger",
]
REFUSED = {  # run-time shapes or masks, a sequence input, an operator TVM cannot lower: a named error before any trial
    "test_resize_upsample_scales_nearest": "TVM's ONNX frontend cannot import this model",
    "test_lstm_with_peepholes": "LSTM with sequence_lens given at run time is not supported",
    "test_sequence_map_add_1_sequence_1_tensor": "input 'x0' is a sequence, not a tensor",
    "test_rms_normalization_2d_axis0": "TVM cannot lower the model",
    "test_quantizelinear_int4": "TVM's ONNX frontend cannot import this model",
}


@pytest.fixture(scope="module")
def cases():
    return {case.name: case for case in load_model_tests(kind="node") if case.name in SAMPLE or case.name in REFUSED}


def _saved(case, tmp_path):
    if case is None:
        pytest.skip("this onnx version ships no such case")
    path = tmp_path / "model.onnx"
    onnx.save(case.model, path)
    return path


@pytest.mark.parametrize("name", SAMPLE)
def test_a_node_case_compiles_and_computes_what_onnx_expects(name, cases, tmp_path):
    case = cases.get(name)
    compiled = tune_model(load_model(_saved(case, tmp_path)), trials=0, database=tmp_path / "t.db").compile()
    assert compiled.check is not None
    for inputs, expected in case.data_sets:
        outputs, expected = compiled(*inputs), flat_outputs(expected)
        assert len(outputs) == len(expected)
        for got, want in zip(outputs, expected):
            np.testing.assert_allclose(got, want, rtol=max(case.rtol, 1e-5), atol=max(case.atol, 1e-6), equal_nan=True)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_node_case_probtune_cannot_take_is_refused_by_name(name, cases, tmp_path):
    path = _saved(cases.get(name), tmp_path)
    with pytest.raises(ProbtuneError, match=REFUSED[name]):
        tune_model(load_model(path), trials=4, database=tmp_path / "t.db")
    assert not (tmp_path / "t.db").exists()  # refused before anything was recorded


def test_the_operator_tvms_frontend_failed_on_is_named_and_nothing_is_printed(cases, tmp_path, capsys):
    path = _saved(cases.get("test_resize_upsample_scales_nearest"), tmp_path)
    with pytest.raises(ProbtuneError, match=r"cannot import this model \(converting a Resize node\)"):
        load_model(path)
    assert "Error converting" not in capsys.readouterr().out
