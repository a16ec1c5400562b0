"""probtune's learning-driven search against TVM MetaSchedule's, side by side.

For each workload both systems tune from scratch with the same trial budget:
probtune with its evolutionary search and XGBoost cost model, TVM MetaSchedule
with ``tune_tir(strategy="evolutionary", cost_model="xgb")`` (its defaults for
CPU). Recorded for each: the best latency after every trial (from each
system's own measurements, for the curves and the checkpoints), total tuning
wall time and the part of it spent building and timing candidates, and the
peak memory of the tuning process plus its worker processes. Each system
tunes each workload in a fresh Python process (this script, ``--tune-one``),
so that its memory holds only that tuning, not what earlier tunings and
timings left in this one. Then the best
programs at each checkpoint are compiled and timed again here, interleaved
round by round with numpy and onnxruntime (2 threads), after checking every
output against the numpy reference.

Run with ``make bench-tune`` (or ``.venv/bin/python bench/tune_vs_tvm.py``);
``--trials 256 --checkpoints 64 128 256`` is the default. The report goes to
``bench/results/tune_vs_tvm.json`` and the plot to ``tune_vs_tvm.png`` next to
it. The exit status is 1 when a tuned program computes a wrong result or a
system fails with an error.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import tvm
import tvm.s_tir.meta_schedule as ms
from common import (  # first: it sets TVM_NUM_THREADS before TVM is imported
    MS_FAILED_SECONDS,
    Contender,
    bench_each,
    check_outputs,
    cpu_model,
    fmt,
    geomean,
    ms_build_without_intrinsics,
    numpy_contender,
    parse_workload,
    say,
    time_interleaved,
    tune_guarded,
    tvm_contender,
    tvm_import_intrinsics,
)
from tvm.ir.utils import derived_object

import probtune
from probtune import Database, Trace
from probtune.defaults import BATCH_SIZE
from probtune.errors import ProbtuneError
from probtune.measure.codegen import compile_for
from probtune.targets import resolve_target
from probtune.workloads.workload import Workload

DEFAULT_SUITE = (
    "matmul:1024,1024,1024",
    "conv2d_nchw:1,64,56,56,64,3,3,1,1",
    "dense_bias_relu:128,3072,768",
    "batch_matmul:12,128,128,64",
    "softmax:1024,1024",
)
PLOTTED = ("matmul", "conv2d_nchw")
RESULTS = Path(__file__).resolve().parent / "results"


# ---------------------------------------------------------------- peak memory


class PeakMemory:
    """Samples the resident memory of this process plus all its descendants; keeps the peak.

    Also kept: where that peak came from (this process, which is the tuning
    process, and its workers), and this process's size when sampling began,
    since this process also ran earlier workloads and both systems.
    """

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.peak_bytes = 0
        self.peak_split_bytes = (0, 0)  # (this process, its workers) at the peak
        self.start_bytes = psutil.Process().memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            own, workers = me.memory_info().rss, 0
            for process in me.children(recursive=True):
                try:
                    workers += process.memory_info().rss
                except psutil.Error:  # it ended between listing and reading
                    pass
            if own + workers > self.peak_bytes:
                self.peak_bytes, self.peak_split_bytes = own + workers, (own, workers)
            self._stop.wait(self.interval)

    def report(self) -> dict[str, float]:
        own, workers = self.peak_split_bytes
        return {
            "peak_memory_mb": round(self.peak_bytes / 2**20, 1),
            "peak_memory_tuning_process_mb": round(own / 2**20, 1),
            "peak_memory_workers_mb": round(workers / 2**20, 1),
            "tuning_process_at_start_mb": round(self.start_bytes / 2**20, 1),
        }

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


def best_so_far(latencies: list[float | None]) -> list[float | None]:
    """The best latency after each trial (None until a trial succeeds)."""
    curve, best = [], None
    for latency in latencies:
        if latency is not None and (best is None or latency < best):
            best = latency
        curve.append(best)
    return curve


# ---------------------------------------------------------------- probtune


def tune_probtune(work: Workload, args: argparse.Namespace, checkpoints: list[int]) -> tuple[dict, dict[int, Any]]:
    """Tune; return the report and the best program after each checkpoint's number of trials."""
    with tempfile.TemporaryDirectory(prefix="tune-vs-tvm-") as scratch:
        db_path = Path(scratch) / "bench.db"
        with PeakMemory() as memory:
            started = time.perf_counter()
            result = probtune.tune(
                work, target=args.target, trials=args.trials, database=db_path, seed=args.seed,
                build_timeout=args.build_timeout, batch_size=args.batch_size, cost_model=args.cost_model,
            )
            wall = time.perf_counter() - started
        with Database(db_path) as db:
            records = db.records(db.find_workload(work.mod).id)
        programs, best_traces = {}, {}
        for checkpoint in checkpoints:
            ok = [r for r in records[:checkpoint] if r.status == "ok"]
            if ok:
                best = min(ok, key=lambda r: r.mean_latency)
                programs[checkpoint] = result.space.program(Trace.from_json(best.trace_json))
                best_traces[checkpoint] = best.trace_json
    latencies = [r.mean_latency if r.status == "ok" else None for r in records]
    report = {
        "tuning_wall_seconds": round(wall, 2),
        "search_seconds": round(wall - result.measure_seconds, 2),  # as for TVM: everything but measuring
        "search_loop_seconds": round(result.search_seconds, 2),  # of which choosing candidates and learning
        "measure_seconds": round(result.measure_seconds, 2),
        "build_seconds_sum": round(sum(r.build_seconds or 0 for r in records), 2),
        "run_seconds_sum": round(sum(r.run_seconds or 0 for r in records), 2),
        **memory.report(),
        "measured": result.measured,
        "statuses": dict(result.statuses),
        "rejections": result.rejections,  # candidates dropped before measurement, by validator
        "best_curve_ms": [None if b is None else round(b * 1e3, 5) for b in best_so_far(latencies)],
        "best_traces": best_traces,  # per checkpoint: the best record's trace, to time its program again later
    }
    return report, programs


