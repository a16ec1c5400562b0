"""Is probtune's design space at least as good as TVM MetaSchedule's?

Both systems tune each workload with pure random sampling from their own design
space and the same number of trials: probtune with its random search, TVM
MetaSchedule with its default CPU space and the ``replay-trace`` strategy.  The
two best programs are then compiled and timed again in this process, the same
way and interleaved round by round (this machine is shared and noisy), after
checking both outputs against the workload's numpy reference.  Where the
workload has a numpy baseline, numpy is timed in the same rounds.

Run with ``make bench-space`` (or ``.venv/bin/python bench/space_vs_tvm.py
--trials 64``); pick workloads with ``--workloads matmul:1024,1024,1024 softmax``.
The report goes to ``bench/results/space_vs_tvm.json``.  The exit status is 1
when a tuned program computes a wrong result or a system fails with an error.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import tvm
import tvm.s_tir.meta_schedule as ms
from common import (  # first: it sets TVM_NUM_THREADS before TVM is imported
    MS_FAILED_SECONDS,
    bench_each,
    check_outputs,
    cpu_model,
    fmt,
    ms_build_without_intrinsics,
    numpy_contender,
    parse_workload,
    say,
    time_interleaved,
    tune_guarded,
    tvm_contender,
    tvm_import_intrinsics,
    tvm_log_counts,
)

import probtune
from probtune.errors import ProbtuneError
from probtune.measure.codegen import compile_for
from probtune.targets import resolve_target
from probtune.workloads.workload import Workload

DEFAULT_SUITE = (
    "matmul:512,512,512",
    "matmul:1024,1024,1024",
    "batch_matmul:12,128,128,64",
    "dense_bias_relu:128,3072,768",
    "conv2d_nchw:1,64,56,56,64,3,3,1,1",
    "conv2d_nhwc",
    "depthwise_conv2d_nchw",
    "softmax:1024,1024",
    "layer_norm:512,768",
)
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "space_vs_tvm.json"



# ---------------------------------------------------------------- TVM MetaSchedule


def tune_tvm(work: Workload, target: tvm.target.Target, args: argparse.Namespace) -> tuple[dict, Any]:
    """Tune with MetaSchedule's default CPU space and random sampling; return a report and the best schedule's module."""
    builder = ms.builder.LocalBuilder(
        timeout_sec=args.build_timeout,
        f_build=None if args.tvm_stock_builder else ms_build_without_intrinsics,
    )
    with tempfile.TemporaryDirectory(prefix="space-vs-tvm-") as scratch:
        work_dir = Path(scratch)
        if args.tvm_work_dir:  # keep MetaSchedule's logs and JSON database for a look afterwards
            work_dir = Path(args.tvm_work_dir) / re.sub(r"[^\w.,-]+", "_", work.key)
            work_dir.mkdir(parents=True, exist_ok=True)
        # MetaSchedule's console handler takes this level (its log files keep everything); each
        # tune_tir call resets the level to DEBUG, so set it before every call.
        logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
        started = time.perf_counter()
        database = ms.tune_tir(
            work.mod,
            target,
            str(work_dir),
            max_trials_global=args.trials,
            num_trials_per_iter=min(args.trials, 64),
            builder=builder,
            strategy="replay-trace",
            cost_model="random",  # replay-trace never asks the cost model; don't spend time training XGBoost
            seed=args.seed,
        )
        wall = time.perf_counter() - started
        records = list(database.get_all_tuning_records())
        means = [
            float(np.mean([float(s) for s in r.run_secs]))
            for r in records
            if r.run_secs is not None and len(r.run_secs) > 0
        ]
        ok = [m for m in means if m < MS_FAILED_SECONDS]
        sch = ms.tir_integration.compile_tir(database, work.mod, target)
        report = {
            "tuning_wall_seconds": round(wall, 2),
            "measured": len(records),
            "statuses": {"ok": len(ok), "failed": len(records) - len(ok), **tvm_log_counts(work_dir)},
            "distinct_traces": len({str(r.trace) for r in records}),
            "best_recorded_ms": round(min(ok) * 1e3, 4) if ok else None,
        }
    return report, (sch.mod if sch is not None else None)


# ---------------------------------------------------------------- probtune


def tune_probtune(work: Workload, args: argparse.Namespace) -> tuple[dict, Any]:
    with tempfile.TemporaryDirectory(prefix="space-vs-tvm-") as scratch:
        started = time.perf_counter()
        result = probtune.tune(
            work, target=args.target, trials=args.trials, database=Path(scratch) / "bench.db",
            seed=args.seed, build_timeout=args.build_timeout, strategy="random",
        )
        wall = time.perf_counter() - started
    report = {
        "tuning_wall_seconds": round(wall, 2),
        "measured": result.measured,
        "statuses": dict(result.statuses),
        "rejections": result.rejections,
        "best_recorded_ms": round(result.best_latency * 1e3, 4) if result.best_latency else None,
    }
    return report, (result.schedule() if result.best is not None else None)


# ---------------------------------------------------------------- timing in this process


# ---------------------------------------------------------------- one workload


def bench_workload(work: Workload, tvm_target: tvm.target.Target, args: argparse.Namespace) -> dict:
    entry: dict[str, Any] = {"workload": work.key, "flops": work.flops, "problems": [], "notes": []}
    programs: dict[str, Any] = {}
    for system, tune in (("probtune", lambda: tune_probtune(work, args)),
                         ("tvm", lambda: tune_tvm(work, tvm_target, args))):
        say(f"[{work.key}] tuning with {system} ({args.trials} trials)...")
        outcome = tune_guarded(entry, system, tune)
        if outcome is None:
            continue
        report, program = outcome
        entry[system] = report
        if program is None:
            report["error"] = "no correct program was measured"
            entry["notes"].append(f"{system} measured no correct program")
            say(f"[{work.key}] {system} measured no correct program")
        else:
            programs[system] = program
        say(f"[{work.key}] {system}: {report['tuning_wall_seconds']} s, statuses {report['statuses']}")

    inputs = work.random_inputs(args.seed)
    expected = work.reference_outputs(inputs)
    contenders = []
    for system, program in programs.items():
        try:
            # each system's program is compiled as its own builder compiled it when it was measured
            if system == "probtune":
                lib = compile_for(program, resolve_target(args.target))
            else:
                lib = tvm.compile(program, target=tvm_target)
        except Exception as error:  # noqa: BLE001
            traceback.print_exc()
            entry[system]["error"] = f"compiling the best program failed: {error}"
            entry["problems"].append(f"{system}: compiling its best program failed: {error}")
            continue
        contender = tvm_contender(system, lib, work, inputs)
        check = check_outputs(work, contender.call_once(), expected)
        entry[system].update(check)
        if not check["correct"]:
            message = (f"{system}'s best program for {work.key} computes a WRONG RESULT "
                       f"(max abs error {check['max_abs_error']}, atol {check['atol']:.3g}, rtol {check['rtol']:.3g})")
            say("!" * 78 + f"\n!!! {message}\n" + "!" * 78)
            entry["problems"].append(message)
            continue
        contenders.append(contender)
    if work.baseline is not None:
        contender = numpy_contender(work, inputs)
        entry["numpy"] = check_outputs(work, contender.call_once(), expected)
        contenders.append(contender)
    else:
        entry["numpy"] = None

    if contenders:
        say(f"[{work.key}] timing {', '.join(c.name for c in contenders)} interleaved, {args.rounds} rounds...")
        medians = time_interleaved(contenders, args.rounds, args.round_ms)
        for name, seconds in medians.items():
            entry[name]["ms"] = round(seconds * 1e3, 4)
            entry[name]["gflops"] = round(work.flops / seconds / 1e9, 2) if work.flops else None
            entry[name]["calls_per_round"] = next(c.calls_per_round for c in contenders if c.name == name)
    ours, theirs = (entry.get(s) or {} for s in ("probtune", "tvm"))
    both = "ms" in ours and "ms" in theirs
    entry["tvm_over_probtune"] = round(theirs["ms"] / ours["ms"], 4) if both else None
    return entry


# ---------------------------------------------------------------- report


def print_table(entries: list[dict], geomean: float | None) -> None:
    width = max([len("workload")] + [len(e["workload"]) for e in entries])
    header = (f"{'workload':<{width}} {'probtune ms':>11} {'TVM ms':>10} {'TVM/probtune':>12} "
              f"{'numpy ms':>9} {'tune s probtune':>15} {'tune s TVM':>10}")
    print(header)
    print("-" * len(header))
    for e in entries:
        ours, theirs, base = e.get("probtune") or {}, e.get("tvm") or {}, e.get("numpy") or {}
        remarks = e["problems"] + e.get("notes", [])
        flag = "  <-- " + "; ".join(remarks) if remarks else ""
        print(f"{e['workload']:<{width}} {fmt(ours.get('ms'), '.4f'):>11} {fmt(theirs.get('ms'), '.4f'):>10} "
              f"{fmt(e['tvm_over_probtune'], '.3f'):>12} {fmt(base.get('ms'), '.4f'):>9} "
              f"{fmt(ours.get('tuning_wall_seconds'), '.1f'):>15} {fmt(theirs.get('tuning_wall_seconds'), '.1f'):>10}"
              f"{flag}")
    ratios = sum(1 for e in entries if e["tvm_over_probtune"])
    print(f"geometric mean TVM/probtune over {ratios} workload(s): {fmt(geomean, '.3f')}  (>1: probtune faster)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=list(DEFAULT_SUITE), metavar="NAME[:SHAPE]",
                        help="catalog workloads, each a name (its default shape) or name:shape, e.g. matmul:64,64,64")
    parser.add_argument("--trials", type=int, default=64, help="measured candidates per system and workload")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", default="host", help="probtune target; TVM gets its TVM target")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--build-timeout", type=float, default=60.0,
                        help="seconds per candidate build, for both systems (TVM's own default is 30)")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved timing rounds of the best programs")
    parser.add_argument("--round-ms", type=float, default=50.0, help="length of one timing round of one program")
    parser.add_argument("--tvm-stock-builder", action="store_true",
                        help="use MetaSchedule's stock build function (imports all tensor intrinsics per batch)")
    parser.add_argument("--tvm-work-dir", help="keep MetaSchedule's logs and database here, one folder per workload")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args()
    if args.trials <= 0:
        parser.error("--trials must be positive")

    try:
        chosen = [parse_workload(text, args.dtype) for text in args.workloads]
    except (ValueError, ProbtuneError) as error:
        parser.error(f"--workloads: {error}")
    spec = resolve_target(args.target)
    tvm_target = tvm.target.Target(spec.tvm_target)

    say("importing TVM's tensor intrinsics (MetaSchedule needs them; one-time cost, not counted)...")
    intrinsics_seconds = tvm_import_intrinsics()
    entries = bench_each(chosen, lambda work: bench_workload(work, tvm_target, args), tvm_over_probtune=None)

    ratios = [e["tvm_over_probtune"] for e in entries if e["tvm_over_probtune"]]
    geomean = float(np.exp(np.mean(np.log(ratios)))) if ratios else None
    report = {
        "question": "is probtune's design space at least as good as TVM MetaSchedule's (random sampling, same trials)?",
        "trials": args.trials,
        "seed": args.seed,
        "target": args.target,
        "tvm_target": str(tvm_target),
        "tvm_num_threads": os.environ.get("TVM_NUM_THREADS"),
        "cpu_count": os.cpu_count(),
        "cpu": cpu_model(),
        "tvm_version": tvm.__version__,
        "tvm_builder": "stock" if args.tvm_stock_builder else "stock minus tensor-intrinsic import",
        "build_timeout_seconds": args.build_timeout,
        "tvm_tensor_intrin_import_seconds": round(intrinsics_seconds, 2),
        "timing": {"rounds": args.rounds, "round_ms": args.round_ms, "statistic": "median seconds per call",
                   "interleaved": True},
        "workloads": entries,
        "geomean_tvm_over_probtune": round(geomean, 4) if geomean else None,
    }
    print_table(entries, geomean)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    say(f"report written to {out}")
    problems = [p for e in entries for p in e["problems"]]
    if problems:
        say(f"{len(problems)} problem(s):\n  " + "\n  ".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
