"""What bench/bf16.py and bench/quantized.py share: a zoo model tuned by bench/zoo.py's worker in a fresh process,
engines' timings turned into a result, and the command line and result file of a run over several models.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from common import cpu_model
from isolated import median_ratio

HERE = Path(__file__).resolve().parent
ZOO = HERE / "zoo"
RESULTS = HERE / "results"


def tune_in_worker(
    name: str, entry: dict, path: Path, args: argparse.Namespace, scratch: Path, precision: str = "fp32",
    without_modules: str = "",
) -> dict:
    """bench/zoo.py's worker on ``path``: tuned (in ``precision``, the space without the comma-separated
    ``without_modules``), compiled, checked and exported in a fresh process."""
    scratch.mkdir(parents=True, exist_ok=True)
    zoo = scratch / "zoo"
    zoo.mkdir(exist_ok=True)
    (zoo / "manifest.json").write_text(json.dumps({"models": {name: {**entry, "file": str(path.resolve())}}}))
    command = [sys.executable, str(HERE / "zoo.py"), "--worker", name, "--trials", str(args.trials), "--zoo", str(zoo),
               "--scratch", str(scratch), f"--precision={precision}", f"--without-modules={without_modules}"]
    try:
        done = subprocess.run(command, timeout=args.timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"stage": "timeout", "error": {"type": "timeout", "message": f"over {args.timeout} s"}}
    result_file = scratch / "result.json"
    if not result_file.is_file():
        return {"stage": "crash", "error": {"type": "crash", "message": f"exit {done.returncode}: {done.stderr[-1500:]}"}}
    return json.loads(result_file.read_text())


def timings(rounds: dict[str, list[float]], mine: str, speedup_key: str) -> dict:
    """Medians and per-round latencies of each engine, and the same-round speedup of engine ``mine`` over each other
    one (``speedup_key``: {"vs_<engine>": ratio})."""
    return {
        "latency_ms": {k: round(float(np.median(v)) * 1e3, 3) for k, v in rounds.items()},
        "latency_ms_per_round": {k: [round(t * 1e3, 3) for t in v] for k, v in rounds.items()},
        speedup_key: {f"vs_{k}": round(median_ratio(v, rounds[mine]), 3) for k, v in rounds.items() if k != mine},
    }


def parser(description: str, out: str) -> argparse.ArgumentParser:
    """The options every such bench takes; ``out`` the default result file's name under bench/results."""
    parsed = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parsed.add_argument("--zoo", type=Path, default=ZOO, help="bench/zoo_export.py's folder (its manifest.json)")
    parsed.add_argument("--only", default="mobilenet_v2,resnet50,bert_base", help="comma-separated model names")
    parsed.add_argument("--trials", type=int, default=0, help="per model and form (0: default programs)")
    parsed.add_argument("--timeout", type=float, default=3600.0, help="seconds one tuning process may take")
    parsed.add_argument("--rounds", type=int, default=5)
    parsed.add_argument("--round-seconds", type=float, default=1.0)
    parsed.add_argument("--out", type=Path, default=RESULTS / out)
    parsed.add_argument("--check-only", action="store_true",
                        help="tune, compile and check the low-precision form only: no float32 form, no timings")
    return parsed


def run_models(args: argparse.Namespace, bench_model: Callable[[str, dict, argparse.Namespace], dict]) -> list[dict]:
    """``bench_model`` on each of ``--only``, the results file written after each; exits naming models not exported."""
    manifest = json.loads((args.zoo / "manifest.json").read_text())["models"]
    names = [n for n in args.only.split(",") if n]
    missing = [n for n in names if n not in manifest or "error" in manifest[n]]
    if missing:
        sys.exit(f"not in {args.zoo}/manifest.json: {', '.join(missing)}; export them first "
                 f"(make bench-zoo-export ZOO_ARGS=\"--only {' '.join(missing)}\")")
    results = []
    for name in names:
        results.append(bench_model(name, manifest[name], args))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": cpu_model(), "trials": args.trials, "models": results}, indent=1))
    return results