# ---------------------------------------------------------------- TVM MetaSchedule


@derived_object
class TimedBuilder(ms.builder.PyBuilder):
    """MetaSchedule's LocalBuilder, with the time spent in it counted."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seconds = 0.0

    def build(self, build_inputs: list) -> list:
        started = time.perf_counter()
        try:
            return self.inner.build(build_inputs)
        finally:
            self.seconds += time.perf_counter() - started


@derived_object
class TimedRunner(ms.runner.PyRunner):
    """MetaSchedule's LocalRunner (which times candidates before returning), with its time counted."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seconds = 0.0

    def run(self, runner_inputs: list) -> list:
        started = time.perf_counter()
        try:
            futures = self.inner.run(runner_inputs)
            for future in futures:
                future.result()  # make sure the time is spent here, whatever the runner does
            return futures
        finally:
            self.seconds += time.perf_counter() - started


def tvm_records_in_order(work_dir: Path, work: Workload) -> list[tuple[Any, float | None]]:
    """(trace, mean latency or None) of each measured candidate, in the order MetaSchedule measured them."""
    lines = (work_dir / "database_tuning_record.json").read_text().splitlines()
    workload = ms.database.Workload(work.mod)
    records = []
    for line in lines:
        if not line.strip():
            continue
        _, record_json = json.loads(line)
        record = ms.database.TuningRecord.from_json(record_json, workload)
        seconds = [float(s) for s in record.run_secs] if record.run_secs is not None else []
        mean = float(np.mean(seconds)) if seconds else None
        records.append((record.trace, mean if mean is not None and mean < MS_FAILED_SECONDS else None))
    return records


