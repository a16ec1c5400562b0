"""Whole models on a GPU this machine does not reach, in float16, tuned in rounds of bundles, against PyTorch.

``prepare ROUND`` imports each model (a zoo ONNX file, at the batch named),
converts it to float16, fuses it for the CUDA target and writes a model bundle
(:mod:`probtune.model.bundle`) with each task's best record measured on the
device so far (a default program where none is), and, with ``--candidates``,
a bundle of new candidates per task (the search and cost model as in
``probtune bundle``). On the GPU machine, ``bench/gpu_models_measure.py ROUND
--out DIR`` runs them and PyTorch on the same architectures; ``collect ROUND
DIR/ROUND.tar.gz`` records the tasks' results here, and the next ``prepare``
goes on from there. ``report ROUND`` writes the round's figures to
``bench/results/``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "bench" / "zoo"
TARGET = "cuda-sm90"
DEVICE = "h200"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    prepare = sub.add_parser("prepare", help="write a round's model bundles (and task bundles) into ROUND")
    prepare.add_argument("round")
    prepare.add_argument("--models", default="bert_base:1,resnet50:1", help="zoo models with their batch: name:batch,...")
    prepare.add_argument("--database", default=".gpu/models.db")
    prepare.add_argument("--candidates", type=int, default=0, help="new candidates per task (0: model bundles only)")
    prepare.add_argument("--seed", type=int, default=0)
    prepare.add_argument("--max-tasks", type=int, default=None, help="candidates for this many tasks at most")
    prepare.add_argument("--profiled-round", help="a measured round: its models' per-function times order the tasks")
    prepare.add_argument("--reference-mb", type=float, default=16.0, help="a task's larger reference travels as a seed")
    collect = sub.add_parser("collect", help="record the tasks' results of a measured round")
    collect.add_argument("round")
    collect.add_argument("results", help="the packed results gpu_models_measure.py wrote")
    collect.add_argument("--database", default=".gpu/models.db")
    report = sub.add_parser("report", help="the round's models against PyTorch, into bench/results/")
    report.add_argument("round")
    report.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_models.json"))
    args = parser.parse_args()
    return {"prepare": _prepare, "collect": _collect, "report": _report}[args.command](args)


def _specs(text: str) -> list[tuple[str, int]]:
    specs = []
    for item in text.split(","):
        name, _, batch = item.partition(":")
        specs.append((name, int(batch or 1)))
    return specs


def _prepare(args: argparse.Namespace) -> int:
    from probtune.measure.bundle import write_bundle
    from probtune.targets import resolve_target

    spec = resolve_target(TARGET)
    root = Path(args.round)
    written: dict[str, Any] = {"models": {}, "tasks": {}}
    by_model: list[list[Any]] = []
    from probtune.errors import ProbtuneError
    from probtune.model.bundle import Tolerance, write_model_bundle
    from probtune.model.precision import TOLERANCES

    for name, batch in _specs(args.models):
        started, slug = time.perf_counter(), f"{name}_b{batch}"
        try:
            model, fused, model_tasks, programs, tuned = _model(name, batch, spec, args.database, args.seed)
            result = write_model_bundle(fused, programs, spec, root / "models" / slug, name=f"{name}:{batch}",
                                        inputs=model.inputs, tolerance=Tolerance(*TOLERANCES["fp16"]), seed=args.seed)
        except Exception as exc:  # noqa: BLE001 - a model that does not import, compile or bundle (or a bug it
            # meets): named with its error, the others go on
            written["models"][slug] = {"error": str(exc) if isinstance(exc, ProbtuneError) else f"{type(exc).__name__}: {exc}"}
            print(f"{slug}: {exc}", flush=True)
            continue
        written["models"][slug] = {"functions": result.functions, "launches": result.launches, "tasks": len(model_tasks),
                                   "tuned_tasks": tuned, "carried_mb": result.carried_bytes / 1e6,
                                   "seeded_mb": result.seeded_bytes / 1e6, "seconds": time.perf_counter() - started,
                                   "task_weights": {t.name: t.weight for t in model_tasks}}
        print(f"{slug}: {written['models'][slug]}", flush=True)
        by_model.append(model_tasks)
    order = _by_profile(by_model, Path(args.profiled_round)) if args.profiled_round else _interleaved(by_model)
    for index, task in enumerate(order[: args.max_tasks] if args.candidates else []):
        started = time.perf_counter()
        folder = root / "tasks" / f"{index:03d}_{task.name[:60]}"
        try:
            done = write_bundle(task.workload, folder, device=DEVICE, target=spec, database=args.database,
                                candidates=args.candidates, seed=args.seed, reference_mb=args.reference_mb)
        except Exception as exc:  # noqa: BLE001 - a task whose space is exhausted or cannot build: named, the rest go on
            print(f"{folder.name}: no bundle ({exc})", flush=True)
            continue
        written["tasks"][folder.name] = {"candidates": done.candidates, "build_errors": done.build_errors,
                                         "seconds": time.perf_counter() - started}
        print(f"{folder.name}: {written['tasks'][folder.name]}", flush=True)
    (root / "prepared.json").write_text(json.dumps(written, indent=1))
    return 0


def _interleaved(by_model: list[list[Any]]) -> list[Any]:
    """The models' tasks, each model's heaviest first, taken in turns (a round cut short has measured each model's
    heaviest tasks); a task two models share, once."""
    seen: set[str] = set()
    order = []
    for rank in range(max((len(tasks) for tasks in by_model), default=0)):
        for tasks in by_model:
            if rank < len(tasks) and tasks[rank].workload.key not in seen:
                seen.add(tasks[rank].workload.key)
                order.append(tasks[rank])
    return order


def _by_profile(by_model: list[list[Any]], measured: Path) -> list[Any]:
    """The tasks by the GPU time their functions took in a measured round's models, the most first."""
    seconds: dict[str, float] = {}
    for result in measured.glob("models/*/results.json"):
        for function, timing in json.loads(result.read_text()).get("functions", {}).items():
            base = re.sub(r"_inplace\d*$", "", function)
            seconds[base] = seconds.get(base, 0.0) + timing["seconds"]
    tasks = {task.workload.key: task for tasks in by_model for task in tasks}
    return sorted(tasks.values(), key=lambda task: -sum(seconds.get(name, 0.0) for name in task.functions))


