"""Check and time built candidates, one at a time, in a separate process.

The child process loads each artifact, runs it once on the reference inputs and
compares every output with the reference before timing it, so a fast but wrong
program is never reported as a latency.  A candidate that crashes the child or
runs past the timeout gets the child killed; the next candidate gets a fresh one.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import time
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import tvm

from probtune.defaults import LOCAL
from probtune.interfaces import TargetSpec
from probtune.measure._process import WorkerProcess
from probtune.measure._worker import run_worker_main
from probtune.measure.codegen import device_type
from probtune.measure.results import BuildResult, MeasureReference, MeasureStatus, RunResult, not_built
from probtune.measure.timing import RunTask, save_arrays, sha256

if TYPE_CHECKING:
    from probtune.workloads.workload import Workload

__all__ = ["LocalRunner", "local_device_name", "prepare_reference", "save_reference"]

_STARTUP_TIMEOUT = 120.0  # importing TVM takes about a second; minutes mean something is broken
CPU_DEVICE = 1  # DLPack's device type of the host CPU
NAME_CHARS = 64  # of a workload's name in its reference's file name (with the digest, far below the 255 allowed)


def prepare_reference(
    workload: Workload, workdir: str | os.PathLike[str], seed: int = 0
) -> MeasureReference:
    """Compute the reference outputs once, in the tuning process, and save them for the runner (:func:`save_reference`)."""
    drawn, outputs = workload.reference_case(seed)
    inputs = [np.asarray(array, order="C") for array in drawn]
    output_specs = workload.param_specs()[workload.num_inputs :]
    if len(outputs) != len(output_specs):
        raise ValueError(
            f"workload {workload.name!r} has {len(output_specs)} outputs but its reference "
            f"returned {len(outputs)}"
        )
    arrays = {f"input_{i}": array for i, array in enumerate(inputs)}
    for i, (array, (shape, dtype)) in enumerate(zip(outputs, output_specs)):
        array = np.asarray(array)
        if array.shape != shape:
            raise ValueError(
                f"workload {workload.name!r}: reference output {i} has shape {array.shape}, "
                f"the program's output has {shape}"
            )
        arrays[f"output_{i}"] = np.asarray(array, dtype=dtype, order="C")
    # scaled by these outputs, not by those of another seed's inputs
    rtol, atol = workload.tolerance(outputs, workload.rounding_change(inputs, outputs, seed))
    return save_reference(arrays, workload.name, workdir, workload.num_inputs, float(rtol), float(atol))


def save_reference(
    arrays: dict[str, np.ndarray], name: str, workdir: str | os.PathLike[str], num_inputs: int, rtol: float, atol: float
) -> MeasureReference:
    """Save ``arrays`` (``input_0``.., ``output_0``..) for the runner, in a file named by ``name`` and a digest of them.

    The digest in the name lets a runner that caches references by path never
    confuse two of them; a file already there is the same content. The name's
    part is cut to :data:`NAME_CHARS`: a fused task of a real model can be named
    by hundreds of operators, more than a file name may hold.
    """
    digest = hashlib.sha256("".join(f"{key}:{sha256(array)};" for key, array in arrays.items()).encode())
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:NAME_CHARS]
    path = Path(workdir).resolve() / f"reference-{slug}-{digest.hexdigest()[:16]}.npz"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.stem}.{os.getpid()}.partial.npz")
        save_arrays(partial, arrays)
        os.replace(partial, path)  # readers never see half a file
    return MeasureReference(str(path), num_inputs, rtol, atol)


def local_device_name(target: TargetSpec) -> str:
    """What this machine's device for ``target`` is called: the target says (a CPU's model), or the host's name."""
    if target.local_device is not None:
        return target.local_device()
    return platform.node() or "this machine"


