"""Whole models end to end: probtune against onnxruntime, OpenVINO, TVM MetaSchedule and TVM's untuned build.

Each model (bench/model_zoo.py: ResNet-50, MobileNetV2, BERT-base, random
weights) is tuned by probtune (``tune_model``) and by TVM MetaSchedule
(``tune_relax`` on the same imported Relax module, fused by TVM's "zero"
pipeline in the model's own layouts as TVM leaves them, the same total
trials, its default task scheduler, 64 trials per iteration), each in a fresh
process; then every compiled model, onnxruntime and OpenVINO (when it can be
installed) are loaded each in its own process (bench/isolated.py) and timed in
turn, on 2 threads, and every output is checked against onnxruntime's.
Writes bench/results/models.json and a plot.

    python bench/models.py --models resnet50,mobilenet_v2,bert_base --trials 2000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import tvm
from common import cpu_model, ms_build_without_intrinsics, say, tvm_import_intrinsics  # sets TVM_NUM_THREADS
from isolated import Engine, Worker, median_ratio, time_in_turn
from model_zoo import MODELS
from tvm import relax

from probtune.model import load_model, tune_model
from probtune.model.check import check_outputs
from probtune.targets import resolve_target

THREADS = 2
RESULTS = Path(__file__).parent / "results"
TVM_TRIALS_PER_ITER = 64  # MetaSchedule's own default; with fewer trials than 64 per task it leaves tasks untuned


def tune_probtune(model_path: Path, shapes: dict, args: argparse.Namespace, out: Path) -> dict:
    database = out / "probtune.db"
    result = tune_model(model_path, args.target, args.trials, input_shapes=shapes, database=database, seed=args.seed)
    compiled = result.compile()
    compiled.export_library(out / "compiled.so")
    rows = sorted(result.tasks, key=lambda row: -(row.share or 0))
    return {
        "tuning_wall_seconds": round(result.seconds, 1),
        "search_seconds": round(result.search_seconds, 1),
        "measure_seconds": round(result.measure_seconds, 1),
        "trials": result.trials,
        "tasks": len(result.tasks),
        "default_programs": sum(row.program == "default" for row in result.tasks),
        "estimated_ms": None if result.estimated_latency is None else round(result.estimated_latency * 1e3, 3),
        "top_tasks": [
            {"task": r.name, "weight": r.weight, "trials": r.trials,
             "ms": None if r.best_latency is None else round(r.best_latency * 1e3, 4),
             "share": None if r.share is None else round(r.share, 3)} for r in rows[:5]
        ],
    }


def tune_tvm(model_path: Path, shapes: dict, args: argparse.Namespace, out: Path) -> dict:
    import tvm.s_tir.meta_schedule as ms

    intrinsics = tvm_import_intrinsics()
    target = tvm.target.Target(resolve_target(args.target).tvm_target)
    model = load_model(model_path, shapes)
    with target:
        prepared = tvm.transform.Sequential([relax.transform.DecomposeOpsForInference(),
                                             relax.transform.CanonicalizeBindings()])(model.mod)
        fused = relax.get_pipeline("zero")(prepared)
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    started = time.perf_counter()
    database = ms.relax_integration.tune_relax(
        fused, {}, target, str(out / "ms"), max_trials_global=args.trials, num_trials_per_iter=args.tvm_trials_per_iter,
        builder=ms.builder.LocalBuilder(f_build=ms_build_without_intrinsics), seed=args.seed,
    )
    wall = time.perf_counter() - started
    with target, database:
        tuned = relax.transform.MetaScheduleApplyDatabase()(fused)
    tvm.compile(tuned, target).export_library(str(out / "compiled.so"))
    tasks = ms.relax_integration.extract_tasks(fused, target)
    rows = []
    for task in tasks:
        workload = database.commit_workload(task.dispatched[0])
        best = database.get_top_k(workload, 1)
        seconds = float(np.mean([float(x) for x in best[0].run_secs])) if best and best[0].run_secs else None
        rows.append({"task": task.task_name, "weight": int(task.weight), "ms": None if seconds is None else round(seconds * 1e3, 4),
                     "weighted": None if seconds is None else seconds * int(task.weight)})
    total = sum(r["weighted"] or 0 for r in rows)
    for row in rows:
        row["share"] = None if row["weighted"] is None or not total else round(row.pop("weighted") / total, 3)
        row.pop("weighted", None)
    return {
        "tuning_wall_seconds": round(wall, 1),
        "tensor_intrin_import_seconds": round(intrinsics, 1),
        "trials": args.trials,
        "tasks": len(tasks),
        "top_tasks": sorted(rows, key=lambda r: -(r["share"] or 0))[:5],
    }


TUNERS: dict[str, Callable[..., dict]] = {"probtune": tune_probtune, "tvm": tune_tvm}


def tune_fresh(system: str, name: str, model_path: Path, args: argparse.Namespace, out: Path) -> dict:
    """Tune in a new Python process (no state shared with the other system); its report."""
    command = [sys.executable, __file__, "--tune-one", system, name, str(model_path), str(out),
               "--trials", str(args.trials), "--seed", str(args.seed), "--target", args.target,
               "--tvm-trials-per-iter", str(args.tvm_trials_per_iter)]
    if subprocess.run(command).returncode != 0:
        raise RuntimeError(f"{system}'s tuning process failed")
    return json.loads((out / "report.json").read_text())


def untuned_build(model_path: Path, shapes: dict, args: argparse.Namespace, out: Path) -> None:
    """TVM's own build of the model as imported: its layouts, no tuning."""
    model = load_model(model_path, shapes)
    target = tvm.target.Target(resolve_target(args.target).tvm_target)
    with target:
        fused = relax.get_pipeline("zero")(model.mod)
    tvm.compile(fused, target).export_library(str(out / "compiled.so"))


