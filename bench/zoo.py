"""The model zoo through probtune: each real architecture exported by bench/zoo_export.py, imported, tuned,
compiled, checked against onnxruntime and timed beside it; a table of where each model got and why it stopped.

    python bench/zoo.py [--only resnet50,unet] [--family cnn] [--trials 0] [--timeout 1800]

Each model runs in its own process (a crash or a hang costs only that model),
then onnxruntime (on two threads and on one) and the compiled model are
timed in turn, each in its own process (bench/isolated.py), on the same
inputs. The table counts the
transposes that remain in the model after the layout pass beside those the
model has in its own layouts, and the outcome: a correct compiled model, a
named probtune error (``probtune.errors``), or anything else (a bug).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
from common import cpu_model, geomean, say
from isolated import Engine, Worker, median_ratio, time_in_turn

THREADS = 2
ONE_THREAD = "onnxruntime_one_thread"  # onnxruntime on one thread: on a noisy machine, two are at times slower
ZOO = Path(__file__).parent / "zoo"
RESULTS = Path(__file__).parent / "results"
TRANSPOSE = re.compile(r"(?<!conv2d_)transpose")  # a transposition, not a transposed convolution


def transposes(fused: Any) -> dict[str, int]:
    """Calls of fused functions that transpose data (a transposed convolution is not one), and of those, the lone ones."""
    callees = re.findall(r"R\.call_tir\((\w+),", str(fused["main"]))
    moving = [name for name in callees if TRANSPOSE.search(name)]
    return {"calls": len(moving), "lone": sum(bool(re.fullmatch(r"(fused_)?transpose\d*", name)) for name in moving)}


def own_layout_transposes(model: Any) -> dict[str, int]:
    """:func:`transposes` of the model fused in its own layouts (the target's layout pass switched off)."""
    import dataclasses

    from probtune.model import fuse
    from probtune.targets import resolve_target

    return transposes(fuse(model, dataclasses.replace(resolve_target("host"), layouts={})))


def host_target(args: argparse.Namespace) -> Any:
    """This machine's target, with concatenations copied by a task of their own where ``--no-concat-in-place`` asks,
    and without the space modules ``--without-modules`` names."""
    import dataclasses

    from probtune.targets import resolve_target

    host = resolve_target("host")
    left_out = [m for m in (args.without_modules or "").split(",") if m]
    host = dataclasses.replace(host, modules=tuple(m for m in host.modules if m not in left_out))
    return dataclasses.replace(host, concat_in_place=False) if args.no_concat_in_place else host


def run_one(name: str, entry: dict, args: argparse.Namespace, scratch: Path) -> dict:
    """In the worker process: import, tune, compile, check and export one model; what happened at each stage."""
    import probtune
    from probtune.errors import ProbtuneError

    result: dict[str, Any] = {"model": name, "stage": "import", "seconds": {}}
    started = time.perf_counter()
    try:
        shapes = {spec["name"]: tuple(spec["shape"]) for spec in entry["inputs"]}
        model = probtune.load_model(args.zoo / entry["file"], shapes)
        result["seconds"]["import"] = round(time.perf_counter() - started, 1)
        result["stage"] = "tune"
        rewrites = None if args.graph_rewrites is None else [n for n in args.graph_rewrites.split(",") if n]
        tuned = probtune.tune_model(model, host_target(args), args.trials, database=scratch / "tuning.db", seed=0,
                                    graph_rewrites=rewrites, precision=args.precision)
        result["seconds"]["tune"] = round(tuned.seconds, 1)
        result["tasks"] = len(tuned.tasks)
        result["default_programs"] = sum(row.program == "default" for row in tuned.tasks)
        result["transposes"] = transposes(tuned.fused)
        result["transposes_own_layouts"] = own_layout_transposes(model)
        share = [row.share for row in tuned.tasks if TRANSPOSE.search(row.name) and row.share is not None]
        result["transpose_task_share"] = round(sum(share), 4) if share else None
        result["table"] = tuned.table()
        result["task_rows"] = [{"name": r.name, "weight": r.weight, "flops": r.flops, "best_latency": r.best_latency}
                               for r in tuned.tasks]
        result["stage"] = "compile"
        mark = time.perf_counter()
        compiled = tuned.compile()
        result["seconds"]["compile_and_check"] = round(time.perf_counter() - mark, 1)
        result["check"] = str(compiled.check)
        result["threads"] = compiled.num_threads
        if compiled.thread_choice is not None:
            result["thread_choice_ms"] = {n: round(t * 1e3, 4) for n, t in compiled.thread_choice.medians.items()}
        compiled.export_library(scratch / "compiled.so")
        result["stage"] = "done"
    except Exception as exc:  # noqa: BLE001 - every failure is the table's subject
        result["error"] = {"type": type(exc).__name__, "probtune": isinstance(exc, ProbtuneError),
                           "message": str(exc).strip()[:2000],
                           "where": [f"{Path(f.filename).name}:{f.lineno}" for f in traceback.extract_tb(exc.__traceback__)[-3:]]}
    result["seconds"]["total"] = round(time.perf_counter() - started, 1)
    return result


def bench_model(name: str, entry: dict, args: argparse.Namespace) -> dict:
    """One model: its worker process, then onnxruntime and the compiled model timed in turn."""
    with tempfile.TemporaryDirectory(prefix=f"zoo-{name}-") as folder:
        scratch = Path(folder)
        command = [sys.executable, __file__, "--worker", name, "--trials", str(args.trials), "--zoo", str(args.zoo),
                   "--scratch", str(scratch)]
        if args.graph_rewrites is not None:
            command.append(f"--graph-rewrites={args.graph_rewrites}")
        if args.no_concat_in_place:
            command.append("--no-concat-in-place")
        command.append(f"--precision={args.precision}")
        say(f"[{name}] {args.trials} trials in a fresh process")
        try:
            done = subprocess.run(command, timeout=args.timeout, capture_output=True, text=True)
            result = json.loads((scratch / "result.json").read_text()) if (scratch / "result.json").is_file() else {
                "model": name, "stage": "crash", "error": {"type": "crash", "probtune": False,
                                                           "message": f"exit {done.returncode}: {done.stderr[-1500:]}"}}
        except subprocess.TimeoutExpired:
            result = {"model": name, "stage": "timeout", "error": {"type": "timeout", "probtune": False,
                                                                   "message": f"over {args.timeout} s"}}
        result["family"] = entry.get("family")
        if result["stage"] == "done":
            result.update(time_against_onnxruntime(name, entry, args, scratch / "compiled.so", result["threads"]))
    say(f"[{name}] {summary_line(result)}")
    return result


def time_against_onnxruntime(name: str, entry: dict, args: argparse.Namespace, library: Path, threads: int) -> dict:
    """Latency of onnxruntime (on ``THREADS`` threads and on one) and of the compiled model (on the ``threads`` it
    chose), each alone in its own process, in turns. Beside the ratio to onnxruntime on ``THREADS``, the ratio to
    the faster of its two settings in each round: the compiled model has chosen its thread count."""
    from probtune.model import load_model

    shapes = {spec["name"]: tuple(spec["shape"]) for spec in entry["inputs"]}
    path = args.zoo / entry["file"]
    workers = {}
    try:
        workers["onnxruntime"] = Worker(Engine("onnxruntime", path, shapes, THREADS))
        workers["probtune"] = Worker(Engine("tvm", path, shapes, threads, library))
        if THREADS > 1:
            workers[ONE_THREAD] = Worker(Engine("onnxruntime", path, shapes, 1))
        inputs = load_model(path, shapes).random_inputs(0)
        rounds = time_in_turn(workers, inputs, args.rounds, args.round_seconds)
    except Exception as exc:  # noqa: BLE001 - the model's row says why it has no timing
        return {"timing_error": f"{type(exc).__name__}: {exc}"[:500]}
    finally:
        for worker in workers.values():
            worker.close()
    timed = {
        "latency_ms": {k: round(float(np.median(v)) * 1e3, 3) for k, v in rounds.items()},
        "latency_ms_per_round": {k: [round(t * 1e3, 3) for t in v] for k, v in rounds.items()},
        "speedup_vs_onnxruntime": round(median_ratio(rounds["onnxruntime"], rounds["probtune"]), 3),
    }
    if ONE_THREAD in rounds:
        fastest = np.minimum(rounds["onnxruntime"], rounds[ONE_THREAD])
        timed["speedup_vs_onnxruntime_one_thread"] = round(median_ratio(rounds[ONE_THREAD], rounds["probtune"]), 3)
        timed["speedup_vs_fastest_onnxruntime"] = round(median_ratio(list(fastest), rounds["probtune"]), 3)
    return timed


def summary_line(result: dict) -> str:
    if "error" in result:
        kind = "probtune error" if result["error"]["probtune"] else "UNEXPECTED"
        return f"stopped at {result['stage']}: {kind} {result['error']['type']}: {result['error']['message'][:300]}"
    speed, fastest = result.get("speedup_vs_onnxruntime"), result.get("speedup_vs_fastest_onnxruntime")
    return (f"correct; {result.get('tasks')} tasks, transposes {result['transposes']['calls']} "
            f"(own layouts {result['transposes_own_layouts']['calls']}); "
            + (f"{speed:.3f}x onnxruntime" if speed else result.get("timing_error", ""))
            + (f", {fastest:.3f}x its faster thread count" if fastest else ""))


def table(results: list[dict]) -> str:
    """The zoo table in markdown: one row per model, then the counts."""
    lines = ["| model | family | outcome | tasks | transposes (own layouts) | threads | ms probtune | ms onnxruntime | "
             "x onnxruntime | x fastest onnxruntime |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        outcome = "correct" if r["stage"] == "done" else (
            f"{r['stage']}: {'named' if r['error']['probtune'] else 'UNEXPECTED'} {r['error']['type']}")
        latency = r.get("latency_ms", {})
        moved = f"{r['transposes']['calls']} ({r['transposes_own_layouts']['calls']})" if "transposes" in r else "-"
        speeds = [r.get(key) for key in ("speedup_vs_onnxruntime", "speedup_vs_fastest_onnxruntime")]
        lines.append(f"| {r['model']} | {r.get('family')} | {outcome} | {r.get('tasks', '-')} | {moved} | "
                     f"{r.get('threads', '-')} | "
                     f"{latency.get('probtune', '-')} | {latency.get('onnxruntime', '-')} | "
                     + " | ".join("-" if speed is None else f"{speed:.3f}" for speed in speeds) + " |")
    correct = [r for r in results if r["stage"] == "done"]
    speeds = [r["speedup_vs_onnxruntime"] for r in correct if r.get("speedup_vs_onnxruntime")]
    fastest = [r["speedup_vs_fastest_onnxruntime"] for r in correct if r.get("speedup_vs_fastest_onnxruntime")]
    unexpected = [r["model"] for r in results if "error" in r and not r["error"]["probtune"]]
    lines.append("")
    lines.append(f"{len(correct)} of {len(results)} correct; {len(unexpected)} ended in an unexpected error "
                 f"{unexpected}; onnxruntime/probtune geomean {geomean(speeds) or 0:.3f}, min {min(speeds, default=0):.3f}; "
                 f"against onnxruntime's faster thread count, geomean {geomean(fastest) or 0:.3f}, "
                 f"min {min(fastest, default=0):.3f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zoo", type=Path, default=ZOO, help="bench/zoo_export.py's folder (its manifest.json)")
    parser.add_argument("--only", default="", help="comma-separated model names, run in this order")
    parser.add_argument("--family", default="", help="comma-separated families (cnn, segmentation, ...)")
    parser.add_argument("--trials", type=int, default=0, help="per model (0: default programs, compiled and checked)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds one model's process may take")
    parser.add_argument("--graph-rewrites", help="comma-separated graph rewrites instead of the target's ('' for none)")
    parser.add_argument("--no-concat-in-place", action="store_true",
                        help="copy concatenations in a task of their own (to compare with their producers writing them)")
    parser.add_argument("--precision", default="fp32", help="what tune-model computes the products in (fp32, bf16...)")
    parser.add_argument("--without-modules", default="", help="comma-separated space modules the host's space leaves out")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--round-seconds", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=RESULTS / "zoo.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    manifest = json.loads((args.zoo / "manifest.json").read_text())["models"]
    if args.worker:
        result = run_one(args.worker, manifest[args.worker], args, args.scratch)
        (args.scratch / "result.json").write_text(json.dumps(result))
        return
    names = [n for n in manifest if "error" not in manifest[n]]
    if args.only:
        names = [n for n in args.only.split(",") if n in names]  # in the order asked
    if args.family:
        names = [n for n in names if manifest[n].get("family") in args.family.split(",")]
    results = []
    for name in names:
        results.append(bench_model(name, manifest[name], args))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": cpu_model(), "trials": args.trials, "graph_rewrites": args.graph_rewrites,
                                        "concat_in_place": not args.no_concat_in_place, "models": results}, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
