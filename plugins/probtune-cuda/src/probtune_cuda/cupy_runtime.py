"""The ``cupy`` bundle runtime: CuPy launches a bundle's cubins as their launch tables say, without TVM.

probtune copies this file into every bundle that carries cubins, and the
bundle's stand-alone script loads it by path (the hook
``probtune_register_bundle_runtimes``): it imports only the standard library
and numpy, and CuPy when it runs. A candidate's calls, or a whole model's,
are captured in a CUDA graph, replayed and timed with CUDA events. A launch
table (:mod:`probtune_cuda.launch`) names its cubin under ``"cubin"``, lists
its ``launches`` in order (``kernel``, ``grid``, ``block``, ``args``,
``shared``) and the ``scratch`` buffers they share.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["GRAPH_CALLS", "GRAPH_MS", "KIND", "available", "device_name", "healthy", "load_model", "measure"]

KIND = "cubin"  # the device code this runtime launches, and the key of its file in a launch table
DEFAULT_SHARED_LIMIT = 48 * 1024  # launch-time shared memory a CUDA kernel gets without opting in
GRAPH_MS = 1.0  # the GPU time of the calls one CUDA graph replays, about
GRAPH_CALLS = 100  # calls one graph replays at most

_Launch = tuple[Any, tuple[int, ...], tuple[int, ...], tuple[Any, ...], int]  # kernel, grid, block, args, shared bytes


def _cupy() -> Any:
    import cupy  # only where the bundle runs: the machine that writes it needs no CuPy

    return cupy


def available() -> bool:
    """Whether CuPy is installed here."""
    return importlib.util.find_spec("cupy") is not None


def device_name() -> str:
    """The GPU the launches run on, as the results name it."""
    return str(_cupy().cuda.runtime.getDeviceProperties(0)["name"].decode())


def healthy() -> bool:
    """False once a fault (an illegal address, say) has broken this process's CUDA context for good."""
    cupy = _cupy()
    try:
        cupy.cuda.runtime.deviceSynchronize()
        cupy.zeros(1).sum()
    except Exception:  # noqa: BLE001 - any error here means the context is gone
        return False
    return True


def measure(timing: Any) -> Callable[..., Any]:
    """A function that checks and times one candidate of a bundle: ``run(task, candidate, bundle, inputs, expected)``.

    ``timing`` is the bundle's ``timing`` module (its ``RunTask``, ``RunReply`` and ``first_mismatch``).
    """
    cupy = _cupy()

    def run(task: Any, candidate: dict[str, Any], bundle: Path, inputs: Any, expected: Any) -> Any:
        call, outputs = candidate_program(cupy, bundle, candidate["kernels"], inputs, expected)
        call()
        cupy.cuda.Device().synchronize()
        mismatch = timing.first_mismatch([cupy.asnumpy(out) for out in outputs], expected, task.rtol, task.atol)
        if mismatch is not None:
            return timing.RunReply("wrong_result", (), mismatch)
        for _ in range(task.warmup):
            call()
        return timing.RunReply("ok", candidate_timings(cupy, call, task, timing.describe_error), None)

    return run


def candidate_program(cupy: Any, bundle: Path, table: dict[str, Any], inputs: Any, expected: Any) -> tuple[Any, list[Any]]:
    """A function that runs the program's launches in order, and its output arrays."""
    module = cupy.RawModule(path=str(bundle / table[KIND]))
    params = [cupy.asarray(array) for array in inputs] + [cupy.zeros(array.shape, array.dtype) for array in expected]
    scratch = _scratch(cupy, table)

    def argument(arg: dict[str, Any]) -> Any:
        return params[arg["param"]] if "param" in arg else _other_argument(arg, scratch)

    launches = [_launch(module, launch, argument) for launch in table["launches"]]
    return lambda: _call(launches), params[len(inputs) :]


def candidate_timings(cupy: Any, call: Any, task: Any, describe: Callable[[BaseException], str]) -> tuple[float, ...]:
    """Seconds per call, one figure per repeat of ``task``; a repeat makes as many calls as last its ``min_repeat_ms``.

    The calls are captured in a CUDA graph and replayed, as many per graph as
    last about ``GRAPH_MS``: launched one by one from Python, a kernel of a few
    microseconds would be timed at the speed of the launches. Where a graph
    cannot be made (``describe`` says why), the calls are launched one by one.
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
        unit = _graph(stream, call, calls, describe)
        if unit is None:
            unit, calls = call, 1
        per_unit = elapsed(unit, 1)
        number = max(1, int(task.min_repeat_ms / 1e3 / per_unit)) if per_unit > 0 else 1
        return tuple(elapsed(unit, number) / number / calls for _ in range(task.repeat))


def _graph(stream: Any, call: Any, calls: int, describe: Callable[[BaseException], str]) -> Any:
    """A function that replays ``calls`` calls captured in a CUDA graph on ``stream``; None where capture fails."""
    try:
        stream.begin_capture()
        try:
            for _ in range(calls):
                call()
        finally:
            graph = stream.end_capture()
    except Exception as error:  # noqa: BLE001 - timed launch by launch instead
        print(f"no CUDA graph ({describe(error)}): launches timed one by one", file=sys.stderr)
        return None
    return lambda: graph.launch(stream)


def load_model(bundle: Path, manifest: dict[str, Any], constants: Iterable[tuple[str, np.ndarray]]) -> _Model:
    """A model bundle's memory on the GPU, its constants in place, and its launches, ready to run."""
    return _Model(_cupy(), bundle, manifest, constants)