class LocalRunner:
    """Times candidates on this machine, sequentially, in one long-lived child process.

    ``timeout`` bounds one candidate: loading, the check, warmup and timing.
    ``min_repeat_ms`` makes TVM's timer run each repeat that long (it picks how
    many calls one repeat makes); ``latencies`` are seconds per call, one per
    repeat.  ``num_threads`` sets TVM's thread pool in the child; ``None`` takes
    the target's ``num-cores`` (TVM's own default is half the logical
    CPUs, as it assumes SMT, which would leave a core of this machine idle).
    With ``cache_flush``, every call is timed cold: the candidate's arguments
    (input, weights and outputs) are flushed from the CPU caches before it, as
    they mostly are when the kernel runs inside a whole model.
    """

    name = LOCAL

    def __init__(
        self,
        timeout: float = 10.0,
        repeat: int = 3,
        min_repeat_ms: float = 50.0,
        warmup: int = 1,
        num_threads: int | None = None,
        cache_flush: bool = False,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if repeat < 1:
            raise ValueError(f"repeat must be at least 1, got {repeat}")
        if min_repeat_ms < 0 or warmup < 0:
            raise ValueError("min_repeat_ms and warmup must not be negative")
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be at least 1, got {num_threads}")
        self.timeout = timeout
        self.repeat = repeat
        self.min_repeat_ms = min_repeat_ms
        self.warmup = warmup
        self.num_threads = num_threads
        self.cache_flush = cache_flush
        self._children: list[WorkerProcess] = []  # at most one; shared with the finalizer
        self._child_threads: int | None = None
        self._finalizer = weakref.finalize(self, _kill_all, self._children)

    def run(
        self,
        reference: MeasureReference,
        artifacts: Sequence[str | BuildResult | None],
        target: TargetSpec,
        *,
        stop_above: float | None = None,
    ) -> Iterator[tuple[int, RunResult]]:
        """Yield ``(index into artifacts, result)`` for each candidate, in order.

        An item is an artifact path, or the builder's result (whose error is
        passed on as a "build_error"), or None for a candidate that did not build.
        A candidate whose first timed repeat is slower than ``stop_above`` seconds
        per call cannot be the best, so it gets that one latency and no more
        repeats; it also skips the warmup when its check call alone took longer.
        """
        if not self._finalizer.alive:
            raise RuntimeError("this LocalRunner is closed")
        if stop_above is not None and not stop_above >= 0:
            raise ValueError(f"stop_above must not be negative, got {stop_above}")
        if not os.path.isfile(reference.path):
            raise FileNotFoundError(f"reference file {reference.path} does not exist")
        device = device_type(target)
        if self.cache_flush and device != CPU_DEVICE:
            raise ValueError(f"cache_flush flushes CPU caches; target {target.name!r} runs on {tvm.device(device, 0)}")
        threads = self.num_threads if self.num_threads is not None else target.tvm_target.get("num-cores")
        threads = None if threads is None else int(threads)
        return self._run(reference, list(artifacts), device, threads, stop_above)

    def device_name(self, target: TargetSpec) -> str:
        return local_device_name(target)

    def close(self) -> None:
        """Kill the child process; the runner cannot be used afterwards."""
        self._finalizer()

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run(
        self,
        reference: MeasureReference,
        artifacts: list[str | BuildResult | None],
        device: int,
        threads: int | None,
        stop_above: float | None,
    ) -> Iterator[tuple[int, RunResult]]:
        for index, item in enumerate(artifacts):
            failed = not_built(item)
            if failed is not None:
                yield index, failed
                continue
            artifact = item.artifact if isinstance(item, BuildResult) else item
            task = RunTask(
                reference.path,
                reference.num_inputs,
                reference.rtol,
                reference.atol,
                str(artifact),
                device,
                self.repeat,
                self.min_repeat_ms,
                self.warmup,
                stop_above,
                self.cache_flush,
            )
            yield index, self._measure(task, threads)

    def _measure(self, task: RunTask, threads: int | None) -> RunResult:
        child = self._ready_child(threads)
        started = time.perf_counter()
        child.connection.send(task)
        if not child.connection.poll(self.timeout):
            self._discard_child()
            reason = f"timed out after {self.timeout:g} s"
            return RunResult(MeasureStatus.TIMEOUT, (), reason, time.perf_counter() - started)
        try:
            reply = child.connection.recv()
        except (EOFError, ConnectionResetError):
            how = self._discard_child()
            return RunResult(MeasureStatus.CRASH, (), f"runner crashed ({how})", time.perf_counter() - started)
        return RunResult(MeasureStatus(reply.status), reply.latencies, reply.error, time.perf_counter() - started)

    def _ready_child(self, threads: int | None) -> WorkerProcess:
        """The child, started now if there is none; replaced if it died while idle or has other threads."""
        if self._children and (self._children[0].connection.poll() or self._child_threads != threads):
            self._discard_child()  # an idle child only speaks by dying
        if not self._children:
            child = WorkerProcess(run_worker_main, (threads,), name="probtune runner")
            self._children.append(child)
            self._child_threads = threads
            try:
                child.wait_ready(_STARTUP_TIMEOUT)
            except BaseException:
                self._discard_child()
                raise
        return self._children[0]

    def _discard_child(self) -> str:
        return self._children.pop().kill()


def _kill_all(children: list[WorkerProcess]) -> None:
    while children:
        children.pop().kill()
