"""What the benchmarks share: TVM MetaSchedule set up as fairly as possible, and in-process timing.

Importing this module sets ``TVM_NUM_THREADS`` to the number of CPUs (numpy's
BLAS uses every core; TVM's x86 default is half of them) unless it is set, so
import it before TVM.
"""

from __future__ import annotations

import math
import os
import platform
import re
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count()))

import numpy as np
import tvm

from probtune.plugins import get_registry
from probtune.workloads.workload import Workload, parse_shape

MS_FAILED_SECONDS = 1e9
"""What TVM MetaSchedule records for a candidate that failed to build or run."""
_MS_TASK_LOG = "tvm.s_tir.meta_schedule.logging.task_0_main.log"


_KIND_MARKS = (
    ("mma.sync", 'scope="warp"'),
    ("cp.async", "software_pipeline_async_stages"),
    ("register-staged", "manifest_shared_memory_local_stage"),
)


def program_kind(script: str) -> str:
    """A tensor-core program's kind, as its TVM script shows it: ``warp`` fragments (``mma.sync``) and either
    software pipeline, joined by "+"; "plain" is none of them."""
    return "+".join(name for name, mark in _KIND_MARKS if mark in script) or "plain"


def geomean(values: list[float]) -> float | None:
    """The geometric mean, rounded to 4 decimals (None for no values): how ratios are summarized."""
    return round(float(np.exp(np.mean(np.log(values)))), 4) if values else None


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def tune_guarded(entry: dict[str, Any], system: str, tune: Callable[[], tuple[dict, Any]]) -> tuple[dict, Any] | None:
    """Run one system's tuning; a failure is recorded in ``entry`` (and the suite goes on) instead of raised."""
    try:
        return tune()
    except Exception as error:  # noqa: BLE001 - one system failing must not stop the suite
        traceback.print_exc()
        entry[system] = {"error": f"{type(error).__name__}: {error}"}
        entry["problems"].append(f"{system} failed: {type(error).__name__}: {error}")
        return None


def bench_each(works: list[Workload], bench_one: Callable[[Workload], dict], **failed: Any) -> list[dict]:
    """``bench_one`` of every workload; one that raises gives an entry naming the problem (plus ``failed``)."""
    entries = []
    for work in works:
        try:
            entries.append(bench_one(work))
        except Exception as error:  # noqa: BLE001
            traceback.print_exc()
            entries.append({"workload": work.key, "name": work.name, **failed,
                            "problems": [f"benchmark failed: {type(error).__name__}: {error}"]})
    return entries


# ---------------------------------------------------------------- TVM MetaSchedule


def _pickle_by_value() -> None:
    """MetaSchedule's worker processes unpickle our build function; they cannot import this module."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


_pickle_by_value()


def ms_build_without_intrinsics(mod: tvm.IRModule, target: tvm.target.Target, _params: Any) -> Any:
    """TVM MetaSchedule's default build function, minus its ``import tvm.s_tir.tensor_intrin``.

    The stock function imports every tensor intrinsic (CUDA, ROCm, Hexagon, ARM...)
    in each builder process: 30-45 s on this 2-core machine (CUDA's alone ~27 s).
    MetaSchedule starts fresh builder processes for every batch and counts that
    import against the build timeout, so with the stock function every candidate
    times out, at TVM's 30 s default and at 60 s alike (``--tvm-stock-builder``
    shows it).  The x86 design space tensorizes nothing, so the compiled program
    is the same.
    """
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.tirx.build(mod, target=target, pipeline="default")  # what tvm.driver.build, which the stock one calls, does


def tvm_import_intrinsics() -> float:
    """Import TVM's tensor intrinsics once, before any timed tuning; return the seconds it took.

    MetaSchedule's TuneContext imports them on first use; that one-time cost (tens of
    seconds here) says nothing about the design space, so it is kept out of the first
    workload's tuning time and reported on its own.
    """
    started = time.perf_counter()
    import tvm.s_tir.tensor_intrin  # noqa: F401

    return time.perf_counter() - started


def tvm_log_counts(work_dir: Path) -> dict[str, int]:
    """Failures as MetaSchedule's task log names them (its database only holds 1e10 for each)."""
    log = work_dir / "logs" / _MS_TASK_LOG
    text = log.read_text(errors="replace") if log.exists() else ""
    return {
        "build_error": len(re.findall(r"Trial #\d+: Error in building", text)),
        "run_error": len(re.findall(r"Trial #\d+: Error in running", text)),
        "timeout": len(re.findall(r"Timeout, killed after", text)),
    }


