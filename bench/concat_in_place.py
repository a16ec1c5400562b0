"""Concatenations written by their producers against copied by a task of their own, from the same tuned records.

Each zoo model is tuned once with its concatenations copied (so that their
tasks have tuned programs too), then compiled both ways from that one
database (the in-place build reuses every producer's record), each build
checked against onnxruntime; then onnxruntime and the two builds are timed in
turn, each in its own process. Ratios are medians over rounds of times taken
in the same round.

    .venv/bin/python bench/concat_in_place.py --only squeezenet1_1,googlenet --trials 1000
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from common import cpu_model, say
from isolated import Engine, Worker, median_ratio, time_in_turn
from zoo import RESULTS, THREADS, ZOO


def build_both(path: Path, shapes: dict[str, tuple[int, ...]], trials: int, scratch: Path) -> dict[str, Any]:
    """Tune with concatenations copied, then export both builds; their libraries, tasks and checks."""
    import probtune
    from probtune.targets import resolve_target

    model = probtune.load_model(path, shapes)
    host = resolve_target("host")
    builds: dict[str, Any] = {}
    for name, target, budget in (("copied", dataclasses.replace(host, concat_in_place=False), trials),
                                 ("in_place", host, 0)):
        tuned = probtune.tune_model(model, target, budget, database=scratch / "tuning.db", seed=0)
        compiled = tuned.compile()
        library = compiled.export_library(scratch / f"{name}.so")
        builds[name] = {"library": library, "tasks": len(tuned.tasks), "in_place_calls": compiled.in_place,
                        "check": str(compiled.check)}
    return builds


def bench_model(name: str, entry: dict, args: argparse.Namespace) -> dict:
    shapes = {spec["name"]: tuple(spec["shape"]) for spec in entry["inputs"]}
    path = args.zoo / entry["file"]
    with tempfile.TemporaryDirectory(prefix=f"concat-{name}-") as folder:
        say(f"[{name}] {args.trials} trials, concatenations copied; then compiled both ways")
        builds = build_both(path, shapes, args.trials, Path(folder))
        workers = {"onnxruntime": Worker(Engine("onnxruntime", path, shapes, THREADS))}
        try:
            for build, done in builds.items():
                workers[build] = Worker(Engine("tvm", path, shapes, THREADS, done["library"]))
            from probtune.model import load_model

            rounds = time_in_turn(workers, load_model(path, shapes).random_inputs(0), args.rounds, args.round_seconds)
        finally:
            for worker in workers.values():
                worker.close()
    result = {
        "model": name,
        "builds": {build: {k: v for k, v in done.items() if k != "library"} for build, done in builds.items()},
        "latency_ms_per_round": {k: [round(t * 1e3, 3) for t in v] for k, v in rounds.items()},
        "latency_ms": {k: round(float(np.median(v)) * 1e3, 3) for k, v in rounds.items()},
        "copied_over_in_place": round(median_ratio(rounds["copied"], rounds["in_place"]), 3),
        "onnxruntime_over_in_place": round(median_ratio(rounds["onnxruntime"], rounds["in_place"]), 3),
        "onnxruntime_over_copied": round(median_ratio(rounds["onnxruntime"], rounds["copied"]), 3),
    }
    say(f"[{name}] copied/in place {result['copied_over_in_place']}x; onnxruntime/in place "
        f"{result['onnxruntime_over_in_place']}x, onnxruntime/copied {result['onnxruntime_over_copied']}x")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=ZOO, help="bench/zoo_export.py's folder (its manifest.json)")
    parser.add_argument("--only", required=True, help="comma-separated model names")
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--round-seconds", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=RESULTS / "concat_in_place.json")
    args = parser.parse_args()
    manifest = json.loads((args.zoo / "manifest.json").read_text())["models"]
    results = []
    for name in args.only.split(","):
        results.append(bench_model(name, manifest[name], args))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": cpu_model(), "trials": args.trials, "models": results}, indent=1))


if __name__ == "__main__":
    main()
