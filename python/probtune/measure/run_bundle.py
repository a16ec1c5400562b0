"""Measure the candidates of a probtune measurement bundle here: ``python run_bundle.py [BUNDLE]``.

A bundle (``probtune bundle``) holds built candidates, their reference
inputs and outputs, and this script with ``timing.py`` beside it: the machine
that runs it needs Python, numpy and TVM's runtime, not probtune. A CUDA
bundle also carries each candidate's cubin and launch table: ``--runtime
cupy`` (the default for such a bundle where CuPy is installed) launches them
with CuPy, without TVM, and times them with CUDA events. Each candidate is
checked against the reference and timed as probtune's local runner would;
its result is appended to ``results.jsonl`` as soon as it is known. A run
that dies (a crash, a hang that was stopped, a machine that went away) goes
on where it stopped when started again, and the candidate it died on is
recorded as a crash. A candidate that leaves the GPU unusable (a fault that
breaks the process's CUDA context) is recorded as a run error, and the run
stops with exit status 3: started again, it goes on with the next.
``probtune import-results`` reads the file back.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__:  # imported from probtune
    from probtune.measure import timing
else:  # run as a bundle's script: timing.py lies beside it
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import timing  # type: ignore[import-not-found,no-redef]

__all__ = ["BROKEN", "DIED", "FORMAT", "MANIFEST", "RESULTS", "SeededInputsError", "main", "read_reference_of", "read_results"]

FORMAT = 1  # of manifest.json and results.jsonl
MANIFEST = "manifest.json"
RESULTS = "results.jsonl"
_DEFAULT_SHARED_LIMIT = 48 * 1024  # launch-time shared memory a CUDA kernel gets without opting in
GRAPH_MS = 1.0  # the GPU time of the calls one CUDA graph replays, about
GRAPH_CALLS = 100  # calls one graph replays at most
BROKEN = 3  # the exit status of a run stopped because a candidate left the device unusable (a CUDA fault)
DIED = "the bundle's runner died while measuring it (a crash, a hang that was stopped, or the machine went away)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run_bundle.py", description="Measure a probtune bundle's candidates here.")
    parser.add_argument("bundle", nargs="?", default=str(Path(__file__).resolve().parent),
                        help="the bundle's folder (default: this script's)")
    parser.add_argument("--runtime", choices=["tvm", "cupy"], default=None,
                        help="TVM's runtime loads each candidate's library; CuPy launches its cubin (a CUDA bundle). "
                             "Default: CuPy for a CUDA bundle where it is installed, else TVM")
    args = parser.parse_args(argv)
    bundle = Path(args.bundle)
    manifest = json.loads((bundle / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        print(f"error: {bundle / MANIFEST} is format {manifest.get('format')}; this script reads {FORMAT}", file=sys.stderr)
        return 2
    if manifest.get("num_threads"):
        os.environ.setdefault("TVM_NUM_THREADS", str(manifest["num_threads"]))  # read when TVM's pool starts
    cubins = all("kernels" in candidate for candidate in manifest["candidates"])
    runtime = args.runtime or ("cupy" if cubins and importlib.util.find_spec("cupy") else "tvm")
    if runtime == "cupy" and not cubins:
        print("error: CuPy measures only a CUDA bundle (cubins and launch tables); this one has none", file=sys.stderr)
        return 2
    try:
        arrays = read_reference_of(bundle, manifest["reference"])
    except SeededInputsError as exc:
        print(f"error: {bundle}: {exc}", file=sys.stderr)
        return 2
    measure = _tvm_measure(manifest["device_type"]) if runtime == "tvm" else _cupy_measure()
    return _measure_all(bundle, manifest, measure, arrays)


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
    inputs = tuple(timing.random_inputs(seeded["seed"], seeded["inputs"]))
    for index, (array, digest) in enumerate(zip(inputs, seeded["sha256"])):
        if timing.sha256(array) != digest:
            raise SeededInputsError(
                f"input {index} made from seed {seeded['seed']} differs from the one the reference was computed on "
                f"(this machine's numpy {np.__version__} draws other numbers); write the bundle with a larger "
                "reference limit to carry the inputs"
            )
    with np.load(path) as arrays:
        outputs = tuple(
            timing.SampledOutput(tuple(shape), np.dtype(dtype), arrays[f"positions_{i}"], arrays[f"output_{i}"])
            for i, (shape, dtype) in enumerate(seeded["outputs"])
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


def _cupy_measure() -> _Measure:
    """Each candidate's cubin loaded by CuPy, its kernels launched as its table says, timed with CUDA events."""
    import cupy

    def run(task: timing.RunTask, candidate: dict[str, Any], bundle: Path, inputs: Any, expected: Any) -> timing.RunReply:
        call, outputs = _cupy_program(cupy, bundle, candidate["kernels"], inputs, expected)
        call()
        cupy.cuda.Device().synchronize()
        mismatch = timing.first_mismatch([cupy.asnumpy(out) for out in outputs], expected, task.rtol, task.atol)
        if mismatch is not None:
            return timing.RunReply("wrong_result", (), mismatch)
        for _ in range(task.warmup):
            call()
        return timing.RunReply("ok", _cupy_timings(cupy, call, task), None)

    def healthy() -> bool:
        """False once a fault (an illegal address, say) has broken this process's CUDA context for good."""
        try:
            cupy.cuda.runtime.deviceSynchronize()
            cupy.zeros(1).sum()
        except Exception:  # noqa: BLE001 - any error here means the context is gone
            return False
        return True

    return _Measure(str(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()), run, healthy)


