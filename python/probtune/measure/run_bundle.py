"""Measure the candidates of a probtune measurement bundle here: ``python run_bundle.py [BUNDLE]``.

A bundle (``probtune bundle``) holds built candidates, their reference
inputs and outputs, and this script with ``timing.py`` beside it: the machine
that runs it needs Python, numpy and TVM's runtime, not probtune. A bundle
whose target's compiler gives device code also carries each candidate's code
and launch table, and the bundle runtimes that launch that code (files that
plugins register; the manifest's ``runtimes``): ``--runtime NAME`` (by
default the first of them that this machine can use) launches the code
without TVM. Each candidate is checked against the reference and timed as
probtune's local runner would; its result is appended to ``results.jsonl``
as soon as it is known. A run that dies (a crash, a hang that was stopped, a
machine that went away) goes on where it stopped when started again, and the
candidate it died on is recorded as a crash. A candidate that leaves the
device unusable (a fault that breaks the process's context on it) is
recorded as a run error, and the run stops with exit status 3: started
again, it goes on with the next. ``probtune import-results`` reads the file
back.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

if __package__:  # imported from probtune
    from probtune.measure import bundle_runtimes, timing
else:  # run as a bundle's script: timing.py and bundle_runtimes.py lie beside it
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bundle_runtimes  # type: ignore[import-not-found,no-redef]
    import timing  # type: ignore[import-not-found,no-redef]

__all__ = [
    "BROKEN", "DIED", "FORMAT", "MANIFEST", "RESULTS", "TVM_RUNTIME", "SeededInputsError", "main", "read_reference_of",
    "read_results",
]

FORMAT = 1  # of manifest.json and results.jsonl
MANIFEST = "manifest.json"
RESULTS = "results.jsonl"
TVM_RUNTIME = "tvm"  # the runtime every bundle has: TVM's, loading each candidate's library
BROKEN = 3  # the exit status of a run stopped because a candidate left the device unusable (a fault)
DIED = "the bundle's runner died while measuring it (a crash, a hang that was stopped, or the machine went away)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run_bundle.py", description="Measure a probtune bundle's candidates here.")
    parser.add_argument("bundle", nargs="?", default=str(Path(__file__).resolve().parent),
                        help="the bundle's folder (default: this script's)")
    parser.add_argument("--runtime", default=None,
                        help=f"{TVM_RUNTIME}: TVM's runtime loads each candidate's library; or a runtime the bundle "
                             "carries (its manifest's 'runtimes') launches each candidate's device code. Default: the "
                             f"first carried runtime this machine can use, else {TVM_RUNTIME}")
    args = parser.parse_args(argv)
    bundle = Path(args.bundle)
    manifest = json.loads((bundle / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        print(f"error: {bundle / MANIFEST} is format {manifest.get('format')}; this script reads {FORMAT}", file=sys.stderr)
        return 2
    if manifest.get("num_threads"):
        os.environ.setdefault("TVM_NUM_THREADS", str(manifest["num_threads"]))  # read when TVM's pool starts
    os.environ.setdefault("TVM_BIND_THREADS", "0")  # workers not pinned to cores, as in probtune's own runner
    runtime = _runtime(bundle, manifest, args.runtime)
    if isinstance(runtime, str):
        print(f"error: {runtime}", file=sys.stderr)
        return 2
    try:
        arrays = read_reference_of(bundle, manifest["reference"])
    except SeededInputsError as exc:
        print(f"error: {bundle}: {exc}", file=sys.stderr)
        return 2
    measure = _tvm_measure(manifest["device_type"]) if runtime is None else _runtime_measure(runtime)
    return _measure_all(bundle, manifest, measure, arrays)


def _runtime(bundle: Path, manifest: dict[str, Any], asked: str | None) -> ModuleType | str | None:
    """The carried runtime to measure with (None: TVM's), or why the one asked for cannot be had."""
    carried: dict[str, str] = manifest.get("runtimes", {})
    coded = bool(carried) and all("kernels" in candidate for candidate in manifest["candidates"])
    if asked == TVM_RUNTIME or (asked is None and not coded):
        return None
    if asked is None:
        found = bundle_runtimes.first_available(bundle, carried)
        return found[1] if found else None
    if asked not in carried or not coded:
        return (f"this bundle carries no device code for runtime {asked!r} (it carries "
                f"{', '.join(sorted(carried)) or 'none'}); --runtime {TVM_RUNTIME} measures it")
    try:
        module: ModuleType = bundle_runtimes.load_runtime(bundle, carried, asked)
    except bundle_runtimes.RuntimeLoadError as exc:
        return f"{exc}; --runtime {TVM_RUNTIME} measures with TVM's runtime"
    return module


def _measure_all(bundle: Path, manifest: dict[str, Any], measure: _Measure, arrays: Any) -> int:
    """Check and time each candidate without a result yet, appending each result as it comes; the exit status."""
    path = bundle / RESULTS
    done, started = _progress(path)
    with path.open("a") as out:
        if not done and not started:
            _append(out, {"format": FORMAT, "device": measure.device, "started": time.time()})
        for candidate in manifest["candidates"]:
            index = candidate["id"]
            if index in done:
                continue
            if index in started:
                _append(out, {"id": index, "status": "crash", "latencies": [], "error": DIED, "seconds": None})
                continue
            _append(out, {"id": index, "started": True})
            reply, seconds = _timed(measure, bundle, manifest, candidate, arrays)
            _append(out, {"id": index, "status": reply.status, "latencies": list(reply.latencies),
                          "error": reply.error, "seconds": seconds})
            best = f"{min(reply.latencies) * 1e3:.4f} ms" if reply.latencies else (reply.error or "")[:60]
            print(f"[{index + 1}/{len(manifest['candidates'])}] {reply.status} {best}", flush=True)
            if reply.status == "run_error" and not measure.healthy():
                print(f"error: the device is unusable after candidate {index} ({reply.error}); run this script "
                      "again to go on in a new process", file=sys.stderr)
                return BROKEN
    return 0


class SeededInputsError(ValueError):
    """The bundle's reference cannot be had here: its seeded inputs come out differently on this machine."""


def read_reference_of(bundle: Path, reference: dict[str, Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The inputs and expected outputs of a bundle's reference (``reference``: its manifest entry).

    A reference too large to carry whole (``"seeded"`` in its entry) has its
    inputs made here from their seed, checked against their digests, and its
    outputs known at a sample of positions (:class:`~probtune.measure.timing.SampledOutput`).
    """
    path = str(bundle / reference["path"])
    if "seeded" not in reference:
        return timing.read_reference(path, reference["num_inputs"])
    seeded = reference["seeded"]
    extents = {int(position): int(extent) for position, extent in seeded.get("index_extents", [])}
    inputs = tuple(timing.random_inputs(seeded["seed"], seeded["inputs"], extents))
    for index, (array, digest) in enumerate(zip(inputs, seeded["sha256"])):
        if timing.sha256(array) != digest:
            raise SeededInputsError(
                f"input {index} made from seed {seeded['seed']} differs from the one the reference was computed on "
                f"(this machine's numpy {np.__version__} draws other numbers); write the bundle with a larger "
                "reference limit to carry the inputs"
            )
    arrays = timing.load_arrays(path)
    outputs = tuple(
        timing.SampledOutput(tuple(shape), arrays[f"output_{i}"].dtype, arrays[f"positions_{i}"], arrays[f"output_{i}"])
        for i, (shape, _) in enumerate(seeded["outputs"])
    )
    return inputs, outputs


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


class _Measure:
    """How candidates are checked and timed here (``run``), the device's name, and whether it still works (``healthy``)."""

    def __init__(self, device: str, run: Any, healthy: Any = lambda: True) -> None:
        self.device = device
        self.run = run
        self.healthy = healthy


def _timed(
    measure: _Measure, bundle: Path, manifest: dict[str, Any], candidate: dict[str, Any], reference_arrays: Any
) -> tuple[timing.RunReply, float]:
    started = time.perf_counter()
    reference = manifest["reference"]
    task = timing.RunTask(
        str(bundle / reference["path"]), reference["num_inputs"], reference["rtol"], reference["atol"],
        str(bundle / candidate["artifact"]), manifest["device_type"], manifest["repeat"],
        manifest["min_repeat_ms"], manifest["warmup"], None, manifest["cache_flush"],
    )
    try:
        reply = measure.run(task, candidate, bundle, *reference_arrays)
    except Exception as error:  # noqa: BLE001 - load failures, runtime errors of TVM or the driver
        reply = timing.RunReply("run_error", (), timing.describe_error(error))
    return reply, time.perf_counter() - started


def _tvm_measure(device_type: int) -> _Measure:
    """Each candidate's library loaded by TVM's runtime, checked and timed as the local runner does."""
    import tvm

    name = _host() if device_type == 1 else str(tvm.device(device_type, 0).device_name)

    def run(task: timing.RunTask, candidate: dict[str, Any], bundle: Path, inputs: Any, expected: Any) -> timing.RunReply:
        device = tvm.device(task.device, 0)
        return timing.check_and_time(tvm.runtime.load_module(task.artifact_path), device, inputs, expected, task)

    return _Measure(name, run)


def _runtime_measure(runtime: ModuleType) -> _Measure:
    """Each candidate's device code launched by a runtime the bundle carries, checked and timed there."""
    return _Measure(runtime.device_name(), runtime.measure(timing), runtime.healthy)


def _host() -> str:
    """This machine, as the results file names the device of a host target's bundle."""
    return f"{platform.node() or 'this machine'} ({platform.machine()})"


if __name__ == "__main__":
    sys.exit(main())