def bench_model(name: str, args: argparse.Namespace, scratch: Path) -> dict:
    build, shapes = MODELS[name]
    model_path = scratch / f"{name}.onnx"
    onnx.save(build(), model_path)
    model = load_model(model_path, shapes)
    entry: dict[str, Any] = {"model": name, "inputs": {s.name: list(s.shape) for s in model.inputs}, "problems": []}
    engines = {"onnxruntime": Engine("onnxruntime", model_path, shapes, THREADS),
               "openvino": Engine("openvino", model_path, shapes, THREADS)}
    for system in args.systems:
        out = scratch / f"{name}-{system}"
        out.mkdir()
        say(f"[{name}] {system}: {args.trials} trials in a fresh process")
        try:
            entry[system] = tune_fresh(system, name, model_path, args, out)
        except Exception as exc:  # noqa: BLE001 - one system failing must not stop the others
            entry["problems"].append(f"{system}: {exc}")
            continue
        engines[system] = Engine("tvm", model_path, shapes, THREADS, out / "compiled.so")
    if args.untuned:
        out = scratch / f"{name}-untuned"
        out.mkdir()
        untuned_build(model_path, shapes, args, out)
        engines["tvm_untuned"] = Engine("tvm", model_path, shapes, THREADS, out / "compiled.so")
    workers = start_workers(engines, entry)
    try:
        inputs = model.random_inputs(0)
        for system, worker in list(workers.items()):
            if system != "onnxruntime":
                try:
                    entry.setdefault("checks", {})[system] = str(check_outputs(model, worker))
                except Exception as exc:  # noqa: BLE001 - a wrong result is reported, and its timing left out
                    entry["problems"].append(f"{system}: {exc}")
                    workers.pop(system).close()
        fast = {k: v for k, v in workers.items() if k != "tvm_untuned"}
        rounds = time_in_turn(fast, inputs, args.rounds, args.round_seconds)
        if "tvm_untuned" in workers:
            rounds.update(time_in_turn({"tvm_untuned": workers["tvm_untuned"]}, inputs, 1, 0.0))
    finally:
        for worker in workers.values():
            worker.close()
    latency = {k: float(np.median(v)) for k, v in rounds.items()}
    entry["latency_ms"] = {k: round(v * 1e3, 3) for k, v in latency.items()}
    entry["latency_ms_per_round"] = {k: [round(t * 1e3, 3) for t in v] for k, v in rounds.items()}
    entry["speedup_vs_onnxruntime"] = {  # same-round ratios: the machine's speed drifts between rounds
        k: round(median_ratio(rounds["onnxruntime"], v) if k in fast else latency["onnxruntime"] / latency[k], 3)
        for k, v in rounds.items()
    }
    if "probtune" in latency and "tvm" in latency:
        entry["probtune_speedup_vs_tvm"] = round(median_ratio(rounds["tvm"], rounds["probtune"]), 3)
        entry["tuning_time_ratio_probtune_vs_tvm"] = round(
            entry["probtune"]["tuning_wall_seconds"] / entry["tvm"]["tuning_wall_seconds"], 3)
    say(f"[{name}] " + ", ".join(f"{k} {v:.3f} ms ({entry['speedup_vs_onnxruntime'][k]:.3f}x)" for k, v in entry["latency_ms"].items()))
    return entry


