"""The model commands: example-model, tune-model (tune, check, export), run-model (time, compare); bad input."""

from __future__ import annotations

import json

import onnx
import pytest

from probtune.cli import main
from probtune.targets import resolve_target


def test_example_models_are_written(tmp_path, capsys):
    for name in ("small-cnn", "encoder-layer"):
        assert main(["example-model", name, str(tmp_path / f"{name}.onnx")]) == 0
        onnx.checker.check_model(onnx.load(tmp_path / f"{name}.onnx"))


def test_tune_model_exports_and_run_model_compares(small_cnn_onnx, tmp_path, capsys):
    output = tmp_path / "cnn.so"
    code = main(["tune-model", str(small_cnn_onnx), "--input-shape", "x=1,3,16,16", "--trials", "8",
                 "--batch-size", "4", "--confirm", "0", "--database", str(tmp_path / "t.db"), "--output", str(output)])
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0, out
    assert "outputs match onnxruntime" in out and "share" in out and f"written: {output}" in out
    assert "compiling the model once with default programs" in captured.err  # what it does outside its trials
    assert "checking the compiled model's outputs against onnxruntime" in captured.err
    assert output.is_file() and (tmp_path / "cnn.so.json").is_file()
    threads = json.loads((tmp_path / "cnn.so.json").read_text())["threads"]
    assert f"thread count: the compiled model runs on {threads} thread" in out  # the count it was timed fastest on

    assert main(["run-model", str(output), "--compare-onnx", str(small_cnn_onnx), "--input-shape", "x=1,3,16,16",
                 "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "outputs match onnxruntime" in out and "probtune/onnxruntime speed ratio" in out
    assert main(["run-model", str(output), "--repeat", "2"]) == 0  # the inputs and thread count come from cnn.so.json
    assert f"ms per inference on {threads} threads" in capsys.readouterr().out
    assert main(["run-model", str(output), "--repeat", "2", "--threads", "1"]) == 0
    assert "ms per inference on 1 threads" in capsys.readouterr().out
    assert main(["run-model", str(output), "--compare-onnx", str(small_cnn_onnx), "--repeat", "2"]) == 0  # and its shapes
    assert "ms per inference" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--output", "/no/such/folder/m.so"], "--output /no/such/folder/m.so: cannot write there"),
        (["--input-shape", "1,3,16,16"], "expected NAME=DIMS"),
        (["--input-shape", "x=1,3,16"], "has rank 4 in the model"),
        (["--graph-rewrites", "winograd-conv2d,no-such-rewrite"], "unknown graph rewrite 'no-such-rewrite'"),
        (["--target", "x86-avx2", "--precision", "bf16"], "target 'x86-avx2' does not offer precision bf16"),
    ],
    ids=["unwritable-output", "shape-without-name", "wrong-rank", "unknown-graph-rewrite", "unoffered-precision"],
)
def test_bad_input_is_refused_before_any_trial(small_cnn_onnx, tmp_path, capsys, extra, message):
    database = tmp_path / "t.db"
    args = ["tune-model", str(small_cnn_onnx), "--trials", "4", "--database", str(database)]
    if not any(item.startswith("--input-shape") for item in extra):
        args += ["--input-shape", "x=1,3,16,16"]
    assert main(args + extra) == 2
    assert message in capsys.readouterr().err
    assert not database.exists()


@pytest.mark.skipif("bf16" not in resolve_target("host").precisions, reason="this machine's target offers no bf16")
def test_a_bf16_model_is_compared_with_bf16s_tolerance_after_export(small_cnn_onnx, tmp_path, capsys):
    output = tmp_path / "cnn.so"
    assert main(["tune-model", str(small_cnn_onnx), "--input-shape", "x=1,3,16,16", "--trials", "0", "--precision",
                 "bf16", "--database", str(tmp_path / "t.db"), "--output", str(output)]) == 0
    assert "for bf16)" in capsys.readouterr().out
    assert json.loads((tmp_path / "cnn.so.json").read_text())["precision"] == "bf16"
    assert main(["run-model", str(output), "--compare-onnx", str(small_cnn_onnx), "--repeat", "2"]) == 0
    assert "for bf16)" in capsys.readouterr().out  # read from cnn.so.json: float32's tolerance would refuse it


def test_run_model_without_inputs_file_says_what_to_give(tmp_path, capsys):
    compiled = tmp_path / "m.so"
    compiled.write_bytes(b"not a library")
    assert main(["run-model", str(compiled)]) == 2
    assert "give the model's inputs with --compare-onnx" in capsys.readouterr().err


def test_an_unexpected_failure_is_a_sentence_not_a_traceback(small_cnn_onnx, tmp_path, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError(0)

    monkeypatch.setattr("probtune.model.load_model", broken)
    assert main(["tune-model", str(small_cnn_onnx), "--input-shape", "x=1,3,16,16", "--trials", "4"]) == 3
    err = capsys.readouterr().err
    assert "probtune failed unexpectedly (KeyError: 0); this is a bug in probtune" in err and "Traceback" not in err
