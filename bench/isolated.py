"""Each inference engine in its own process, so that no other engine's threads share the cores while it is timed.

onnxruntime, OpenVINO and TVM's runtime each keep a pool of worker threads
that spin for a while after a call; on a 2-core machine, engines loaded in one
process slow each other down (most for small models, made of many short
kernels). A :class:`Worker` loads one engine in a fresh process and runs it
only when asked; the benchmark asks one worker at a time, and pauses between
them so that the previous engine's threads have gone to sleep.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PAUSE_SECONDS = 0.2  # between two engines' turns: long enough for spinning worker threads to sleep


@dataclass(frozen=True)
class Engine:
    """What a worker loads: ``kind`` ("onnxruntime", "openvino" or "tvm", a compiled model's library) and its files."""

    kind: str
    model_path: Path
    shapes: dict[str, tuple[int, ...]]
    threads: int
    library: Path | None = None
    precision: str = "f32"  # OpenVINO's inference precision hint (f32 or bf16)


def load_engine(engine: Engine) -> Callable[..., list[np.ndarray]]:
    """The engine as ``run(*arrays) -> outputs``, loaded in this process."""
    from probtune.model import CompiledModel, load_model
    from probtune.model.check import onnxruntime_runner

    model = load_model(engine.model_path, engine.shapes)
    if engine.kind == "onnxruntime":
        return onnxruntime_runner(model, engine.threads)
    if engine.kind == "openvino":
        import openvino

        core = openvino.Core()
        core.set_property("CPU", {"INFERENCE_NUM_THREADS": engine.threads})
        # pinned: on a CPU with bf16 instructions OpenVINO would otherwise choose bf16 itself
        compiled = core.compile_model(str(engine.model_path), "CPU",
                                      {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": engine.precision})
        request = compiled.create_infer_request()
        return lambda *arrays: [np.array(request.infer(list(arrays))[out]) for out in compiled.outputs]
    if engine.kind == "tvm":
        if engine.library is None:
            raise ValueError("a TVM engine needs the compiled model's library")
        return CompiledModel.load(engine.library, model.inputs, engine.threads)
    raise ValueError(f"unknown engine {engine.kind!r}")


def _serve(conn: Any, engine: Engine) -> None:
    """The worker process: load the engine, then run or time it on request until told to stop."""
    try:
        run = load_engine(engine)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which names the engine
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    while (request := conn.recv()) is not None:
        command, arrays, calls = request
        try:
            if command == "run":
                conn.send(("ok", run(*arrays)))
            else:
                started = time.perf_counter()
                for _ in range(calls):
                    run(*arrays)
                conn.send(("ok", (time.perf_counter() - started) / calls))
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class Worker:
    """One engine in its own process: ``worker(*arrays)`` runs it, :meth:`time` times it."""

    def __init__(self, engine: Engine) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, engine), daemon=True)
        self.process.start()
        status, message = self.conn.recv()
        if status != "ready":
            self.close()
            raise RuntimeError(f"{engine.kind} could not be loaded: {message}")

    def _ask(self, command: str, arrays: list[np.ndarray], calls: int = 1) -> Any:
        self.conn.send((command, list(arrays), calls))
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(value)
        return value

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        return self._ask("run", list(arrays))

    def time(self, arrays: list[np.ndarray], calls: int) -> float:
        """Seconds per call, over ``calls`` back-to-back calls."""
        return float(self._ask("time", arrays, calls))

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()


def time_in_turn(workers: dict[str, Worker], inputs: list[np.ndarray], rounds: int, budget_s: float) -> dict[str, list[float]]:
    """Seconds per call of each engine, one figure per round: each engine is timed alone in turn for about ``budget_s``.

    The order rotates from round to round, so that no engine always follows the same one.
    """
    calls = {}
    for name, worker in workers.items():
        once = worker.time(inputs, 1)  # also a warm-up
        calls[name] = max(1, int(budget_s / max(once, 1e-6)))
    samples: dict[str, list[float]] = {name: [] for name in workers}
    names = list(workers)
    for round_ in range(rounds):
        for name in names[round_ % len(names):] + names[: round_ % len(names)]:
            time.sleep(PAUSE_SECONDS)
            samples[name].append(workers[name].time(inputs, calls[name]))
    return samples


def time_engines_in_turn(
    engines: dict[str, Engine], inputs: list[np.ndarray], rounds: int, budget_s: float
) -> dict[str, list[float]]:
    """:func:`time_in_turn` of ``engines``, each loaded in a worker process of its own, closed afterwards."""
    workers: dict[str, Worker] = {}
    try:
        for key, engine in engines.items():
            workers[key] = Worker(engine)
        return time_in_turn(workers, inputs, rounds, budget_s)
    finally:
        for worker in workers.values():
            worker.close()


def median_ratio(numerator: list[float], denominator: list[float]) -> float:
    """The median over rounds of one engine's time over another's, both taken in the same round.

    On a machine whose speed drifts over seconds, this compares the engines
    at the same moments, which the ratio of their medians does not.
    """
    return float(np.median(np.asarray(numerator) / np.asarray(denominator)))
