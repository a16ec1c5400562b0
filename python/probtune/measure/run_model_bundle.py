"""Run, check and time a compiled model from its bundle on a GPU, without TVM: ``python run_model_bundle.py [BUNDLE]``.

A model bundle (:mod:`probtune.model.bundle`) holds the model's plan (its
buffers, the tensors laid out in them, its kernel launches in order), one
cubin per function, its constants (carried, or as seeds that this script makes
again and checks against their digests) and reference inputs and outputs.
This script needs numpy and CuPy. It runs the model once and checks its
outputs against the reference; then it times whole calls replayed from a CUDA
graph, and each function's calls alone, and writes ``results.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FORMAT", "MANIFEST", "RESULTS", "digest", "main", "seeded_array"]

FORMAT = 1  # of manifest.json and results.json
MANIFEST = "manifest.json"
RESULTS = "results.json"
_DEFAULT_SHARED_LIMIT = 48 * 1024  # launch-time shared memory a CUDA kernel gets without opting in
_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def seeded_array(seed: int, shape: list[int] | tuple[int, ...], dtype: str, mean: float, std: float) -> np.ndarray:
    """Values uniform around ``mean`` with deviation ``std``, from a counter hash (SplitMix64) of ``seed``.

    Integer arithmetic and IEEE casts only, so every machine and numpy version
    makes the same bits: a weight too large to carry travels as these numbers.
    """
    count = int(np.prod(shape, dtype=np.int64))
    with np.errstate(over="ignore"):
        z = np.arange(count, dtype=np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) & _MASK
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    unit = (z >> np.uint64(11)).astype(np.float64) * (2.0**-53) * 2.0 - 1.0  # [-1, 1)
    return (unit * (std * np.sqrt(3.0)) + mean).astype(dtype).reshape(shape)


def digest(array: np.ndarray) -> str:
    """The SHA-256 of an array's bytes, with its dtype and shape."""
    head = f"{array.dtype.str}{list(array.shape)}".encode()
    return hashlib.sha256(head + np.ascontiguousarray(array).tobytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run_model_bundle.py", description="Check and time a probtune model bundle here.")
    parser.add_argument("bundle", nargs="?", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--repeat", type=int, default=10, help="timed repeats of whole calls (default 10)")
    parser.add_argument("--min-repeat-ms", type=float, default=50.0, help="least duration of one repeat (default 50)")
    parser.add_argument("--no-profile", action="store_true", help="do not time each function's calls alone")
    args = parser.parse_args(argv)
    bundle = Path(args.bundle)
    manifest = json.loads((bundle / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        print(f"error: {bundle / MANIFEST} is format {manifest.get('format')}; this script reads {FORMAT}", file=sys.stderr)
        return 2
    import cupy

    result = _run(cupy, bundle, manifest, args.repeat, args.min_repeat_ms, not args.no_profile)
    (bundle / RESULTS).write_text(json.dumps(result, indent=1))
    print(_summary(manifest, result), flush=True)
    return 0 if result["status"] == "ok" else 1


def _run(cupy: Any, bundle: Path, manifest: dict[str, Any], repeat: int, min_repeat_ms: float, profile: bool) -> dict[str, Any]:
    result: dict[str, Any] = {"format": FORMAT, "model": manifest["model"],
                              "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()}
    try:
        model = _Model(cupy, bundle, manifest)
    except _BundleError as exc:
        return {**result, "status": "bad_bundle", "error": str(exc)}
    reference = np.load(bundle / manifest["reference"])
    try:
        outputs = model.run([reference[f"input_{i}"] for i in range(len(manifest["plan"]["inputs"]))])
    except Exception as exc:  # noqa: BLE001 - a launch CUDA refused, or a fault: recorded, not a traceback
        return {**result, "status": "run_error", "error": f"{type(exc).__name__}: {exc}"}
    tolerance = manifest["tolerance"]
    errors = [_error(got, reference[f"output_{i}"], tolerance["rtol"]) for i, got in enumerate(outputs)]
    result["check"] = {"errors": errors, **tolerance}
    if any(error["excess"] > tolerance["atol_scale"] for error in errors):
        return {**result, "status": "wrong_result"}
    result["launches"] = len(model.launches)
    result["latency_s"] = model.time(repeat, min_repeat_ms)
    if profile:
        result["functions"] = model.profile(min_repeat_ms / 10)
    return {**result, "status": "ok"}


class _BundleError(ValueError):
    """A bundle whose constants do not match their digests, or whose files are missing."""


class _Model:
    """The model's memory on the GPU and its launches, ready to run."""

    def __init__(self, cupy: Any, bundle: Path, manifest: dict[str, Any]) -> None:
        self.cupy = cupy
        plan = manifest["plan"]
        self.storages = {name: cupy.zeros(size, dtype=np.uint8) for name, size in plan["storages"].items()}
        self.tensors = {name: self._view(t) for name, t in plan["tensors"].items()}
        for name, array in _constants(bundle, manifest):
            self.tensors[name][...] = cupy.asarray(array)
        self.inputs = [self.tensors[name] for name in plan["inputs"]]
        self.outputs = [self.tensors[name] for name in plan["outputs"]]
        modules = {name: cupy.RawModule(path=str(bundle / function["cubin"])) for name, function in manifest["functions"].items()}
        self.launches: list[tuple[str, Any, tuple[int, ...], tuple[int, ...], tuple[Any, ...], int]] = []
        for call in plan["calls"]:
            function = manifest["functions"][call["function"]]
            scratch = {b["name"]: cupy.zeros(b["elements"], dtype=b["dtype"]) for b in function["scratch"]}
            for launch in function["launches"]:
                kernel = _kernel(modules[call["function"]], launch["kernel"], launch["shared"])
                launch_args = tuple(self._argument(arg, call["args"], scratch) for arg in launch["args"])
                self.launches.append((call["function"], kernel, tuple(launch["grid"]), tuple(launch["block"]),
                                      launch_args, launch["shared"]))

    def _view(self, tensor: dict[str, Any]) -> Any:
        size = int(np.prod(tensor["shape"], dtype=np.int64)) * np.dtype(tensor["dtype"]).itemsize
        raw = self.storages[tensor["storage"]][tensor["offset"] : tensor["offset"] + size]
        return raw.view(tensor["dtype"]).reshape(tensor["shape"])

    def _argument(self, arg: dict[str, Any], tensors: list[str], scratch: dict[str, Any]) -> Any:
        if "param" in arg:
            return self.tensors[tensors[arg["param"]]]
        return scratch[arg["scratch"]] if "scratch" in arg else np.dtype(arg["dtype"]).type(arg["scalar"])

    def call(self, only: str | None = None) -> None:
        for function, kernel, grid, block, args, shared in self.launches:
            if only is None or function == only:
                kernel(grid, block, args, shared_mem=shared)

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        for tensor, array in zip(self.inputs, inputs):
            tensor[...] = self.cupy.asarray(array)
        self.call()
        self.cupy.cuda.Device().synchronize()
        return [self.cupy.asnumpy(out) for out in self.outputs]

    def time(self, repeat: int, min_repeat_ms: float) -> list[float]:
        """Seconds per whole call, one figure per repeat, each call replayed from one CUDA graph."""
        return _timings(self.cupy, lambda: self.call(), repeat, min_repeat_ms)

    def profile(self, min_repeat_ms: float) -> dict[str, dict[str, float]]:
        """Each function's calls alone, replayed from a graph: seconds per model call, and its launches."""
        names = sorted({launch[0] for launch in self.launches})
        found = {}
        for name in names:
            seconds = _timings(self.cupy, lambda name=name: self.call(name), 3, min_repeat_ms)
            found[name] = {"seconds": float(np.median(seconds)),
                           "launches": sum(1 for launch in self.launches if launch[0] == name)}
        return found


def _constants(bundle: Path, manifest: dict[str, Any]) -> Any:
    """Each constant by tensor name: from the carried file, or made again from its seed and checked."""
    carried = np.load(bundle / manifest["constants"]["file"])
    for name in carried.files:
        yield name, carried[name]
    for name, spec in manifest["constants"]["seeded"].items():
        array = seeded_array(spec["seed"], spec["shape"], spec["dtype"], spec["mean"], spec["std"])
        if digest(array) != spec["digest"]:
            raise _BundleError(f"constant {name} made from its seed differs from the one the bundle was built with")
        yield name, array


def _kernel(module: Any, name: str, shared: int) -> Any:
    kernel = module.get_function(name)
    if shared > _DEFAULT_SHARED_LIMIT:
        kernel.max_dynamic_shared_size_bytes = shared
    return kernel


def _timings(cupy: Any, call: Any, repeat: int, min_repeat_ms: float) -> list[float]:
    """Seconds per ``call``, one figure per repeat, replayed from a CUDA graph captured once on a side stream."""
    cupy.cuda.Device().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    with stream:
        call()  # a warm-up outside the graph
        stream.begin_capture()
        try:
            call()
        finally:
            graph = stream.end_capture()
        graph.launch(stream)
        start.record(stream)
        graph.launch(stream)
        end.record(stream)
        end.synchronize()
        once = max(float(cupy.cuda.get_elapsed_time(start, end)) / 1e3, 1e-7)
        number = max(1, int(min_repeat_ms / 1e3 / once))
        found = []
        for _ in range(repeat):
            start.record(stream)
            for _ in range(number):
                graph.launch(stream)
            end.record(stream)
            end.synchronize()
            found.append(float(cupy.cuda.get_elapsed_time(start, end)) / 1e3 / number)
    return found


def _error(got: np.ndarray, want: np.ndarray, rtol: float) -> dict[str, float]:
    """Largest absolute error, largest error over the reference's root-mean-square magnitude, and the largest excess
    over ``rtol`` x |want| in that unit (the check passes where it is at most ``atol_scale``)."""
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    if got64.shape != want64.shape or not np.all(np.isfinite(got64)):
        return {"max_abs": float("inf"), "max_rel_rms": float("inf"), "excess": float("inf")}
    diff = np.abs(got64 - want64)
    rms = float(np.sqrt(np.mean(want64 * want64))) or 1.0
    return {"max_abs": float(diff.max(initial=0.0)), "max_rel_rms": float(diff.max(initial=0.0) / rms),
            "excess": float((diff - rtol * np.abs(want64)).max(initial=0.0) / rms)}


def _summary(manifest: dict[str, Any], result: dict[str, Any]) -> str:
    head = f"{manifest['model']}: {result['status']}"
    if result["status"] != "ok":
        return f"{head} {result.get('error') or result.get('check')}"
    latency = sorted(result["latency_s"])
    return (f"{head}, {latency[len(latency) // 2] * 1e3:.4f} ms median ({latency[0] * 1e3:.4f}-{latency[-1] * 1e3:.4f}), "
            f"{result['launches']} launches, outputs within {max(e['max_rel_rms'] for e in result['check']['errors']):.3g} "
            f"of the reference's RMS")


if __name__ == "__main__":
    started = time.perf_counter()
    status = main()
    print(f"({time.perf_counter() - started:.1f} s)", file=sys.stderr)
    sys.exit(status)
