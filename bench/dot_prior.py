"""The dot-product tilings' register-tile prior: how well short tunings of bf16 and int8 operators do with it and
without it.

Each operator is tuned ``--repeats`` times in the host space, seeds 0, 1, ..., with the ``vdpbf16ps`` or
``vpdpbusd`` tiling's prior (``DotProductTiling.prior``) and with it switched off (every draw kept), the two in turns;
each best program is checked against the plain program, then all are timed in turns in one process. A short tuning
of a space where most random draws are slow lands in the slow part now and then; the spread over repeats shows how
often. AMX's tilings are left out of the space. Needs a CPU with AVX512-BF16 and VNNI.

    .venv/bin/python bench/dot_prior.py --trials 48 --repeats 3 --out bench/results/dot_prior.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from amx import TILINGS, convolution, operands, product, run, speedup, timed_in_turns, weight_packed
from common import say

import probtune
from probtune.measure.codegen import compile_for
from probtune.space.space_generator import resolve_modules
from probtune.targets import resolve_target
from probtune_cpu.host_cpu import cpu_features, cpu_model
from probtune_x86 import BF16_FEATURE, VNNI_FEATURE
from probtune_x86.dot_product import DotProductTiling

WORKLOADS = {
    "bf16_stem": lambda: convolution(224, 4, 64, 7, 2, True),  # ResNet-50's stem, its 3 channels padded to 4
    "bf16_conv3x3_56_16_64": lambda: convolution(56, 16, 64, 3, 1, True),
    "bf16_conv1x1_56_256_64": lambda: convolution(56, 256, 64, 1, 1, True),
    "bf16_dense_128_3072_768": lambda: product(128, 3072, 768, True),
    "int8_dense_128_768_768": lambda: product(128, 768, 768, False),
    "int8_conv3x3_28_128_128": lambda: convolution(28, 128, 128, 3, 1, False),
}


def spaces() -> dict[str, list]:
    """The host's modules but AMX's tilings (which would take these blocks on a CPU with tiles), as they are and with
    each dot-product tiling's prior keeping every draw."""
    modules = [m for m in resolve_modules(resolve_target("host")) if m.name not in TILINGS]
    off = [dataclasses.replace(m, off_register_tile_weight=1.0) if isinstance(m, DotProductTiling) else m
           for m in modules]
    return {"prior": modules, "no_prior": off}


def bench_workload(name: str, args: argparse.Namespace) -> dict:
    """``name`` tuned ``args.repeats`` times in both spaces, checked, then timed in turns."""
    workload, operations = WORKLOADS[name]()
    arrays = operands(workload)
    want = run(compile_for(workload.mod, resolve_target("llvm")), arrays)
    row: dict = {"workload": name, "tuning_best_ms": {}, "tuning_seconds": {}}
    libs = {}
    for repeat in range(args.repeats):
        order = list(spaces().items())
        for space, modules in order if repeat % 2 == 0 else reversed(order):
            key = f"{space}_{repeat}"
            with tempfile.TemporaryDirectory() as scratch:
                started = time.perf_counter()
                result = probtune.tune(workload, "host", args.trials, database=Path(scratch) / "t.db", seed=repeat,
                                       modules=modules)
                row["tuning_seconds"][key] = round(time.perf_counter() - started, 1)
            row["tuning_best_ms"][key] = round(result.best_latency * 1e3, 4)
            lib, inputs = weight_packed(result.schedule(), arrays)
            got = run(lib, inputs)
            error = float(np.max(np.abs(got.astype(np.float64) - want)) / np.max(np.abs(want)))
            if error > 1e-4:
                raise SystemExit(f"{name} {key}: best program off by {error:.2e} of the largest output")
            libs[key] = (lib, inputs)
            say(f"{name} {key}: tuned best {row['tuning_best_ms'][key]} ms")
    timing = timed_in_turns(libs, operations, args)
    rounds = timing.pop("rounds")
    row.update(timing)
    for space in spaces():
        times = sorted(row["ms"][f"{space}_{r}"] for r in range(args.repeats))
        row[f"{space}_median_ms"], row[f"{space}_range_ms"] = float(np.median(times)), [times[0], times[-1]]
    row["no_prior_over_prior"] = [speedup(rounds, f"no_prior_{r}", f"prior_{r}") for r in range(args.repeats)]
    say(f"{name}: with the prior {row['prior_median_ms']} ms {row['prior_range_ms']}, without "
        f"{row['no_prior_median_ms']} ms {row['no_prior_range_ms']}")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", help="comma-separated names of " + ", ".join(WORKLOADS))
    parser.add_argument("--out", type=Path, default=Path("bench/results/dot_prior.json"))
    args = parser.parse_args()
    if not {BF16_FEATURE, VNNI_FEATURE} <= cpu_features():
        raise SystemExit(f"this CPU ({cpu_model()}) lacks AVX512-BF16 or VNNI; run this on one that has both")
    names = args.only.split(",") if args.only else list(WORKLOADS)
    rows = [bench_workload(name, args) for name in names]
    args.out.write_text(json.dumps({"cpu": cpu_model(), "trials": args.trials, "repeats": args.repeats,
                                    "rows": rows}, indent=1) + "\n")
    say(f"wrote {args.out}")


if __name__ == "__main__":
    main()
