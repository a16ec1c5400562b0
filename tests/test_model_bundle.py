"""Model bundles: a whole model for a GPU that only exchanges files, run there by CuPy (here: a stand-in that logs)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from probtune.errors import TuningConfigError
from probtune.measure.run_model_bundle import MANIFEST, RESULTS, digest, seeded_array
from probtune.model import extract_tasks, fuse, load_model
from probtune.model.bundle import Tolerance, write_model_bundle
from probtune.model.compile import default_programs
from probtune.model.precision import TOLERANCES, convert_precision
from probtune.space.space_generator import generate_space
from probtune.targets import resolve_target

FAKE_CUPY = Path(__file__).resolve().parent / "fake_cupy"
SEEDED = 256  # elements from which the small CNN's weights travel as seeds
NO_TVM = ("import runpy, sys; sys.modules['probtune'] = sys.modules['tvm'] = None; sys.argv = sys.argv[1:]; "
          "runpy.run_path(sys.argv[0], run_name='__main__')")


def _fused(onnx_path: Path, target, precision: str = "fp16"):
    model = load_model(onnx_path, {"x": (1, 3, 16, 16)})
    fused = fuse(dataclasses.replace(model, mod=convert_precision(model.mod, precision)), target)
    entries = [(t.functions, generate_space(t.workload, target), t.workload.mod) for t in extract_tasks(fused)]
    return model, fused, default_programs(entries, 0, target)


@pytest.fixture(scope="module")
def cnn_bundle(small_cnn_onnx, tmp_path_factory):
    target = resolve_target("cuda-sm90")
    model, fused, programs = _fused(small_cnn_onnx, target)
    out = tmp_path_factory.mktemp("bundles") / "cnn"
    return write_model_bundle(fused, programs, target, out, name="cnn:1", inputs=model.inputs,
                              tolerance=Tolerance(*TOLERANCES["fp16"]), seeded_elements=SEEDED)


def _run(bundle: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(FAKE_CUPY), "FAKE_CUPY_LOG": str(tmp_path / "launches"),
           "FAKE_CUPY_ANSWERS": "bundle"}
    return subprocess.run([sys.executable, "-c", NO_TVM, str(bundle / "run_model_bundle.py")], capture_output=True,
                          text=True, timeout=300, check=False, env=env)


def test_a_model_bundle_launches_every_kernel_of_its_plan_in_order_and_reports_per_function(cnn_bundle, tmp_path):
    manifest = json.loads((cnn_bundle.path / MANIFEST).read_text())
    ran = _run(cnn_bundle.path, tmp_path)
    assert ran.returncode == 0, ran.stderr + ran.stdout
    result = json.loads((cnn_bundle.path / RESULTS).read_text())
    assert result["status"] == "ok" and result["device"] == "Fake GPU"
    assert result["launches"] == cnn_bundle.launches and len(result["latency_s"]) == 10
    assert set(result["functions"]) == {call["function"] for call in manifest["plan"]["calls"]}
    expected = [launch["kernel"] for call in manifest["plan"]["calls"]
                for launch in manifest["functions"][call["function"]]["launches"]]
    logged = [json.loads(line)["kernel"] for line in (tmp_path / "launches").read_text().splitlines()]
    assert logged[: len(expected)] == expected  # the checked call, before any timing
    for function in manifest["functions"].values():
        assert (cnn_bundle.path / function["cubin"]).read_bytes()[:4] == b"\x7fELF"
    assert manifest["runtimes"] == {"cupy": "runtime_cupy.py"}  # probtune-cuda's runtime, which launched them


def test_large_weights_travel_as_seeds_that_make_the_same_bits(cnn_bundle):
    manifest = json.loads((cnn_bundle.path / MANIFEST).read_text())
    seeded = manifest["constants"]["seeded"]
    assert seeded and cnn_bundle.seeded_bytes > 0
    for spec in seeded.values():
        assert int(np.prod(spec["shape"])) >= SEEDED
        assert digest(seeded_array(spec["seed"], spec["shape"], spec["dtype"], spec["mean"], spec["std"])) == spec["digest"]
    with np.load(cnn_bundle.path / manifest["constants"]["file"]) as carried:
        assert not set(carried.files) & set(seeded)


def test_a_seed_that_makes_other_weights_is_refused_before_anything_runs(cnn_bundle, tmp_path):
    import shutil

    copy = tmp_path / "tampered"
    shutil.copytree(cnn_bundle.path, copy)
    manifest = json.loads((copy / MANIFEST).read_text())
    name = next(iter(manifest["constants"]["seeded"]))
    manifest["constants"]["seeded"][name]["seed"] += 1
    (copy / MANIFEST).write_text(json.dumps(manifest))
    ran = _run(copy, tmp_path)
    assert ran.returncode == 1
    result = json.loads((copy / RESULTS).read_text())
    assert result["status"] == "bad_bundle" and name in result["error"]
    assert not (tmp_path / "launches").exists()


def test_seeded_values_are_the_same_bits_everywhere_and_have_the_asked_statistics():
    small = seeded_array(7, (4, 5), "float16", 0.5, 2.0)
    assert small.dtype == np.float16 and small.shape == (4, 5)
    assert digest(small) == digest(seeded_array(7, [4, 5], "float16", 0.5, 2.0))
    assert digest(small) != digest(seeded_array(8, (4, 5), "float16", 0.5, 2.0))
    assert digest(seeded_array(3, (6,), "float32", 0.0, 1.0)) == PINNED  # no numpy RNG: bits fixed by arithmetic
    large = seeded_array(1, (200_000,), "float32", -0.25, 0.05)
    assert abs(large.mean() + 0.25) < 1e-3 and abs(large.std() - 0.05) < 1e-3


PINNED = "8eeb104e6abeffb2b2ba5c3a74554a3459698ad5a63c542e8ab9d4eefc9db430"


def test_a_target_without_launch_tables_writes_no_model_bundle(small_cnn_onnx, host, tmp_path):
    model = load_model(small_cnn_onnx, {"x": (1, 3, 16, 16)})
    fused = fuse(model, host)
    with pytest.raises(TuningConfigError, match="compiles no device code with launch tables"):
        write_model_bundle(fused, {}, host, tmp_path / "b", name="cnn", inputs=model.inputs, tolerance=Tolerance(1e-3, 1e-3))


def test_the_cli_writes_a_model_round_and_imports_what_the_device_measured(small_cnn_onnx, tmp_path, capsys):
    from probtune.cli import main
    from probtune.database.database import Database

    round_, db = tmp_path / "round1", str(tmp_path / "t.db")
    assert main(["bundle", str(round_), "--device", "h200", "--model", str(small_cnn_onnx), "--input-shape", "x=1,3,16,16",
                 "--target", "cuda-sm90", "--precision", "fp16", "--candidates", "1", "--database", db]) == 0
    assert "0 of" in capsys.readouterr().out  # no task tuned on the device yet
    tasks = sorted((round_ / "tasks").glob("*/run_bundle.py"))
    assert tasks and (round_ / "model" / "run_model_bundle.py").is_file()
    env = {**os.environ, "PYTHONPATH": str(FAKE_CUPY), "FAKE_CUPY_LOG": str(tmp_path / "log"), "FAKE_CUPY_ANSWERS": "bundle"}
    ran = subprocess.run([sys.executable, str(tasks[0]), "--runtime", "cupy"], capture_output=True, text=True,
                         timeout=300, check=False, env=env)
    assert ran.returncode == 0, ran.stderr
    assert main(["import-results", str(round_), "--database", db]) == 0
    assert "1 task bundles recorded" in capsys.readouterr().out
    with Database(db) as database:
        assert database.count() >= 1


def test_a_model_that_cannot_become_a_bundle_is_a_named_error_and_nothing_is_written(small_cnn_onnx, tmp_path):
    from probtune.errors import ModelCompileError

    target = resolve_target("cuda-sm90")
    model = load_model(small_cnn_onnx, {"x": (1, 3, 16, 16)})
    fused = fuse(model, target)  # no programs: TVM's unscheduled loops bind no GPU thread
    with pytest.raises(ModelCompileError, match="cannot be written as a bundle for target 'cuda-sm90'"):
        write_model_bundle(fused, {}, target, tmp_path / "b", name="cnn", inputs=model.inputs,
                           tolerance=Tolerance(*TOLERANCES["fp16"]))
    assert not (tmp_path / "b" / "manifest.json").exists()


def test_a_malformed_input_shape_is_named_before_anything_runs(small_cnn_onnx, tmp_path, capsys):
    from probtune.cli import main

    assert main(["bundle", str(tmp_path / "r"), "--device", "h200", "--model", str(small_cnn_onnx),
                 "--input-shape", "1,3,16,16", "--target", "cuda-sm90"]) != 0
    assert "expected NAME=DIMS" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_bundle_whose_in_place_kernels_are_refused_is_written_out_of_place(small_cnn_onnx, tmp_path, monkeypatch):
    """A kernel written over its residual can spill registers where the program as measured did not (whisper's
    encoder did): the model is then placed with every output in a buffer of its own."""
    from probtune.model import bundle

    target = resolve_target("cuda-sm90")
    model, fused, programs = _fused(small_cnn_onnx, target)
    placed = bundle.place_programs
    tried = []

    def refusing_in_place(*args, in_place=True, **kwargs):
        tried.append(in_place)
        if in_place:
            raise RuntimeError("fused_conv2d_add_inplace0: main_kernel spills registers (8 bytes stored, 8 loaded)")
        return placed(*args, in_place=in_place, **kwargs)

    monkeypatch.setattr(bundle, "place_programs", refusing_in_place)
    written = write_model_bundle(fused, programs, target, tmp_path / "b", name="cnn:1", inputs=model.inputs,
                                 tolerance=Tolerance(*TOLERANCES["fp16"]), seeded_elements=SEEDED)
    assert tried == [True, False] and (written.path / MANIFEST).is_file()


def test_out_of_place_is_tried_only_where_in_place_is_refused_and_its_error_is_the_one_raised():
    from probtune.model.compile import out_of_place_if_refused

    assert out_of_place_if_refused(lambda in_place: in_place) is True

    def refused(in_place):
        raise ValueError(f"refused in_place={in_place}")

    with pytest.raises(ValueError, match="in_place=False"):
        out_of_place_if_refused(refused)
