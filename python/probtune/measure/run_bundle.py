"""Measure the candidates of a probtune measurement bundle here: ``python run_bundle.py [BUNDLE]``.

A bundle (``probtune bundle``) holds built candidates, their reference
inputs and outputs, and this script with ``timing.py`` beside it: the machine
that runs it needs Python, numpy and TVM's runtime, not probtune. Each
candidate is checked against the reference and timed as probtune's local
runner would; its result is appended to ``results.jsonl`` as soon as it is
known. A run that dies (a crash, a hang that was stopped, a machine that went
away) goes on where it stopped when started again, and the candidate it died
on is recorded as a crash. ``probtune import-results`` reads the file back.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

if __package__:  # imported from probtune
    from probtune.measure.timing import RunReply, RunTask, check_and_time, describe_error, read_reference
else:  # run as a bundle's script: timing.py lies beside it
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from timing import (  # type: ignore[import-not-found,no-redef]
        RunReply,
        RunTask,
        check_and_time,
        describe_error,
        read_reference,
    )

__all__ = ["DIED", "FORMAT", "MANIFEST", "RESULTS", "main", "read_results"]

FORMAT = 1  # of manifest.json and results.jsonl
MANIFEST = "manifest.json"
RESULTS = "results.jsonl"
DIED = "the bundle's runner died while measuring it (a crash, a hang that was stopped, or the machine went away)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run_bundle.py", description="Measure a probtune bundle's candidates here.")
    parser.add_argument("bundle", nargs="?", default=str(Path(__file__).resolve().parent),
                        help="the bundle's folder (default: this script's)")
    args = parser.parse_args(argv)
    bundle = Path(args.bundle)
    manifest = json.loads((bundle / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        print(f"error: {bundle / MANIFEST} is format {manifest.get('format')}; this script reads {FORMAT}", file=sys.stderr)
        return 2
    if manifest.get("num_threads"):
        os.environ.setdefault("TVM_NUM_THREADS", str(manifest["num_threads"]))  # read when TVM's pool starts
    import tvm

    device = tvm.device(manifest["device_type"], 0)
    path = bundle / RESULTS
    done, started = _progress(path)
    with path.open("a") as out:
        if not done and not started:
            _append(out, {"format": FORMAT, "device": _describe(device), "started": time.time()})
        for candidate in manifest["candidates"]:
            index = candidate["id"]
            if index in done:
                continue
            if index in started:
                _append(out, {"id": index, "status": "crash", "latencies": [], "error": DIED, "seconds": None})
                continue
            _append(out, {"id": index, "started": True})
            reply, seconds = _measure(tvm, device, bundle, manifest, candidate)
            _append(out, {"id": index, "status": reply.status, "latencies": list(reply.latencies),
                          "error": reply.error, "seconds": seconds})
            best = f"{min(reply.latencies) * 1e3:.4f} ms" if reply.latencies else (reply.error or "")[:60]
            print(f"[{index + 1}/{len(manifest['candidates'])}] {reply.status} {best}", flush=True)
    return 0


def read_results(path: Path) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """The results file's header and each candidate's result; one that started and never ended died with the run."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{path} is empty")
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}, line {number}: not JSON ({exc.msg})") from None
    header, results = rows[0], {}
    if header.get("format") != FORMAT or "device" not in header:
        raise ValueError(f"{path}, line 1: not the header of a format {FORMAT} results file")
    for row in rows[1:]:
        if not row.get("started"):
            results[row["id"]] = row
    for row in rows[1:]:
        if row.get("started") and row["id"] not in results:
            results[row["id"]] = {"id": row["id"], "status": "crash", "latencies": [], "error": DIED, "seconds": None}
    return header, results


def _progress(path: Path) -> tuple[set[int], set[int]]:
    """The candidates with a result in ``path``, and those that started without one."""
    if not path.exists():
        return set(), set()
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][1:]
    done = {row["id"] for row in rows if not row.get("started")}
    return done, {row["id"] for row in rows if row.get("started")} - done


def _append(out: Any, row: dict[str, Any]) -> None:
    """One line, on disk before the next candidate starts: a crash must not take it along."""
    out.write(json.dumps(row) + "\n")
    out.flush()
    os.fsync(out.fileno())


def _measure(tvm: Any, device: Any, bundle: Path, manifest: dict[str, Any], candidate: dict[str, Any]) -> tuple[RunReply, float]:
    started = time.perf_counter()
    reference = manifest["reference"]
    task = RunTask(
        str(bundle / reference["path"]), reference["num_inputs"], reference["rtol"], reference["atol"],
        str(bundle / candidate["artifact"]), manifest["device_type"], manifest["repeat"],
        manifest["min_repeat_ms"], manifest["warmup"], None, manifest["cache_flush"],
    )
    try:
        inputs, expected = read_reference(task.reference_path, task.num_inputs)
        module = tvm.runtime.load_module(task.artifact_path)
        reply = check_and_time(module, device, inputs, expected, task)
    except Exception as error:  # noqa: BLE001 - load failures, runtime errors raised by TVM
        reply = RunReply("run_error", (), describe_error(error))
    return reply, time.perf_counter() - started


def _describe(device: Any) -> str:
    """This device, as the results file names it: a CPU's model, or the accelerator's name."""
    if device.dlpack_device_type() == 1:
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor() or platform.machine()
    return str(device.device_name)


if __name__ == "__main__":
    sys.exit(main())
