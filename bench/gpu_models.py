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
    from probtune.bundle import write_bundle
    from probtune.targets import resolve_target

    spec = resolve_target(TARGET)
    root = Path(args.round)
    written: dict[str, Any] = {"models": {}, "tasks": {}}
    tasks: dict[str, Any] = {}
    for name, batch in _specs(args.models):
        started = time.perf_counter()
        model, fused, model_tasks, programs, tuned = _model(name, batch, spec, args.database, args.seed)
        from probtune.model.bundle import Tolerance, write_model_bundle
        from probtune.model.precision import TOLERANCES

        slug = f"{name}_b{batch}"
        result = write_model_bundle(fused, programs, spec, root / "models" / slug, name=f"{name}:{batch}",
                                    inputs=model.inputs, tolerance=Tolerance(*TOLERANCES["fp16"]), seed=args.seed)
        written["models"][slug] = {"functions": result.functions, "launches": result.launches, "tasks": len(model_tasks),
                                   "tuned_tasks": tuned, "carried_mb": result.carried_bytes / 1e6,
                                   "seeded_mb": result.seeded_bytes / 1e6, "seconds": time.perf_counter() - started,
                                   "task_weights": {t.name: t.weight for t in model_tasks}}
        print(f"{slug}: {written['models'][slug]}", flush=True)
        for task in model_tasks:
            tasks.setdefault(task.workload.key, task)
    for index, task in enumerate(tasks.values() if args.candidates else []):
        started = time.perf_counter()
        folder = root / "tasks" / f"{index:03d}_{task.name[:60]}"
        try:
            done = write_bundle(task.workload, folder, device=DEVICE, target=spec, database=args.database,
                                candidates=args.candidates, seed=args.seed)
        except Exception as exc:  # noqa: BLE001 - a task whose space is exhausted or cannot build: named, the rest go on
            print(f"{folder.name}: no bundle ({exc})", flush=True)
            continue
        written["tasks"][folder.name] = {"candidates": done.candidates, "build_errors": done.build_errors,
                                         "seconds": time.perf_counter() - started}
        print(f"{folder.name}: {written['tasks'][folder.name]}", flush=True)
    (root / "prepared.json").write_text(json.dumps(written, indent=1))
    return 0


def _model(name: str, batch: int, spec: Any, database: str, seed: int) -> tuple[Any, Any, list[Any], dict[str, Any], int]:
    """The model in float16, fused for ``spec``; its tasks, each function's program, and how many tasks are tuned."""
    import dataclasses

    from probtune.database import Database
    from probtune.model.compile import default_programs
    from probtune.model.importer import load_model
    from probtune.model.precision import convert_precision
    from probtune.model.tasks import extract_tasks, fuse
    from probtune.session import best_replayable
    from probtune.space import generate_space

    manifest = json.loads((ZOO / "manifest.json").read_text())["models"][name]
    shapes = {item["name"]: ",".join(str(d) for d in [batch, *item["shape"][1:]]) for item in manifest["inputs"]}
    model = load_model(ZOO / manifest["file"], shapes)
    fused = fuse(dataclasses.replace(model, mod=convert_precision(model.mod, "fp16")), spec)
    tasks = extract_tasks(fused)
    spaces = [(task.functions, generate_space(task.workload, spec, seed=seed), task.workload.mod) for task in tasks]
    programs = default_programs(spaces, seed, spec)
    tuned = 0
    with Database(database) as db:
        keyed = dataclasses.replace(spec, name=db.measured_on(spec.name, spec.tvm_target, DEVICE))
        for task, (functions, space, _) in zip(tasks, spaces):
            best = best_replayable(db, db.commit_workload(task.workload.key, task.workload.mod), keyed, space)
            if best is not None:
                programs.update({function: best.program for function in functions})
                tuned += 1
    return model, fused, tasks, programs, tuned


def _collect(args: argparse.Namespace) -> int:
    from probtune.bundle import import_results

    root = Path(args.round)
    with tarfile.open(args.results) as packed:
        packed.extractall(root.parent, filter="data")
    for folder in sorted((root / "tasks").glob("*/")) if (root / "tasks").is_dir() else []:
        try:
            done = import_results(folder, args.database)
        except Exception as exc:  # noqa: BLE001 - a bundle the device did not reach: named, the rest recorded
            print(f"{folder.name}: not recorded ({exc})", flush=True)
            continue
        print(f"{folder.name}: {dict(done.statuses)}, best {done.best_latency}", flush=True)
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
        row: dict[str, Any] = {"model": model, "batch": int(batch), "status": result["status"],
                               "probtune_ms": ours, "check": result.get("check")}
        for baseline in torch["results"]:
            if baseline["model"] == model and baseline["batch"] == int(batch) and "median_ms" in baseline:
                row[f"torch_{baseline['mode']}_ms"] = baseline["median_ms"]
                row[f"speedup_vs_{baseline['mode']}"] = baseline["median_ms"] / ours if ours else None
        row["heaviest"] = sorted(result.get("functions", {}).items(), key=lambda kv: -kv[1]["seconds"])[:5]
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "heaviest"}), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": torch.get("device"), "rows": rows}, indent=1))
    return 0


def _median(values: list[float] | None) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[len(ordered) // 2] * 1e3


if __name__ == "__main__":
    sys.exit(main())
