"""Measuring over TVM's RPC tracker, on loopback: what RPC adds per candidate, and arm-neon tuned on an emulated AArch64.

Starts a tracker on 127.0.0.1, then
- ``overhead``: one x86 RPC server; the same random-search tune of each workload
  measured locally and over RPC, in turn, each candidate checked and timed once
  (``OVERHEAD_TIMING``), so that its wall time is mostly the fixed cost of a
  measurement: loading (over RPC, uploading), the check, the timer's call.
- ``arm``: the AArch64 server of ``devices/aarch64-qemu/start.sh`` (QEMU user-mode
  emulation); arm-neon tuned over it. Its timings are an emulator's: the result
  is whether every program is correct on AArch64, not how fast it is.

    python bench/rpc_devices.py [--parts overhead,arm] [--trials 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import tvm
from common import cpu_model, say
from tvm.rpc.tracker import Tracker

import probtune
from probtune import Database
from probtune.measure.rpc import tracker_servers

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
WORKLOADS = {"matmul": (64, 64, 64), "conv2d_nchw": (1, 16, 14, 14, 16, 3, 3, 1, 1)}
ARM_KEY = "arm-neon-qemu"
X86_KEY = "x86-loopback"
OVERHEAD_TIMING = dict(repeat=1, min_repeat_ms=0.0, warmup=0)
SERVER_START_SECONDS = 600  # the first start of the emulated device builds its root (downloads, ~450 MB)


def _wait_for(tracker: tuple[str, int], key: str, seconds: float, server: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + seconds
    while tracker_servers(tracker).get(key, 0) < 1:
        if server is not None and server.poll() is not None:
            raise RuntimeError(f"the {key} server exited with code {server.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {key} server registered within {seconds:g} s")
        time.sleep(0.5)


def _records(path: Path) -> list[Any]:
    with Database(path) as db:
        return [record for workload in db.workloads() for record in db.records(workload.id)]


def _summary(records: list[Any], seconds: float) -> dict[str, Any]:
    return {
        "records": len(records),
        "statuses": dict(sorted(Counter(str(r.status) for r in records).items())),
        "run_seconds_median": statistics.median(r.run_seconds for r in records if r.run_seconds is not None),
        "wall_seconds": seconds,
    }


def overhead(tracker: tuple[str, int], trials: int, workdir: Path) -> dict[str, Any]:
    server = tvm.rpc.Server(host="127.0.0.1", port=9400, port_end=9600, tracker_addr=tracker, key=X86_KEY, silent=True)
    try:
        _wait_for(tracker, X86_KEY, 60)
        rows = {}
        for name, shape in WORKLOADS.items():
            row = {}
            for how in ("local", "rpc"):
                db = workdir / f"{how}-{name}.db"
                runner = (probtune.RPCRunner(f"{tracker[0]}:{tracker[1]}", X86_KEY, **OVERHEAD_TIMING) if how == "rpc"
                          else probtune.LocalRunner(**OVERHEAD_TIMING))
                started = time.perf_counter()
                with runner:
                    probtune.tune(name, shape=shape, trials=trials, strategy="random", database=db, runner=runner,
                                  confirm=0, seed=0)
                row[how] = _summary(_records(db), time.perf_counter() - started)
            row["rpc_minus_local_per_candidate_s"] = row["rpc"]["run_seconds_median"] - row["local"]["run_seconds_median"]
            say(f"[overhead] {name}: per candidate local {row['local']['run_seconds_median']:.4f} s, "
                f"rpc {row['rpc']['run_seconds_median']:.4f} s; statuses {row['local']['statuses']} / {row['rpc']['statuses']}")
            rows[name] = row
        return rows
    finally:
        server.terminate()


def arm(tracker: tuple[str, int], trials: int, workdir: Path) -> dict[str, Any]:
    command = [str(REPO / "devices" / "aarch64-qemu" / "start.sh"), f"{tracker[0]}:{tracker[1]}", ARM_KEY]
    server = subprocess.Popen(command, stdout=sys.stderr)
    try:
        _wait_for(tracker, ARM_KEY, SERVER_START_SECONDS, server)
        rows = {}
        for name, shape in WORKLOADS.items():
            db = workdir / f"arm-{name}.db"
            started = time.perf_counter()
            with probtune.RPCRunner(f"{tracker[0]}:{tracker[1]}", ARM_KEY, timeout=120.0, min_repeat_ms=1.0) as runner:
                result = probtune.tune(name, shape=shape, target="arm-neon", trials=trials, database=db, runner=runner,
                                       confirm=0, seed=0)
                described = sorted(runner.descriptions)
            rows[name] = {**_summary(_records(db), time.perf_counter() - started), "device": described,
                          "best_trace_replays": result.best is not None and result.schedule() is not None}
            say(f"[arm] {name}: {rows[name]['statuses']} in {rows[name]['wall_seconds']:.0f} s; device: {described}")
        return rows
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="overhead,arm")
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--workdir", default=None, help="keep the databases here (default: a temporary folder)")
    args = parser.parse_args()
    workdir = Path(args.workdir or f"/tmp/probtune-rpc-{int(time.time())}")
    workdir.mkdir(parents=True, exist_ok=True)
    tracker_process = Tracker(host="127.0.0.1", port=9190, port_end=9390, silent=True)
    tracker = ("127.0.0.1", tracker_process.port)
    report: dict[str, Any] = {"machine": cpu_model(), "trials": args.trials, "workloads": WORKLOADS}
    try:
        for part in args.parts.split(","):
            report[part] = {"overhead": overhead, "arm": arm}[part](tracker, args.trials, workdir)
    finally:
        tracker_process.terminate()
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"rpc_devices_{time.strftime('%Y-%m-%d_%H-%M')}.json"
    out.write_text(json.dumps(report, indent=2))
    say(f"written: {out}")


if __name__ == "__main__":
    main()