def tune_tvm(
    work: Workload, target: tvm.target.Target, args: argparse.Namespace, checkpoints: list[int]
) -> tuple[dict, dict[int, Any]]:
    builder = TimedBuilder(ms.builder.LocalBuilder(timeout_sec=args.build_timeout, f_build=ms_build_without_intrinsics))
    runner = TimedRunner(ms.runner.LocalRunner())
    with tempfile.TemporaryDirectory(prefix="tune-vs-tvm-") as scratch:
        work_dir = Path(scratch)
        logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
        with PeakMemory() as memory:
            started = time.perf_counter()
            ms.tune_tir(
                work.mod,
                target,
                str(work_dir),
                max_trials_global=args.trials,
                num_trials_per_iter=64,
                builder=builder,
                runner=runner,
                strategy="evolutionary",
                cost_model="xgb",
                seed=args.seed,
            )
            wall = time.perf_counter() - started
        records = tvm_records_in_order(work_dir, work)
    programs, best_traces = {}, {}
    for checkpoint in checkpoints:
        ok = [(trace, latency) for trace, latency in records[:checkpoint] if latency is not None]
        if ok:
            trace = min(ok, key=lambda item: item[1])[0]
            sch = tvm.s_tir.Schedule(work.mod)
            trace.apply_to_schedule(sch, remove_postproc=False)
            programs[checkpoint] = sch.mod
            best_traces[checkpoint] = str(trace)
    measure = builder.seconds + runner.seconds
    latencies = [latency for _, latency in records]
    report = {
        "tuning_wall_seconds": round(wall, 2),
        "search_seconds": round(wall - measure, 2),
        "measure_seconds": round(measure, 2),
        "build_seconds": round(builder.seconds, 2),
        "run_seconds": round(runner.seconds, 2),
        **memory.report(),
        "measured": len(records),
        "statuses": {"ok": sum(1 for x in latencies if x is not None), "failed": sum(1 for x in latencies if x is None)},
        "best_curve_ms": [None if b is None else round(b * 1e3, 5) for b in best_so_far(latencies)],
        "best_traces": best_traces,  # per checkpoint: MetaSchedule's trace of the best record, as Python it prints
    }
    return report, programs


# ---------------------------------------------------------------- one workload


def onnxruntime_contender(work: Workload, inputs: list[np.ndarray], threads: int) -> Contender | None:
    try:
        import onnxruntime_ops
    except ImportError:
        return None
    if work.name not in onnxruntime_ops.SUPPORTED:
        return None
    call, outputs = onnxruntime_ops.bind(work.name, tuple(work.shape), inputs, threads=threads)

    def call_once() -> list[np.ndarray]:
        call()
        return [o.copy() for o in outputs]

    def time_round(calls: int) -> float:
        started = time.perf_counter()
        for _ in range(calls):
            call()
        return (time.perf_counter() - started) / calls

    return Contender("onnxruntime", call_once, time_round)


def trials_to_reach(curve: list[float | None], target_ms: float | None) -> int | None:
    if target_ms is None:
        return None
    return next((i + 1 for i, best in enumerate(curve) if best is not None and best <= target_ms), None)


def tune_one(system: str, work: Workload, args: argparse.Namespace, out_dir: Path) -> None:
    """``--tune-one``: tune in this (fresh) process; the report and each checkpoint's program go to ``out_dir``."""
    checkpoints = sorted(set(args.checkpoints))
    if system == "probtune":
        report, programs = tune_probtune(work, args, checkpoints)
    else:
        intrinsics_seconds = tvm_import_intrinsics()  # MetaSchedule needs them; before the tuning, not counted
        report, programs = tune_tvm(work, tvm.target.Target(resolve_target(args.target).tvm_target), args, checkpoints)
        report["tensor_intrin_import_seconds"] = round(intrinsics_seconds, 2)
    (out_dir / "report.json").write_text(json.dumps(report))
    for checkpoint, program in programs.items():
        (out_dir / f"program_{checkpoint}.json").write_text(tvm.ir.save_json(program))


