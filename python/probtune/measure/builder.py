"""Compile candidates in parallel, in worker processes that can be killed.

A candidate that TVM rejects gets its error; one that crashes its worker or
compiles for longer than the timeout gets its worker killed and replaced.  The
other candidates are not affected, and every result is yielded as soon as it
is known so that the caller can record it.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, NamedTuple

import tvm

from probtune.defaults import LOCAL
from probtune.interfaces import Compiler, TargetSpec
from probtune.measure._process import WorkerProcess, WorkerStartError
from probtune.measure._worker import BuildReply, BuildTask, build_worker_main
from probtune.measure.results import BuildResult

__all__ = ["LocalBuilder"]


class _Compilation(NamedTuple):
    """What every candidate of one ``build`` call is compiled for."""

    target: dict[str, Any]
    compiler: Compiler | None


_STARTUP_TIMEOUT = 120.0  # importing TVM takes about a second; minutes mean something is broken


@dataclass
class _Slot:
    """A builder worker and the candidate it is compiling, if any."""

    worker: WorkerProcess
    since: float  # when the worker was started or given its candidate
    ready: bool = False
    index: int | None = None
    task: BuildTask | None = None


class LocalBuilder:
    """Builds candidates for a target in ``workers`` long-lived processes on this machine.

    Workers start at the first :meth:`build` and stay for the next ones (they
    wait idle, using no CPU, while the caller times the results, or realize
    candidates for the search: :meth:`lend_workers`); a worker that
    has grown past ``max_worker_mb`` of memory is replaced after its build, as
    memory LLVM once took is not given back.  Artifacts are
    left in ``workdir`` for the caller to delete.
    """

    name = LOCAL

    def __init__(self, workers: int | None = None, timeout: float = 60.0, max_worker_mb: float = 1024.0) -> None:
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if max_worker_mb <= 0:
            raise ValueError(f"max_worker_mb must be positive, got {max_worker_mb}")
        self.workers = workers or os.cpu_count() or 1
        self.timeout = timeout
        self.max_worker_bytes = int(max_worker_mb * 2**20)
        self._slots: list[_Slot] = []
        self._building = False
        self._finalizer = weakref.finalize(self, _kill_all, self._slots)

    def build(
        self,
        programs: Sequence[tvm.IRModule | str],
        target: TargetSpec,
        workdir: str | os.PathLike[str],
    ) -> Iterator[tuple[int, BuildResult]]:
        """Yield ``(index into programs, result)`` for every candidate, in the order they finish.

        A program is an ``IRModule`` or its ``tvm.ir.save_json`` text, compiled
        as ``target`` compiles it (:func:`probtune.measure.codegen.compile_for`).

        Stopping the iteration early kills the workers still compiling.
        """
        if not self._finalizer.alive:
            raise RuntimeError("this LocalBuilder is closed")
        tvm.target.Target(target.tvm_target)  # a bad target fails here once, not once per candidate
        workdir = Path(workdir).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        return self._build(list(programs), _Compilation(dict(target.tvm_target), target.compiler), workdir)

    def lend_workers(self, count: int) -> list[WorkerProcess]:
        """Up to ``count`` of the workers, started if need be and ready, for other tasks between builds.

        A worker answers any picklable callable it is sent with what that
        returns (see ``build_worker_main``). The borrower must have read every
        reply before the next build, and may kill a worker that fails it: the
        builder replaces it. Raises ``WorkerStartError`` (that worker dropped)
        if one does not start.
        """
        if not self._finalizer.alive:
            raise RuntimeError("this LocalBuilder is closed")
        if self._building:
            raise RuntimeError("LocalBuilder.build is running: its workers are busy")
        for slot in self._slots:
            if slot.worker.finished:
                self._replace(slot)
        while len(self._slots) < min(count, self.workers):
            self._slots.append(self._start_slot())
        lent = self._slots[:count]
        for slot in lent:
            if not slot.ready:
                try:
                    slot.worker.wait_ready(_STARTUP_TIMEOUT)
                except WorkerStartError:
                    self._slots.remove(slot)
                    raise
                slot.ready = True
        return [slot.worker for slot in lent]

    def close(self) -> None:
        """Kill the workers; the builder cannot be used afterwards."""
        self._finalizer()

    def __enter__(self) -> LocalBuilder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _build(
        self, programs: list[tvm.IRModule | str], compilation: _Compilation, workdir: Path
    ) -> Iterator[tuple[int, BuildResult]]:
        if self._building:
            raise RuntimeError("LocalBuilder.build is already running: finish or close it first")
        self._building = True
        pending = deque(range(len(programs)))
        try:
            while len(self._slots) < min(self.workers, len(programs)):
                self._slots.append(self._start_slot())
            while pending or any(slot.index is not None for slot in self._slots):
                self._dispatch(pending, programs, compilation, workdir)
                self._wait_for_news()
                for slot in self._slots:
                    outcome = self._collect(slot)
                    if outcome is not None:
                        # Keep the workers busy while the caller records the result.
                        self._dispatch(pending, programs, compilation, workdir)
                        yield outcome
        finally:
            self._building = False
            self._abandon_unfinished()

    def _start_slot(self) -> _Slot:
        worker = WorkerProcess(build_worker_main, (), name="probtune builder worker")
        return _Slot(worker, since=time.perf_counter())

    def _dispatch(
        self, pending: deque[int], programs: list[tvm.IRModule | str], compilation: _Compilation, workdir: Path
    ) -> None:
        """Give each idle worker the next pending candidate."""
        for slot in self._slots:
            if not pending:
                return
            if not slot.ready or slot.index is not None:
                continue
            # an idle worker says nothing unless it died (or a borrower left a reply unread, or killed it)
            if slot.worker.finished or slot.worker.connection.poll():
                self._replace(slot)
                continue
            index = pending.popleft()
            stem = workdir / f"candidate-{uuid.uuid4().hex}"
            program = programs[index]
            text = program if isinstance(program, str) else tvm.ir.save_json(program)
            task = BuildTask(text, compilation.target, compilation.compiler, f"{stem}.so", f"{stem}.tmp")
            slot.worker.connection.send(task)
            slot.index, slot.task, slot.since = index, task, time.perf_counter()

    def _wait_for_news(self) -> None:
        """Sleep until a worker has sent something or died, or until the nearest deadline."""
        waiting = [slot for slot in self._slots if slot.index is not None or not slot.ready]
        if not waiting:
            return
        deadline = min(slot.since + self._limit(slot) for slot in waiting)
        wait([slot.worker.connection for slot in waiting], max(0.0, deadline - time.perf_counter()))

    def _collect(self, slot: _Slot) -> tuple[int, BuildResult] | None:
        """The slot's finished candidate, if any; handles startups, crashes and timeouts."""
        if slot.ready and slot.index is None:
            return None
        elapsed = time.perf_counter() - slot.since
        if slot.worker.connection.poll():
            try:
                message = slot.worker.connection.recv()
            except (EOFError, ConnectionResetError):
                return self._worker_died(slot, elapsed)
            if not slot.ready:  # its first message says it is ready
                slot.ready = True
                return None
            assert slot.task is not None  # a ready worker that sent a result was given a task
            outcome = self._finish(slot, _result_of(message, slot.task))
            if message.resident_bytes > self.max_worker_bytes:
                self._replace(slot)  # what LLVM allocated stays with the process: start a fresh one
            return outcome
        if elapsed < self._limit(slot):
            return None
        if not slot.ready:
            self._drop(slot)
            raise WorkerStartError(f"builder worker did not start within {_STARTUP_TIMEOUT:g} s")
        self._replace(slot)
        timed_out = BuildResult(None, f"build timed out after {self.timeout:g} s", elapsed)
        return self._finish(slot, timed_out)

    def _worker_died(self, slot: _Slot, elapsed: float) -> tuple[int, BuildResult]:
        how = slot.worker.kill()
        if not slot.ready:
            self._drop(slot)
            raise WorkerStartError(f"builder worker failed to start ({how})")
        self._replace(slot)
        return self._finish(slot, BuildResult(None, f"builder worker crashed ({how})", elapsed))

    def _finish(self, slot: _Slot, result: BuildResult) -> tuple[int, BuildResult]:
        index, task = slot.index, slot.task
        assert index is not None and task is not None
        if result.artifact is None:
            _discard(task)
        slot.index, slot.task = None, None
        return index, result

    def _replace(self, slot: _Slot) -> None:
        """Kill the slot's worker and start a fresh one; the slot keeps its candidate to report."""
        slot.worker.kill()
        fresh = self._start_slot()
        slot.worker, slot.since, slot.ready = fresh.worker, fresh.since, False

    def _limit(self, slot: _Slot) -> float:
        return self.timeout if slot.ready else _STARTUP_TIMEOUT

    def _abandon_unfinished(self) -> None:
        """Kill workers whose results nobody will read (the caller stopped iterating)."""
        for slot in [slot for slot in self._slots if slot.index is not None]:
            assert slot.task is not None
            _discard(slot.task)
            self._drop(slot)

    def _drop(self, slot: _Slot) -> None:
        slot.worker.kill()
        self._slots.remove(slot)


def _result_of(reply: BuildReply, task: BuildTask) -> BuildResult:
    artifact = task.artifact_path if reply.error is None else None
    return BuildResult(artifact, reply.error, reply.seconds)


def _discard(task: BuildTask) -> None:
    """Remove what an unfinished or failed build may have left behind."""
    Path(task.artifact_path).unlink(missing_ok=True)
    shutil.rmtree(task.scratch_dir, ignore_errors=True)


def _kill_all(slots: list[_Slot]) -> None:
    for slot in slots:
        slot.worker.kill()
    slots.clear()
