"""The side-by-side benchmark runs end to end on a tiny problem (slow: run with ``pytest -m slow``)."""

from __future__ import annotations

import json
import subprocess
import sys
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