def tune_in_fresh_process(system: str, work: Workload, args: argparse.Namespace) -> tuple[dict, dict[int, Any]]:
    """Run ``tune_one`` in a new Python process; its report and the programs it found."""
    shape = ",".join(str(n) for n in work.shape)
    with tempfile.TemporaryDirectory(prefix="tune-vs-tvm-") as scratch:
        command = [
            sys.executable, __file__, "--tune-one", system, scratch, "--workloads", f"{work.name}:{shape}",
            "--dtype", work.dtype, "--trials", str(args.trials), "--checkpoints", *map(str, args.checkpoints),
            "--seed", str(args.seed), "--target", args.target, "--batch-size", str(args.batch_size),
            "--cost-model", args.cost_model, "--build-timeout", str(args.build_timeout),
        ]
        completed = subprocess.run(command)
        if completed.returncode != 0:
            raise RuntimeError(f"{system}'s tuning process exited with status {completed.returncode}")
        report = json.loads((Path(scratch) / "report.json").read_text())
        programs = {}
        for checkpoint in sorted(set(args.checkpoints)):
            path = Path(scratch) / f"program_{checkpoint}.json"
            if path.exists():  # no program for a checkpoint before the first correct candidate
                programs[checkpoint] = tvm.ir.load_json(path.read_text())
    return report, programs


def bench_workload(work: Workload, tvm_target: tvm.target.Target, args: argparse.Namespace) -> dict:
    checkpoints = sorted(set(args.checkpoints))
    entry: dict[str, Any] = {"workload": work.key, "name": work.name, "flops": work.flops, "problems": []}
    programs: dict[str, dict[int, Any]] = {}
    for system in ("probtune", "tvm"):
        say(f"[{work.key}] tuning with {system} ({args.trials} trials, in a fresh process)...")
        outcome = tune_guarded(entry, system, lambda: tune_in_fresh_process(system, work, args))  # noqa: B023 - called here
        if outcome is None:
            continue
        report, best = outcome
        entry[system] = report
        programs[system] = best
        say(f"[{work.key}] {system}: {report['tuning_wall_seconds']} s "
            f"(search {report['search_seconds']} s), peak {report['peak_memory_mb']} MB")

    inputs = work.random_inputs(args.seed)
    expected = work.reference_outputs(inputs)
    contenders = []
    for system, by_checkpoint in programs.items():
        for checkpoint, program in by_checkpoint.items():
            name = f"{system}@{checkpoint}"
            try:
                # each system's program is compiled as its own builder compiled it when it was measured
                if system == "probtune":
                    lib = compile_for(program, resolve_target(args.target))
                else:
                    lib = tvm.compile(program, target=tvm_target)
            except Exception as error:  # noqa: BLE001
                entry["problems"].append(f"{name}: compiling its best program failed: {error}")
                continue
            contender = tvm_contender(name, lib, work, inputs)
            check = check_outputs(work, contender.call_once(), expected)
            entry.setdefault("checks", {})[name] = check
            if not check["correct"]:
                entry["problems"].append(f"{name}'s best program computes a WRONG RESULT "
                                         f"(max abs error {check['max_abs_error']})")
                continue
            contenders.append(contender)
    baselines = []
    if work.baseline is not None:
        baselines.append(numpy_contender(work, inputs))
    if not args.no_onnxruntime:
        ort = onnxruntime_contender(work, inputs, threads=os.cpu_count() or 1)
        if ort is not None:
            baselines.append(ort)
    for contender in baselines:
        check = check_outputs(work, contender.call_once(), expected)
        entry.setdefault("checks", {})[contender.name] = check
        if check["correct"]:
            contenders.append(contender)
        else:
            entry["problems"].append(f"{contender.name} disagrees with the numpy reference")

    say(f"[{work.key}] timing {', '.join(c.name for c in contenders)} interleaved, {args.rounds} rounds...")
    medians = time_interleaved(contenders, args.rounds, args.round_ms) if contenders else {}
    entry["ms"] = {name: round(seconds * 1e3, 4) for name, seconds in medians.items()}
    for checkpoint in checkpoints:
        ours, theirs = medians.get(f"probtune@{checkpoint}"), medians.get(f"tvm@{checkpoint}")
        entry[f"tvm_over_probtune@{checkpoint}"] = round(theirs / ours, 4) if ours and theirs else None
        if ours and "onnxruntime" in medians:
            entry[f"onnxruntime_over_probtune@{checkpoint}"] = round(medians["onnxruntime"] / ours, 4)
    ours_curve = (entry.get("probtune") or {}).get("best_curve_ms") or []
    theirs_curve = (entry.get("tvm") or {}).get("best_curve_ms") or []
    entry["probtune_trials_to_reach_tvm_final"] = trials_to_reach(ours_curve, theirs_curve[-1] if theirs_curve else None)
    entry["probtune_checkpoint_reaching_tvm_final_retimed"] = checkpoint_reaching(medians, checkpoints)
    return entry


