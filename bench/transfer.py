"""Does a cost model trained on one shape help on a new one (AutoTVM's transfer learning)?

First probtune tunes a source workload into a database, which keeps the cost
model's state. Then it tunes a new shape twice with the same seed and the same
small budget: cold (a fresh database, an untrained model: the first round is
random) and warm (a copy of the source's database: the model starts from what
it learned). The best programs of both are timed again here, interleaved.

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

from common import check_outputs, parse_workload, say, time_interleaved, tvm_contender  # first: sets TVM_NUM_THREADS

import tvm

import probtune
from probtune.targets import resolve_target

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default="matmul:512,512,512")
    parser.add_argument("--source-trials", type=int, default=96)
    parser.add_argument("--new", default="matmul:1024,1024,1024")
    parser.add_argument("--trials", type=int, default=32, help="budget on the new shape, cold and warm")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", default="host")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--round-ms", type=float, default=50.0)
    parser.add_argument("--out", default=str(RESULTS / "transfer.json"))
    args = parser.parse_args()
    source, new = parse_workload(args.source, "float32"), parse_workload(args.new, "float32")
    tvm_target = tvm.target.Target(resolve_target(args.target).tvm_target)

    report: dict = {"source": source.key, "source_trials": args.source_trials, "new": new.key,
                    "trials": args.trials, "seed": args.seed}
    with tempfile.TemporaryDirectory(prefix="transfer-") as scratch:
        source_db, warm_db, cold_db = (Path(scratch) / f"{name}.db" for name in ("source", "warm", "cold"))
        say(f"tuning the source {source.key} ({args.source_trials} trials)...")
        probtune.tune(source, target=args.target, trials=args.source_trials, database=source_db, seed=args.seed)
        shutil.copy(source_db, warm_db)
        results = {}
        for name, db in (("cold", cold_db), ("warm", warm_db)):
            say(f"tuning {new.key} {name} ({args.trials} trials)...")
            curve: list[float | None] = []
            started = time.perf_counter()
            result = probtune.tune(new, target=args.target, trials=args.trials, database=db, seed=args.seed,
                                   progress=lambda outcome: curve.append(outcome.best_latency))
            results[name] = result
            report[name] = {
                "tuning_wall_seconds": round(time.perf_counter() - started, 2),
                "search_seconds": round(result.search_seconds, 2),
                "statuses": dict(result.statuses),
                "best_curve_ms": [None if b is None else round(b * 1e3, 5) for b in curve],
            }
        inputs = new.random_inputs(args.seed)
        expected = new.reference_outputs(inputs)
        contenders, problems = [], []
        for name, result in results.items():
            if result.best is None:
                problems.append(f"{name}: no correct program")
                continue
            contender = tvm_contender(name, tvm.compile(result.schedule(), target=tvm_target), new, inputs)
            check = check_outputs(new, contender.call_once(), expected)
            report[name].update(check)
            if check["correct"]:
                contenders.append(contender)
            else:
                problems.append(f"{name}'s best program computes a wrong result")
    medians = time_interleaved(contenders, args.rounds, args.round_ms) if contenders else {}
    for name, seconds in medians.items():
        report[name]["ms"] = round(seconds * 1e3, 4)
        report[name]["gflops"] = round(new.flops / seconds / 1e9, 2)
    if len(medians) == 2:
        report["cold_over_warm"] = round(medians["cold"] / medians["warm"], 4)
    report["problems"] = problems
    for name in ("cold", "warm"):
        entry = report.get(name, {})
        curve = entry.get("best_curve_ms") or []
        print(f"{name}: best {entry.get('ms')} ms ({entry.get('gflops')} GFLOPS) re-timed; while tuning, best after "
              + ", ".join(f"{n} trials {curve[n - 1]} ms" for n in (8, 16, args.trials) if n <= len(curve)))
    print(f"cold/warm latency ratio (>1: the transferred model helped): {report.get('cold_over_warm')}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    say(f"report written to {out}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