def _model(name: str, batch: int, spec: Any, database: str, seed: int) -> tuple[Any, Any, list[Any], dict[str, Any], int]:
    """The model in float16, fused for ``spec``; its tasks, each function's program, and how many tasks are tuned."""
    import dataclasses

    from probtune.model.importer import load_model
    from probtune.model.precision import convert_precision
    from probtune.model.rounds import model_programs
    from probtune.model.tasks import extract_tasks, fuse

    manifest = json.loads((ZOO / "manifest.json").read_text())["models"][name]
    shapes = {item["name"]: ",".join(str(d) for d in [batch, *item["shape"][1:]]) for item in manifest["inputs"]}
    model = load_model(_with_batch(ZOO / manifest["file"], batch, manifest["inputs"]), shapes)
    fused = fuse(dataclasses.replace(model, mod=convert_precision(model.mod, "fp16")), spec)
    tasks = extract_tasks(fused)
    programs, tuned = model_programs(fused, tasks, spec, database, DEVICE, seed)
    return model, fused, tasks, programs, tuned


def _with_batch(path: Path, batch: int, inputs: list[dict[str, Any]]) -> Path:
    """The zoo file, or where it fixes its inputs at another batch (the zoo exports batch one), a copy beside it whose
    inputs and outputs leave the batch free: the importer then takes ``batch``, for a graph that fixes it nowhere else
    (ResNet-50 flattens with Flatten; a model that reshapes to a batch of one fails there, named by TVM)."""
    if all(item["shape"][0] == batch for item in inputs):
        return path
    import onnx

    model = onnx.load(str(path))
    for value in [*model.graph.input, *model.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].dim_param = "batch"
    del model.graph.value_info[:]
    copy = path.with_name(f"{path.stem}.free_batch.onnx")
    onnx.save(model, str(copy))
    return copy


def _collect(args: argparse.Namespace) -> int:
    from probtune.model.rounds import import_model_round

    root = Path(args.round)
    with tarfile.open(args.results) as packed:
        packed.extractall(root.parent, filter="data")
    for folder, done in import_model_round(root, args.database).items():
        print(f"{folder}: {dict(done.statuses)}, best {done.best_latency}", flush=True)
    return 0


def _report(args: argparse.Namespace) -> int:
    root = Path(args.round)
    torch = json.loads((root / "torch.json").read_text()) if (root / "torch.json").is_file() else {"results": []}
    rows = []
    for folder in sorted((root / "models").glob("*/")):
        result_file = folder / "results.json"
        result = json.loads(result_file.read_text()) if result_file.is_file() else {"status": "not run"}
        model, batch = json.loads((folder / "manifest.json").read_text())["model"].split(":")
        ours = _median(result.get("latency_s"))
        spread = [min(result["latency_s"]) * 1e3, max(result["latency_s"]) * 1e3] if result.get("latency_s") else None
        prepared = _prepared(root)["models"].get(folder.name, {})
        row: dict[str, Any] = {"model": model, "batch": int(batch), "status": result["status"],
                               "probtune_ms": ours, "probtune_range_ms": spread, "tuned_tasks": prepared.get("tuned_tasks"),
                               "tasks": prepared.get("tasks"), "launches": result.get("launches"), "check": result.get("check")}
        for baseline in torch["results"]:
            if baseline["model"] == model and baseline["batch"] == int(batch) and "median_ms" in baseline:
                row[f"torch_{baseline['mode']}_ms"] = baseline["median_ms"]
                row[f"torch_{baseline['mode']}_range_ms"] = [baseline["min_ms"], baseline["max_ms"]]
                row[f"speedup_vs_{baseline['mode']}"] = baseline["median_ms"] / ours if ours else None
        row["heaviest"] = sorted(result.get("functions", {}).items(), key=lambda kv: -kv[1]["seconds"])[:5]
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "heaviest"}), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": torch.get("device"), "rows": rows}, indent=1))
    return 0


def _prepared(root: Path) -> dict[str, Any]:
    """What ``prepare`` wrote of the round (nothing, where it was stopped before the end)."""
    path = root / "prepared.json"
    return json.loads(path.read_text()) if path.is_file() else {"models": {}, "tasks": {}}


def _median(values: list[float] | None) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[len(ordered) // 2] * 1e3


if __name__ == "__main__":
    sys.exit(main())