def checkpoint_reaching(medians: dict[str, float], checkpoints: list[int]) -> int | None:
    """The first checkpoint whose best probtune program, timed again here, is as fast as TVM's last one.

    The recorded curves come from two runners that time differently, each
    candidate once, so where they cross is decided by single noisy timings
    when the programs are within a few percent; these programs are timed in
    the same rounds, the same way.
    """
    theirs = medians.get(f"tvm@{checkpoints[-1]}")
    if theirs is None:
        return None
    return next((c for c in checkpoints if medians.get(f"probtune@{c}", float("inf")) <= theirs), None)


# ---------------------------------------------------------------- report


def summarize(entries: list[dict], checkpoints: list[int]) -> dict:
    def ratios(key: str) -> list[float]:
        return [e[key] for e in entries if e.get(key)]

    def totals(field: str) -> tuple[float, float] | None:
        pairs = [(e["probtune"][field], e["tvm"][field]) for e in entries
                 if field in (e.get("probtune") or {}) and field in (e.get("tvm") or {})]
        return (sum(p for p, _ in pairs), sum(t for _, t in pairs)) if pairs else None

    summary: dict[str, Any] = {}
    for checkpoint in checkpoints:
        summary[f"geomean_tvm_over_probtune@{checkpoint}"] = geomean(ratios(f"tvm_over_probtune@{checkpoint}"))
        summary[f"geomean_onnxruntime_over_probtune@{checkpoint}"] = geomean(
            ratios(f"onnxruntime_over_probtune@{checkpoint}"))
    for key in ("probtune_trials_to_reach_tvm_final", "probtune_checkpoint_reaching_tvm_final_retimed"):
        reached = [e.get(key) for e in entries]
        summary[f"workloads_where_{key}_at_most_128"] = f"{sum(1 for r in reached if r is not None and r <= 128)} of {len(reached)}"
    for field in ("tuning_wall_seconds", "search_seconds", "peak_memory_mb"):
        pair = totals(field)
        if pair:
            summary[f"{field}_probtune_over_tvm"] = round(pair[0] / pair[1], 4) if pair[1] else None
    return summary


def print_table(entries: list[dict], checkpoints: list[int], summary: dict) -> None:
    last = checkpoints[-1]
    header = (f"{'workload':<34} " + " ".join(f"{'TVM/pt@' + str(c):>10}" for c in checkpoints)
              + f" {'ORT/pt@' + str(last):>11} {'pt tune s':>9} {'TVM tune s':>10} {'pt search s':>11}"
              f" {'TVM search s':>12} {'pt MB':>7} {'TVM MB':>7} {'reach':>6} {'re-timed':>8}")
    print(header)
    print("-" * len(header))
    for e in entries:
        ours, theirs = e.get("probtune") or {}, e.get("tvm") or {}
        print(f"{e['workload']:<34} "
              + " ".join(f"{fmt(e.get(f'tvm_over_probtune@{c}'), '.3f'):>10}" for c in checkpoints)
              + f" {fmt(e.get(f'onnxruntime_over_probtune@{last}'), '.3f'):>11}"
              f" {fmt(ours.get('tuning_wall_seconds'), '.1f'):>9} {fmt(theirs.get('tuning_wall_seconds'), '.1f'):>10}"
              f" {fmt(ours.get('search_seconds'), '.1f'):>11} {fmt(theirs.get('search_seconds'), '.1f'):>12}"
              f" {fmt(ours.get('peak_memory_mb'), '.0f'):>7} {fmt(theirs.get('peak_memory_mb'), '.0f'):>7}"
              f" {fmt(e.get('probtune_trials_to_reach_tvm_final'), 'd'):>6}"
              f" {fmt(e.get('probtune_checkpoint_reaching_tvm_final_retimed'), 'd'):>8}"
              + ("  <-- " + "; ".join(e["problems"]) if e["problems"] else ""))
    for key, value in summary.items():
        print(f"{key}: {value if isinstance(value, str) else fmt(value, '.3f')}")


