"""Run, check and time a compiled model from its bundle, without TVM: ``python run_model_bundle.py [BUNDLE]``.

A model bundle (:mod:`probtune.model.bundle`) holds the model's plan (its
buffers, the tensors laid out in them, its kernel launches in order), one
file of device code per function, its constants (carried, or as seeds that
this script makes again and checks against their digests), reference inputs
and outputs, and the bundle runtimes that launch its code (files that
plugins register; the manifest's ``runtimes``). This script needs numpy and
what the runtime launches with. The runtime (``--runtime NAME``; by default
the first this machine can use) runs the model once, and the outputs are
checked against the reference; then it times whole calls, and each
function's calls alone, and this script writes ``results.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

if __package__:  # imported from probtune
    from probtune.measure import bundle_runtimes
else:  # run as a bundle's script: bundle_runtimes.py lies beside it
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bundle_runtimes  # type: ignore[import-not-found,no-redef]

__all__ = ["FORMAT", "MANIFEST", "RESULTS", "digest", "main", "seeded_array"]

FORMAT = 1  # of manifest.json and results.json
MANIFEST = "manifest.json"
RESULTS = "results.json"
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
    parser.add_argument("--runtime", default=None, help="a runtime the bundle carries (its manifest's 'runtimes'; "
                                                        "default: the first this machine can use)")
    parser.add_argument("--repeat", type=int, default=10, help="timed repeats of whole calls (default 10)")
    parser.add_argument("--min-repeat-ms", type=float, default=50.0, help="least duration of one repeat (default 50)")
    parser.add_argument("--no-profile", action="store_true", help="do not time each function's calls alone")
    args = parser.parse_args(argv)
    bundle = Path(args.bundle)
    manifest = json.loads((bundle / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        print(f"error: {bundle / MANIFEST} is format {manifest.get('format')}; this script reads {FORMAT}", file=sys.stderr)
        return 2
    runtime = _runtime(bundle, manifest.get("runtimes", {}), args.runtime)
    if isinstance(runtime, str):
        print(f"error: {runtime}", file=sys.stderr)
        return 2
    result = _run(runtime, bundle, manifest, args.repeat, args.min_repeat_ms, not args.no_profile)
    (bundle / RESULTS).write_text(json.dumps(result, indent=1))
    print(_summary(manifest, result), flush=True)
    return 0 if result["status"] == "ok" else 1


def _runtime(bundle: Path, carried: dict[str, str], asked: str | None) -> ModuleType | str:
    """The carried runtime to run the model with, or why there is none."""
    if asked is not None:
        if asked not in carried:
            return f"this bundle carries no runtime {asked!r} (it carries {', '.join(sorted(carried)) or 'none'})"
        try:
            module: ModuleType = bundle_runtimes.load_runtime(bundle, carried, asked)
        except bundle_runtimes.RuntimeLoadError as exc:
            return str(exc)
        return module
    found = bundle_runtimes.first_available(bundle, carried)
    return found[1] if found else f"none of the runtimes this bundle carries can run here ({', '.join(sorted(carried)) or 'none'})"


def _run(runtime: ModuleType, bundle: Path, manifest: dict[str, Any], repeat: int, min_repeat_ms: float,
         profile: bool) -> dict[str, Any]:
    result: dict[str, Any] = {"format": FORMAT, "model": manifest["model"], "device": runtime.device_name()}
    try:
        model = runtime.load_model(bundle, manifest, _constants(bundle, manifest))
    except _BundleError as exc:
        return {**result, "status": "bad_bundle", "error": str(exc)}
    reference = np.load(bundle / manifest["reference"])
    try:
        outputs = model.run([reference[f"input_{i}"] for i in range(len(manifest["plan"]["inputs"]))])
    except Exception as exc:  # noqa: BLE001 - a launch the device refused, or a fault: recorded, not a traceback
        return {**result, "status": "run_error", "error": f"{type(exc).__name__}: {exc}"}
    tolerance = manifest["tolerance"]
    errors = [_error(got, reference[f"output_{i}"], tolerance["rtol"]) for i, got in enumerate(outputs)]
    result["check"] = {"errors": errors, **tolerance}
    if any(error["excess"] > tolerance["atol_scale"] for error in errors):
        return {**result, "status": "wrong_result"}
    result["launches"] = model.launches
    result["latency_s"] = model.time(repeat, min_repeat_ms)
    if profile:
        result["functions"] = model.profile(min_repeat_ms / 10)
    return {**result, "status": "ok"}


class _BundleError(ValueError):
    """A bundle whose constants do not match their digests, or whose files are missing."""


def _constants(bundle: Path, manifest: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """Each constant by tensor name: from the carried file, or made again from its seed and checked."""
    carried = np.load(bundle / manifest["constants"]["file"])
    for name in carried.files:
        yield name, carried[name]
    for name, spec in manifest["constants"]["seeded"].items():
        array = seeded_array(spec["seed"], spec["shape"], spec["dtype"], spec["mean"], spec["std"])
        if digest(array) != spec["digest"]:
            raise _BundleError(f"constant {name} made from its seed differs from the one the bundle was built with")
        yield name, array


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
