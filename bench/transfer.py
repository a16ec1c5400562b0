"""Does a cost model trained on one shape help on a new one (AutoTVM's transfer learning)?

First probtune tunes a source workload into a database, which keeps the cost
model's state. Then it tunes a new shape with a small budget, once per seed
cold (a fresh database, an untrained model: the first round is random) and
once warm (a copy of the source's database: the model starts from what it
learned), with the same seed. The best programs of every tune are timed
again here, interleaved. One seed says little (a tune's path depends on
which family of tilings it meets first), so the report gives each seed and
the geometric means.

Run with ``make bench-transfer`` (or ``.venv/bin/python bench/transfer.py``).
The report goes to ``bench/results/transfer.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import check_outputs, geomean, parse_workload, say, time_interleaved, tvm_contender  # first: sets TVM_NUM_THREADS

import probtune
from probtune.targets import resolve_target

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default="conv2d_nchw:1,64,56,56,64,3,3,1,1")
    parser.add_argument("--source-trials", type=int, default=96)
    parser.add_argument("--new", default="conv2d_nchw:1,128,28,28,128,3,3,1,1")
    parser.add_argument("--trials", type=int, default=32, help="budget on the new shape, cold and warm")
    parser.add_argument("--seeds", type=int, default=3, help="cold and warm tunes of the new shape with seeds 0..N-1")
    parser.add_argument("--target", default="host")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--round-ms", type=float, default=50.0)
    parser.add_argument("--out", default=str(RESULTS / "transfer.json"))
    args = parser.parse_args()
    source, new = parse_workload(args.source, "float32"), parse_workload(args.new, "float32")
    resolve_target(args.target)  # an unknown target fails here, before any tuning

    report: dict = {"source": source.key, "source_trials": args.source_trials, "new": new.key,
                    "trials": args.trials, "seeds": args.seeds, "tunes": {}}
    tunes = report["tunes"]
    with tempfile.TemporaryDirectory(prefix="transfer-") as scratch:
        source_db = Path(scratch) / "source.db"
        say(f"tuning the source {source.key} ({args.source_trials} trials)...")
        probtune.tune(source, target=args.target, trials=args.source_trials, database=source_db, seed=0)
        results = {}
        for seed in range(args.seeds):
            for start in ("cold", "warm"):
                name = f"{start}-{seed}"
                db = Path(scratch) / f"{name}.db"
                if start == "warm":
                    shutil.copy(source_db, db)
                say(f"tuning {new.key} {start}, seed {seed} ({args.trials} trials)...")
                curve: list[float | None] = []
                started = time.perf_counter()
                result = probtune.tune(new, target=args.target, trials=args.trials, database=db, seed=seed,
                                       progress=lambda outcome: curve.append(outcome.best_latency))  # noqa: B023 - runs in this iteration
                results[name] = result
                tunes[name] = {
                    "tuning_wall_seconds": round(time.perf_counter() - started, 2),
                    "search_seconds": round(result.search_seconds, 2),
                    "statuses": dict(result.statuses),
                    "best_curve_ms": [None if b is None else round(b * 1e3, 5) for b in curve],
                }
        inputs = new.random_inputs(0)
        expected = new.reference_outputs(inputs)
        contenders, problems = [], []
        for name, result in results.items():
            if result.best is None:
                problems.append(f"{name}: no correct program")
                continue
            contender = tvm_contender(name, result.build(), new, inputs)
            check = check_outputs(new, contender.call_once(), expected)
            tunes[name].update(check)
            if check["correct"]:
                contenders.append(contender)
            else:
                problems.append(f"{name}'s best program computes a wrong result")
    medians = time_interleaved(contenders, args.rounds, args.round_ms) if contenders else {}
    for name, seconds in medians.items():
        tunes[name]["ms"] = round(seconds * 1e3, 4)
        tunes[name]["gflops"] = round(new.flops / seconds / 1e9, 2)
    ratios = {}
    for seed in range(args.seeds):
        cold, warm = medians.get(f"cold-{seed}"), medians.get(f"warm-{seed}")
        if cold and warm:
            ratios[seed] = cold / warm
    report["cold_over_warm"] = {str(seed): round(ratio, 4) for seed, ratio in ratios.items()}
    report["geomean_cold_over_warm"] = geomean(list(ratios.values()))
    for checkpoint in sorted({8, 16, args.trials}):
        by_start = {}
        for start in ("cold", "warm"):
            bests = [tunes[f"{start}-{seed}"]["best_curve_ms"][checkpoint - 1] for seed in range(args.seeds)
                     if len(tunes[f"{start}-{seed}"]["best_curve_ms"]) >= checkpoint]
            if len(bests) == args.seeds and all(bests):
                by_start[start] = geomean(bests)
        if len(by_start) == 2:
            report[f"geomean_recorded_cold_over_warm@{checkpoint}"] = round(by_start["cold"] / by_start["warm"], 4)
    report["problems"] = problems
    for seed in range(args.seeds):
        line = []
        for start in ("cold", "warm"):
            entry = tunes.get(f"{start}-{seed}", {})
            curve = entry.get("best_curve_ms") or []
            line.append(f"{start} {entry.get('ms')} ms re-timed (while tuning, after "
                        + ", ".join(f"{n}: {curve[n - 1]}" for n in (8, 16, args.trials) if n <= len(curve)) + ")")
        print(f"seed {seed}: " + "; ".join(line))
    print(f"cold/warm re-timed latency per seed (>1: the transferred model helped): {report['cold_over_warm']}, "
          f"geomean {report.get('geomean_cold_over_warm')}")
    for key, value in report.items():
        if key.startswith("geomean_recorded"):
            print(f"{key}: {value}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    say(f"report written to {out}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