def plot(entries: list[dict], path: Path) -> bool:
    """Best GFLOPS against trials for both systems, one panel per plotted workload."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("matplotlib is not installed: no plot (pip install -r requirements-bench.txt)")
        return False
    shown = [e for e in entries if e["name"] in PLOTTED and e.get("flops")]
    if not shown:
        return False
    figure, axes = plt.subplots(1, len(shown), figsize=(6 * len(shown), 4), squeeze=False)
    for axis, entry in zip(axes[0], shown):
        for system, style in (("probtune", "-"), ("tvm", "--")):
            curve = (entry.get(system) or {}).get("best_curve_ms") or []
            points = [(i + 1, entry["flops"] / (ms * 1e-3) / 1e9) for i, ms in enumerate(curve) if ms]
            if points:
                axis.plot(*zip(*points), style, label="TVM MetaSchedule" if system == "tvm" else "probtune")
        axis.set_title(entry["workload"])
        axis.set_xlabel("trials")
        axis.set_ylabel("best GFLOPS (as measured while tuning)")
        axis.grid(True, alpha=0.3)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=list(DEFAULT_SUITE), metavar="NAME[:SHAPE]")
    parser.add_argument("--trials", type=int, default=256)
    parser.add_argument("--checkpoints", type=int, nargs="+", default=[64, 128, 256],
                        help="trial counts at which the best programs are compared (at most --trials)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", default="host")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="probtune's candidates per search round")
    parser.add_argument("--cost-model", default="xgb", help="probtune's cost model (xgb, random)")
    parser.add_argument("--build-timeout", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--round-ms", type=float, default=50.0)
    parser.add_argument("--no-onnxruntime", action="store_true")
    parser.add_argument("--out", default=str(RESULTS / "tune_vs_tvm.json"))
    parser.add_argument("--tune-one", nargs=2, metavar=("SYSTEM", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trials <= 0 or any(c <= 0 or c > args.trials for c in args.checkpoints):
        parser.error("--trials must be positive and every checkpoint in 1..trials")
    try:
        chosen = [parse_workload(text, args.dtype) for text in args.workloads]
    except (ValueError, ProbtuneError) as error:
        parser.error(f"--workloads: {error}")
    if args.tune_one:
        system, out_dir = args.tune_one
        tune_one(system, chosen[0], args, Path(out_dir))
        return 0
    checkpoints = sorted(set(args.checkpoints))
    spec = resolve_target(args.target)
    tvm_target = tvm.target.Target(spec.tvm_target)

    entries = bench_each(chosen, lambda work: bench_workload(work, tvm_target, args))
    summary = summarize(entries, checkpoints)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plotted = plot(entries, out.with_suffix(".png"))
    report = {
        "question": "does probtune's learning-driven search find faster programs in less time than TVM MetaSchedule's?",
        "trials": args.trials, "checkpoints": checkpoints, "seed": args.seed, "target": args.target,
        "tvm_target": str(tvm_target), "tvm_num_threads": os.environ.get("TVM_NUM_THREADS"),
        "cpu_count": os.cpu_count(), "cpu": cpu_model(), "tvm_version": tvm.__version__,
        "probtune": {"batch_size": args.batch_size, "cost_model": args.cost_model},
        "tvm": {"strategy": "evolutionary", "cost_model": "xgb", "num_trials_per_iter": 64,
                "builder": "stock minus tensor-intrinsic import"},
        "timing": {"rounds": args.rounds, "round_ms": args.round_ms, "statistic": "median seconds per call",
                   "interleaved": True},
        "plot": str(out.with_suffix(".png")) if plotted else None,
        "summary": summary,
        "workloads": entries,
    }
    print_table(entries, checkpoints, summary)
    out.write_text(json.dumps(report, indent=2) + "\n")
    say(f"report written to {out}")
    problems = [p for e in entries for p in e["problems"]]
    if problems:
        say(f"{len(problems)} problem(s):\n  " + "\n  ".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
