"""The side-by-side benchmark runs end to end on a tiny problem (slow: run with ``pytest -m slow``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_space_vs_tvm_runs_on_a_tiny_matmul(tmp_path: Path) -> None:
    pytest.importorskip("cloudpickle", reason="TVM MetaSchedule needs requirements-bench.txt (make bench-space)")
    out = tmp_path / "space_vs_tvm.json"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "space_vs_tvm.py"), "--trials", "4",
         "--workloads", "matmul:64,64,64", "--rounds", "3", "--round-ms", "10", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "geometric mean TVM/probtune" in completed.stdout
    report = json.loads(out.read_text())
    assert report["trials"] == 4
    [entry] = report["workloads"]
    assert entry["workload"] == "matmul(64,64,64):float32"
    assert entry["problems"] == []
    for system in ("probtune", "tvm", "numpy"):
        assert entry[system]["correct"] is True
        assert entry[system]["ms"] > 0
    assert entry["probtune"]["measured"] == 4 and entry["tvm"]["measured"] == 4
    assert entry["tvm_over_probtune"] > 0
    assert report["geomean_tvm_over_probtune"] == entry["tvm_over_probtune"]


@pytest.mark.slow
def test_models_bench_runs_on_the_small_cnn(tmp_path: Path) -> None:
    pytest.importorskip("cloudpickle", reason="TVM MetaSchedule needs requirements-bench.txt (make bench-models)")
    out = tmp_path / "models.json"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "models.py"), "--models", "small_cnn", "--trials", "8",
         "--tvm-trials-per-iter", "4", "--rounds", "2", "--round-seconds", "0.05", "--untuned", "--output", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    [entry] = json.loads(out.read_text())["models"]
    assert set(entry["latency_ms"]) >= {"probtune", "tvm", "onnxruntime", "tvm_untuned"}
    assert all("outputs match" in text for text in entry["checks"].values())
    assert entry["probtune"]["trials"] == 8


@pytest.mark.slow
def test_the_gpu_bench_tunes_both_systems_through_bundles_on_a_fake_gpu(tmp_path: Path) -> None:
    """Two rounds of bench/cuda_gpu.py, their bundles measured by bench/gpu_measure.py with a stand-in CuPy."""
    pytest.importorskip("cloudpickle", reason="TVM MetaSchedule needs requirements-bench.txt")
    root, out = tmp_path / "gpu", tmp_path / "out"
    bench = [sys.executable, str(ROOT / "bench" / "cuda_gpu.py"), "--root", str(root), "--candidates", "4",
             "--workload", "matmul:256,256,256:float16"]

    def run(command: list[str], **env: str) -> str:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, env={**os.environ, **env})
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    run([*bench, "start", "--rounds", "2"])
    for number, systems in ((1, []), (2, []), (3, ["--systems", "probtune"])):  # MetaSchedule tunes two rounds
        run([*bench, *systems, "prepare", str(number)])
        run([sys.executable, str(ROOT / "bench" / "gpu_measure.py"), str(root / f"round{number}"), "--out", str(out)],
            PYTHONPATH=str(ROOT / "tests" / "fake_cupy"), FAKE_CUPY_LOG=str(tmp_path / "launches"),
            FAKE_CUPY_ANSWERS="bundle")
        run([*bench, *systems, "collect", str(number), str(out / f"round{number}.tar.gz")])
    run([*bench, "report", "--output", str(tmp_path / "report.json")])
    [row] = json.loads((tmp_path / "report.json").read_text())["workloads"]
    assert [entry["round"] for entry in row["rounds"]] == [1, 2, 3] and row["rounds"][2]["metaschedule"] is None
    for entry in row["rounds"]:
        for system in ("probtune", "metaschedule")[: 1 if entry["round"] == 3 else 2]:
            assert entry[system]["built"] >= 1 and entry[system]["statuses"] == {"ok": entry[system]["built"]}
            assert entry[system]["best_ms"] > 0
        kinds = entry["probtune"]["best_ms_by_kind"]
        assert kinds and all(best <= median for best, median in kinds.values())
    log = root / "state" / "metaschedule-matmul-256x256x256-float16.log"
    for _ in range(120):  # MetaSchedule's tuner ends once it has the round's results
        if "tuning is done" in log.read_text():
            break
        time.sleep(1)
    assert "tuning is done" in log.read_text()


def _tiny_zoo(folder: Path) -> Path:
    """A zoo of one model, examples.small_cnn, as bench/zoo_export.py's manifest lists its models."""
    import onnx

    from probtune.model.examples import small_cnn

    folder.mkdir()
    onnx.save(small_cnn(channels=8, size=16), folder / "small_cnn.onnx")
    entry = {"file": "small_cnn.onnx", "family": "cnn", "inputs": [{"name": "x", "shape": [1, 3, 16, 16]}]}
    (folder / "manifest.json").write_text(json.dumps({"models": {"small_cnn": entry}}))
    return folder


@pytest.mark.slow
@pytest.mark.parametrize(("script", "forms", "speedup"), [("bf16.py", ("bf16", "fp32"), "bf16_speedup"),
                                                          ("quantized.py", ("int8", "fp32"), "int8_speedup")])
def test_the_precision_benches_tune_both_forms_and_time_the_engines(tmp_path: Path, script, forms, speedup) -> None:
    pytest.importorskip("openvino", reason="the precision benches time OpenVINO (requirements-bench.txt)")
    from probtune.targets import resolve_target

    if script == "bf16.py" and "bf16" not in resolve_target("host").precisions:
        pytest.skip("this machine's target offers no bf16")
    out = tmp_path / "out.json"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--zoo", str(_tiny_zoo(tmp_path / "zoo")), "--only", "small_cnn",
         "--rounds", "2", "--round-seconds", "0.05", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    [entry] = json.loads(out.read_text())["models"]
    assert all(entry[form]["stage"] == "done" and "outputs match" in entry[form]["check"] for form in forms)
    assert all(len(rounds) == 2 for rounds in entry["latency_ms_per_round"].values())
    assert entry[speedup]["vs_probtune_fp32"] > 0