# ---------------------------------------------------------------- timing in this process


@dataclass
class Contender:
    """One program to time: ``call_once()`` runs it once; ``time_round(n)`` returns seconds per call over ``n`` calls."""

    name: str
    call_once: Callable[[], list[np.ndarray]]
    time_round: Callable[[int], float]
    calls_per_round: int = 1


def tvm_contender(name: str, lib: Any, work: Workload, inputs: list[np.ndarray]) -> Contender:
    dev = tvm.cpu()
    in_tensors = [tvm.runtime.tensor(x, dev) for x in inputs]
    out_specs = work.param_specs()[work.num_inputs:]

    def fresh_outputs() -> list[Any]:
        return [tvm.runtime.tensor(np.zeros(shape, dtype), dev) for shape, dtype in out_specs]

    timing_outputs = fresh_outputs()

    def call_once() -> list[np.ndarray]:
        outputs = fresh_outputs()
        lib["main"](*in_tensors, *outputs)
        return [t.numpy() for t in outputs]

    def time_round(calls: int) -> float:
        evaluator = lib.mod.time_evaluator("main", dev, number=calls, repeat=1)
        return float(evaluator(*in_tensors, *timing_outputs).mean)

    return Contender(name, call_once, time_round)


def numpy_contender(work: Workload, inputs: list[np.ndarray]) -> Contender:
    def call_once() -> list[np.ndarray]:
        out = work.baseline(*inputs)
        return list(out) if isinstance(out, (list, tuple)) else [np.asarray(out)]

    def time_round(calls: int) -> float:
        started = time.perf_counter()
        for _ in range(calls):
            work.baseline(*inputs)
        return (time.perf_counter() - started) / calls

    return Contender("numpy", call_once, time_round)


def check_outputs(work: Workload, got: list[np.ndarray], expected: list[np.ndarray]) -> dict:
    rtol, atol = work.tolerance(expected)
    correct = len(got) == len(expected) and all(
        g.shape == e.shape and bool(np.allclose(g, e, rtol=rtol, atol=atol)) for g, e in zip(got, expected)
    )
    max_error = max(
        (float(np.max(np.abs(g.astype(np.float64) - e.astype(np.float64)))) for g, e in zip(got, expected)
         if g.shape == e.shape and g.size),
        default=None,
    )
    return {"correct": correct, "max_abs_error": max_error, "rtol": rtol, "atol": atol}


def calibrate(contender: Contender, round_ms: float) -> None:
    """Pick the calls per round so that one round lasts about ``round_ms``."""
    contender.time_round(1)  # warm up (caches, thread pool)
    one = min(contender.time_round(1) for _ in range(3))
    contender.calls_per_round = max(1, math.ceil(round_ms / 1e3 / max(one, 1e-9)))


SETTLE_SECONDS = 0.3
"""Idle time before each timed round. The thread pools of OpenBLAS, onnxruntime and TVM's runtime
busy-wait for a while after their last task; a program timed while another runtime's threads
still spin on these 2 cores measured up to 3.6x slower (a TVM batch matmul right after numpy)."""


def time_interleaved(contenders: list[Contender], rounds: int, round_ms: float) -> dict[str, float]:
    """Median seconds per call of each contender; every round times each once, in a rotating order.

    Before each timed round the machine is left idle for ``SETTLE_SECONDS``, so the previous
    contender's threads are asleep, then the contender makes one untimed call to wake its own.
    """
    for contender in contenders:
        calibrate(contender, round_ms)
    samples: dict[str, list[float]] = {c.name: [] for c in contenders}
    for r in range(rounds):
        shift = r % len(contenders)
        for contender in contenders[shift:] + contenders[:shift]:
            time.sleep(SETTLE_SECONDS)
            contender.time_round(1)
            samples[contender.name].append(contender.time_round(contender.calls_per_round))
    return {name: float(np.median(values)) for name, values in samples.items()}


def parse_workload(text: str, dtype: str) -> Workload:
    """``name`` (the catalog's default shape) or ``name:shape``, e.g. ``matmul:64,64,64``."""
    specs = get_registry().workloads
    name, _, shape = text.partition(":")
    if name not in specs:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(sorted(specs))}")
    values = parse_shape(shape, allow_zero=True) if shape else specs[name].default_shape
    return specs[name].instantiate(values, dtype)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