class _Model:
    """The model's memory on the GPU and its launches: ``launches`` (how many), ``run``, ``time``, ``profile``."""

    def __init__(self, cupy: Any, bundle: Path, manifest: dict[str, Any], constants: Iterable[tuple[str, np.ndarray]]) -> None:
        self.cupy = cupy
        plan = manifest["plan"]
        self.storages = {name: cupy.zeros(size, dtype=np.uint8) for name, size in plan["storages"].items()}
        self.tensors = {name: self._view(t) for name, t in plan["tensors"].items()}
        for name, array in constants:
            self.tensors[name][...] = cupy.asarray(array)
        self.inputs = [self.tensors[name] for name in plan["inputs"]]
        self.outputs = [self.tensors[name] for name in plan["outputs"]]
        functions = manifest["functions"]
        modules = {name: cupy.RawModule(path=str(bundle / function[KIND])) for name, function in functions.items()}
        self._launches: list[tuple[str, _Launch]] = []
        for call in plan["calls"]:
            function = functions[call["function"]]
            scratch = _scratch(cupy, function)

            def argument(arg: dict[str, Any], tensors: list[str] = call["args"], scratch: dict[str, Any] = scratch) -> Any:
                return self.tensors[tensors[arg["param"]]] if "param" in arg else _other_argument(arg, scratch)

            for launch in function["launches"]:
                self._launches.append((call["function"], _launch(modules[call["function"]], launch, argument)))

    @property
    def launches(self) -> int:
        return len(self._launches)

    def _view(self, tensor: dict[str, Any]) -> Any:
        size = int(np.prod(tensor["shape"], dtype=np.int64)) * np.dtype(tensor["dtype"]).itemsize
        raw = self.storages[tensor["storage"]][tensor["offset"] : tensor["offset"] + size]
        return raw.view(tensor["dtype"]).reshape(tensor["shape"])

    def call(self, only: str | None = None) -> None:
        _call([launch for function, launch in self._launches if only is None or function == only])

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """The model's outputs on ``inputs``."""
        for tensor, array in zip(self.inputs, inputs):
            tensor[...] = self.cupy.asarray(array)
        self.call()
        self.cupy.cuda.Device().synchronize()
        return [self.cupy.asnumpy(out) for out in self.outputs]

    def time(self, repeat: int, min_repeat_ms: float) -> list[float]:
        """Seconds per whole call, one figure per repeat, each call replayed from one CUDA graph."""
        return _model_timings(self.cupy, lambda: self.call(), repeat, min_repeat_ms)

    def profile(self, min_repeat_ms: float) -> dict[str, dict[str, float]]:
        """Each function's calls alone, replayed from a graph: seconds per model call, and its launches."""
        found = {}
        for name in sorted({function for function, _ in self._launches}):
            seconds = _model_timings(self.cupy, lambda name=name: self.call(name), 3, min_repeat_ms)
            found[name] = {"seconds": float(np.median(seconds)),
                           "launches": sum(1 for function, _ in self._launches if function == name)}
        return found


def _model_timings(cupy: Any, call: Any, repeat: int, min_repeat_ms: float) -> list[float]:
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


def _scratch(cupy: Any, table: dict[str, Any]) -> dict[str, Any]:
    """The zeroed buffers a table's launches share, by name."""
    return {b["name"]: cupy.zeros(b["elements"], dtype=b["dtype"]) for b in table["scratch"]}


def _other_argument(arg: dict[str, Any], scratch: dict[str, Any]) -> Any:
    """A launch argument that is not a parameter: a scratch buffer or a scalar."""
    return scratch[arg["scratch"]] if "scratch" in arg else np.dtype(arg["dtype"]).type(arg["scalar"])


def _launch(module: Any, launch: dict[str, Any], argument: Callable[[dict[str, Any]], Any]) -> _Launch:
    """One launch of a table, ready to call: its kernel, grid, block, arguments and shared memory."""
    kernel = _kernel(module, launch["kernel"], launch["shared"])
    return kernel, tuple(launch["grid"]), tuple(launch["block"]), tuple(argument(a) for a in launch["args"]), launch["shared"]


def _call(launches: list[_Launch]) -> None:
    for kernel, grid, block, args, shared in launches:
        kernel(grid, block, args, shared_mem=shared)


def _kernel(module: Any, name: str, shared: int) -> Any:
    """A kernel of the module, allowed the launch-time shared memory it asks for (beyond 48 KB a kernel must opt in)."""
    kernel = module.get_function(name)
    if shared > DEFAULT_SHARED_LIMIT:
        kernel.max_dynamic_shared_size_bytes = shared
    return kernel