def _cupy_program(cupy: Any, bundle: Path, table: dict[str, Any], inputs: Any, expected: Any) -> tuple[Any, list[Any]]:
    """A function that runs the program's launches in order, and its output arrays."""
    module = cupy.RawModule(path=str(bundle / table["cubin"]))
    params = [cupy.asarray(array) for array in inputs] + [cupy.zeros(array.shape, array.dtype) for array in expected]
    scratch = {b["name"]: cupy.zeros(b["elements"], dtype=b["dtype"]) for b in table["scratch"]}

    def argument(arg: dict[str, Any]) -> Any:
        if "param" in arg:
            return params[arg["param"]]
        return scratch[arg["scratch"]] if "scratch" in arg else np.dtype(arg["dtype"]).type(arg["scalar"])

    launches = [(_kernel(module, launch["kernel"], launch["shared"]), tuple(launch["grid"]), tuple(launch["block"]),
                 tuple(argument(arg) for arg in launch["args"]), launch["shared"]) for launch in table["launches"]]

    def call() -> None:
        for kernel, grid, block, args, shared in launches:
            kernel(grid, block, args, shared_mem=shared)

    return call, params[len(inputs):]


def _kernel(module: Any, name: str, shared: int) -> Any:
    """A kernel of the module, allowed the launch-time shared memory it asks for (beyond 48 KB a kernel must opt in)."""
    kernel = module.get_function(name)
    if shared > _DEFAULT_SHARED_LIMIT:
        kernel.max_dynamic_shared_size_bytes = shared
    return kernel


def _cupy_timings(cupy: Any, call: Any, task: timing.RunTask) -> tuple[float, ...]:
    """Seconds per call, one figure per repeat; a repeat makes as many calls as last ``min_repeat_ms``.

    The calls are captured in a CUDA graph and replayed, as many per graph as
    last about ``GRAPH_MS``: launched one by one from Python, a kernel of a few
    microseconds would be timed at the speed of the launches. Where a graph
    cannot be made, the calls are launched one by one.
    """
    cupy.cuda.Device().synchronize()  # the check and warmup calls, on the default stream, are over
    stream = cupy.cuda.Stream(non_blocking=True)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()

    def elapsed(unit: Any, number: int) -> float:
        start.record(stream)
        for _ in range(number):
            unit()
        end.record(stream)
        end.synchronize()
        return float(cupy.cuda.get_elapsed_time(start, end)) / 1e3

    with stream:
        first = elapsed(call, 1)
        calls = max(1, min(GRAPH_CALLS, int(GRAPH_MS / 1e3 / first))) if first > 0 else 1
        unit = _graph(stream, call, calls)
        if unit is None:
            unit, calls = call, 1
        per_unit = elapsed(unit, 1)
        number = max(1, int(task.min_repeat_ms / 1e3 / per_unit)) if per_unit > 0 else 1
        return tuple(elapsed(unit, number) / number / calls for _ in range(task.repeat))


def _graph(stream: Any, call: Any, calls: int) -> Any:
    """A function that replays ``calls`` calls captured in a CUDA graph on ``stream``; None where capture fails."""
    try:
        stream.begin_capture()
        try:
            for _ in range(calls):
                call()
        finally:
            graph = stream.end_capture()
    except Exception as error:  # noqa: BLE001 - timed launch by launch instead
        print(f"no CUDA graph ({timing.describe_error(error)}): launches timed one by one", file=sys.stderr)
        return None
    return lambda: graph.launch(stream)


def _host() -> str:
    """This machine, as the results file names the device of a host target's bundle."""
    return f"{platform.node() or 'this machine'} ({platform.machine()})"


if __name__ == "__main__":
    sys.exit(main())
