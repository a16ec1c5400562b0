"""Tune fp32 matmul 512^3 for 64 trials; print probtune's best GFLOPS next to numpy's, measured in the same run.

Run with ``make bench`` (or ``.venv/bin/python bench/tune_matmul.py --trials 64``).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

# numpy's BLAS uses every core; give TVM's in-process thread pool the same (its x86 default is half)
os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count()))

import numpy as np
import tvm

import probtune
from probtune.workloads.workload import parse_shape

CALLS_PER_REPEAT = 5


def numpy_seconds(a: np.ndarray, b: np.ndarray, repeat: int) -> float:
    a @ b
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(CALLS_PER_REPEAT):
            a @ b
        times.append((time.perf_counter() - start) / CALLS_PER_REPEAT)
    return float(np.median(times))


def probtune_seconds(lib, a: np.ndarray, b: np.ndarray, repeat: int) -> float:
    """The tuned program timed in this process, the way numpy is timed, for a like-for-like ratio."""
    dev = tvm.cpu()
    tensors = [tvm.runtime.tensor(x, dev) for x in (a, b, np.zeros((a.shape[0], b.shape[1]), "float32"))]
    evaluator = lib.mod.time_evaluator("main", dev, number=CALLS_PER_REPEAT, repeat=repeat)
    return float(np.median(evaluator(*tensors).results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="512,512,512")
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--target", default="host")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--out", default="bench/results/tune_matmul.json")
    args = parser.parse_args()

    m, n, k = parse_shape(args.shape)
    flops = 2.0 * m * n * k
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        result = probtune.tune(
            "matmul", target=args.target, trials=args.trials, shape=(m, n, k),
            database=Path(scratch) / "bench.db", seed=args.seed,
        )
        tuning_wall = time.perf_counter() - started
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype("float32")
    b = rng.standard_normal((k, n)).astype("float32")
    lib = result.build()
    ours = probtune_seconds(lib, a, b, args.repeat)
    theirs = numpy_seconds(a, b, args.repeat)
    report = {
        "workload": result.workload.key,
        "target": args.target,
        "trials": result.measured,
        "statuses": dict(result.statuses),
        "tuning_wall_seconds": round(tuning_wall, 2),
        "probtune_best_recorded_ms": round(result.best_latency * 1e3, 4),
        "probtune_ms": round(ours * 1e3, 4),
        "numpy_ms": round(theirs * 1e3, 4),
        "probtune_gflops": round(flops / ours / 1e9, 1),
        "numpy_gflops": round(flops / theirs / 1e9, 1),
        "probtune_over_numpy_speed": round(theirs / ours, 3),
    }
    print(json.dumps(report, indent=2))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