def start_workers(engines: dict[str, Engine], entry: dict) -> dict[str, Worker]:
    """A worker process per engine; one that cannot be loaded is a problem in ``entry`` (onnxruntime must load)."""
    workers = {}
    for system, engine in engines.items():
        try:
            workers[system] = Worker(engine)
        except RuntimeError as exc:
            if system == "onnxruntime":
                raise
            entry["problems"].append(str(exc))
    return workers


def plot(entries: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = ["probtune", "tvm", "onnxruntime", "openvino"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.2
    for offset, system in enumerate(systems):
        values = [e.get("speedup_vs_onnxruntime", {}).get(system, 0) for e in entries]
        ax.bar([i + (offset - 1.5) * width for i in range(len(entries))], values, width, label=system)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks(range(len(entries)), [e["model"] for e in entries])
    ax.set_ylabel("speed vs onnxruntime (higher is faster)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,mobilenet_v2,bert_base")
    parser.add_argument("--systems", default="probtune,tvm", help="tuners to run: probtune, tvm")
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", default="host")
    parser.add_argument("--tvm-trials-per-iter", type=int, default=TVM_TRIALS_PER_ITER,
                        help="MetaSchedule's num_trials_per_iter (its task scheduler gives each task that many at first)")
    parser.add_argument("--untuned", action="store_true", help="also time TVM's untuned build (very slow)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--round-seconds", type=float, default=0.5)
    parser.add_argument("--output", default=str(RESULTS / "models.json"))
    parser.add_argument("--keep", metavar="DIR", help="keep the ONNX files, databases and compiled models in DIR (a new folder)")
    parser.add_argument("--tune-one", nargs=4, metavar=("SYSTEM", "NAME", "ONNX", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tune_one:
        system, name, model_path, out = args.tune_one
        report = TUNERS[system](Path(model_path), MODELS[name][1], args, Path(out))
        (Path(out) / "report.json").write_text(json.dumps(report))
        return
    args.systems = [s for s in args.systems.split(",") if s]
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    report = {"machine": cpu_model(), "threads": THREADS, "trials": args.trials, "seed": args.seed,
              "tvm_trials_per_iter": args.tvm_trials_per_iter, "models": []}
    with contextlib.ExitStack() as stack:
        scratch = args.keep or stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-models-"))
        Path(scratch).mkdir(parents=True, exist_ok=not args.keep)  # kept results are never a continued run
        for name in args.models.split(","):
            report["models"].append(bench_model(name, args, Path(scratch)))
            output.write_text(json.dumps(report, indent=1))  # after each model: a long run stopped keeps the others
            plot(report["models"], output.with_suffix(".png"))
    say(f"written: {output}")


if __name__ == "__main__":
    main()
