"""Measure on devices behind TVM's RPC tracker: each candidate is uploaded to a server, checked and timed there.

A batch is spread over one session per server the tracker has free under the
key, each served by its own thread. The reference inputs are sent to the
device and the outputs copied back to be checked here. A server that goes
away costs only the candidate it held (``device_lost``); one that stops
answering, only that candidate too (``timeout``); the rest of the batch goes
to the others. A tracker that cannot be reached, or a key with no server, is
an error before anything is measured. A server may describe its device (a
global function ``probtune.device.describe``, as the emulated AArch64 device
in ``devices/`` does); the description is given as a warning, once.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tvm

from probtune.defaults import RUN_TIMEOUT
from probtune.errors import DeviceError, warn_caller
from probtune.interfaces import TargetSpec
from probtune.measure.codegen import device_type
from probtune.measure.results import BuildResult, MeasureReference, MeasureStatus, RunResult, not_built
from probtune.measure.timing import RunReply, RunTask, check_and_time, describe_error, read_reference

__all__ = ["RPCRunner", "parse_tracker", "tracker_servers"]

_CONNECT_TIMEOUT = 5.0  # seconds to reach the tracker before it counts as unreachable
_POLL = 0.05  # seconds between looks at the sessions while a batch runs
_SERVER_PREFIX = "server:"
_RELEASE_SECONDS = 30.0  # how long a server given back may take to be free again at the tracker  # how the tracker lists a server's key


def parse_tracker(address: str) -> tuple[str, int]:
    """``"host:port"`` as a (host, port) pair; a clear error otherwise."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"RPC tracker address {address!r} is not HOST:PORT")
    return host, int(port)


def tracker_servers(tracker: tuple[str, int]) -> dict[str, int]:
    """How many servers the tracker has under each key (what it offers); DeviceError if it cannot be reached."""
    summary = _connect_tracker(tracker).summary()
    counts: dict[str, int] = {}
    for server in summary.get("server_info", []):
        key = str(server.get("key", ""))
        if key.startswith(_SERVER_PREFIX):
            name = key[len(_SERVER_PREFIX) :].split(":")[0]
            counts[name] = counts.get(name, 0) + 1
    return counts


def _connect_tracker(tracker: tuple[str, int]) -> Any:
    """A TVM tracker session, after a quick check that something listens there (TVM's own retries for a minute)."""
    try:
        socket.create_connection(tracker, timeout=_CONNECT_TIMEOUT).close()
    except OSError as error:
        raise DeviceError(f"cannot reach the RPC tracker at {tracker[0]}:{tracker[1]}: {error}") from None
    return tvm.rpc.connect_tracker(*tracker)


_Batch = tuple[Sequence[np.ndarray], Sequence[np.ndarray], RunTask]  # a batch's reference inputs, outputs and timing


@dataclass(eq=False)
class _Session:
    """One RPC session to one server, used by one thread at a time."""

    remote: Any
    name: str
    busy: tuple[int, float] | None = None  # (candidate index, since when) while it measures one
    lost: bool = False  # gone or given up: never used again
    given_up: bool = False  # overdue: its candidate was reported as a timeout, its thread may stay blocked
    thread: threading.Thread | None = field(default=None, repr=False)


class RPCRunner:
    """Times candidates on the servers that a TVM RPC tracker has under ``key``, several at once.

    ``tracker`` is ``"host:port"`` (default: the ``PROBTUNE_RPC_TRACKER``
    environment variable), ``key`` the servers' key (``PROBTUNE_RPC_KEY``).
    ``timeout`` bounds one candidate on a server: upload, load, check and
    timing. The other settings are :class:`~probtune.measure.LocalRunner`'s,
    except that ``cache_flush`` keeps a kernel's first argument (its input)
    cached: a server knows only TVM's flush function, which leaves it out.
    """

    name = "rpc"

    def __init__(
        self,
        tracker: str | None = None,
        key: str | None = None,
        *,
        timeout: float = RUN_TIMEOUT,
        repeat: int = 3,
        min_repeat_ms: float = 50.0,
        warmup: int = 1,
        cache_flush: bool = False,
        priority: int = 1,
    ) -> None:
        tracker = tracker or os.environ.get("PROBTUNE_RPC_TRACKER")
        key = key or os.environ.get("PROBTUNE_RPC_KEY")
        if not tracker or not key:
            raise DeviceError("the rpc runner needs a tracker and a key: --rpc-tracker HOST:PORT --rpc-key KEY "
                              "(or PROBTUNE_RPC_TRACKER and PROBTUNE_RPC_KEY)")
        if timeout <= 0 or repeat < 1 or min_repeat_ms < 0 or warmup < 0:
            raise ValueError("timeout must be positive, repeat at least 1, min_repeat_ms and warmup not negative")
        self.tracker = parse_tracker(tracker)
        self.key = key
        self.timeout = timeout
        self.repeat = repeat
        self.min_repeat_ms = min_repeat_ms
        self.warmup = warmup
        self.cache_flush = cache_flush
        self.priority = priority
        self._sessions: list[_Session] = []
        self.descriptions: set[str] = set()  # what the servers said of their devices
        self._closed = False
        self.servers = self._count_servers()  # fails now, before anything is measured, if there is none

    def run(
        self,
        reference: MeasureReference,
        artifacts: Sequence[str | BuildResult | None],
        target: TargetSpec,
        *,
        stop_above: float | None = None,
    ) -> Iterator[tuple[int, RunResult]]:
        """Yield ``(index into artifacts, result)`` for each candidate, as the servers finish them."""
        if self._closed:
            raise RuntimeError("this RPCRunner is closed")
        device = device_type(target)
        inputs, expected = read_reference(reference.path, reference.num_inputs)
        task = RunTask(reference.path, reference.num_inputs, reference.rtol, reference.atol, "", device,
                       self.repeat, self.min_repeat_ms, self.warmup, stop_above, self.cache_flush)
        todo: queue.SimpleQueue[tuple[int, str]] = queue.SimpleQueue()
        results: queue.SimpleQueue[tuple[_Session, int, RunResult]] = queue.SimpleQueue()
        pending = 0
        for index, item in enumerate(artifacts):
            failed = not_built(item)
            if failed is not None:
                yield index, failed
            else:
                todo.put((index, str(item.artifact if isinstance(item, BuildResult) else item)))
                pending += 1
        if pending:
            yield from self._serve(todo, results, pending, (inputs, expected, task))

    def request_session(self) -> Any:
        """A session to one free server of the key, for other work than measuring candidates (a whole model).

        The sessions kept for measuring are given back first, so that their servers are free again.
        """
        self._release_sessions()
        deadline = time.monotonic() + _RELEASE_SECONDS
        while self._free_servers() < 1:
            if time.monotonic() > deadline:
                raise DeviceError(f"no server with key {self.key!r} is free at the RPC tracker "
                                  f"{self.tracker[0]}:{self.tracker[1]}")
            time.sleep(_POLL * 4)
        remote = _connect_tracker(self.tracker).request(self.key, priority=self.priority, session_timeout=0, max_retry=1)
        self._note_description(remote)
        return remote

    def device_name(self, target: TargetSpec) -> str:
        """Records are kept under the servers' key: the tracker hands out any server of it."""
        return f"rpc:{self.key}"

    def close(self) -> None:
        """Give the sessions back to the tracker; the runner cannot be used afterwards."""
        self._closed = True
        self._release_sessions()

    def __enter__(self) -> RPCRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------ sessions

    def _release_sessions(self) -> None:
        """Give the kept sessions back: dropping a TVM RPC session closes its connection."""
        for session in self._sessions:
            session.lost = True
        self._sessions.clear()

    def _count_servers(self) -> int:
        count = tracker_servers(self.tracker).get(self.key, 0)
        if count == 0:
            raise DeviceError(f"the RPC tracker at {self.tracker[0]}:{self.tracker[1]} has no server with key "
                              f"{self.key!r}; start one with python -m tvm.exec.rpc_server --tracker HOST:PORT --key KEY")
        return count

    def _open_sessions(self) -> list[_Session]:
        """Live sessions: one per server the tracker has free under the key, kept from batch to batch."""
        self._sessions = [session for session in self._sessions if not session.lost]
        free = self._free_servers()
        tracker = _connect_tracker(self.tracker)
        for _ in range(free):
            try:
                remote = tracker.request(self.key, priority=self.priority, session_timeout=0, max_retry=1)
            except RuntimeError:
                break
            self._sessions.append(_Session(remote, f"{self.key}#{len(self._sessions)}"))
            self._note_description(remote)
        if not self._sessions:
            raise DeviceError(f"no server with key {self.key!r} is left at the RPC tracker "
                              f"{self.tracker[0]}:{self.tracker[1]}")
        return self._sessions

    def _note_description(self, remote: Any) -> None:
        try:
            description = str(remote.get_function("probtune.device.describe")())
        except Exception:  # noqa: BLE001 - a server that does not describe its device
            return
        if description not in self.descriptions:
            self.descriptions.add(description)
            warn_caller(f"the RPC servers of key {self.key!r} run on {description}")

    def _free_servers(self) -> int:
        """Servers of the key that the tracker could hand out now, not counting our own sessions."""
        summary = _connect_tracker(self.tracker).summary()
        info = summary.get("queue_info", {}).get(self.key, {})
        return int(info.get("free", 0))

    # ------------------------------------------------------------ one batch

    def _serve(
        self,
        todo: queue.SimpleQueue[tuple[int, str]],
        results: queue.SimpleQueue[tuple[_Session, int, RunResult]],
        pending: int,
        reference: _Batch,
    ) -> Iterator[tuple[int, RunResult]]:
        sessions = self._open_sessions()
        for session in sessions:
            session.thread = threading.Thread(target=self._work, args=(session, todo, results, reference), daemon=True)
            session.thread.start()
        while pending:
            try:
                session, index, result = results.get(timeout=_POLL)
            except queue.Empty:
                overdue = self._give_up_overdue(sessions)
                if overdue is None and all(s.lost or not s.thread or not s.thread.is_alive() for s in sessions):
                    overdue = self._orphan(todo)  # every session is gone: what is left cannot run
                if overdue is not None:
                    pending -= 1
                    yield overdue
                continue
            pending -= 1
            yield index, result
        for session in sessions:
            if session.thread is not None and not session.given_up:
                session.thread.join()

    def _give_up_overdue(self, sessions: list[_Session]) -> tuple[int, RunResult] | None:
        """The candidate of a session that has not answered within the timeout: a timeout, and the session is given up."""
        now = time.perf_counter()
        for session in sessions:
            busy = session.busy
            if busy is not None and not session.lost and now - busy[1] > self.timeout:
                session.lost = session.given_up = True  # its thread may stay blocked on the socket; its answer is dropped
                reason = f"no answer from RPC session {session.name} within {self.timeout:g} s"
                return busy[0], RunResult(MeasureStatus.TIMEOUT, (), reason, now - busy[1])
        return None

    def _orphan(self, todo: queue.SimpleQueue[tuple[int, str]]) -> tuple[int, RunResult] | None:
        try:
            index, _ = todo.get_nowait()
        except queue.Empty:
            return None
        reason = f"every server with key {self.key!r} was lost before this candidate could run"
        return index, RunResult(MeasureStatus.DEVICE_LOST, (), reason, 0.0)

    def _work(
        self,
        session: _Session,
        todo: queue.SimpleQueue[tuple[int, str]],
        results: queue.SimpleQueue[tuple[_Session, int, RunResult]],
        reference: _Batch,
    ) -> None:
        """A session's thread: measure candidates from ``todo`` until it is empty or the session is lost."""
        while not session.lost:
            try:
                index, artifact = todo.get_nowait()
            except queue.Empty:
                return
            started = time.perf_counter()
            session.busy = (index, started)
            status, latencies, error = self._measure(session, artifact, reference)
            session.busy = None
            if session.given_up:
                return  # its candidate is already reported as a timeout
            results.put((session, index, RunResult(status, latencies, error, time.perf_counter() - started)))

    def _measure(
        self, session: _Session, artifact: str, reference: _Batch
    ) -> tuple[MeasureStatus, tuple[float, ...], str | None]:
        inputs, expected, task = reference
        remote_name = f"probtune-{uuid.uuid4().hex}.so"
        try:
            session.remote.upload(bytearray(Path(artifact).read_bytes()), target=remote_name)  # TVM's leaves a path open
        except Exception as error:  # noqa: BLE001 - any failure to reach the server
            session.lost = True
            return MeasureStatus.DEVICE_LOST, (), f"RPC session {session.name} lost: {describe_error(error)}"
        try:
            module = session.remote.load_module(remote_name)
            reply: RunReply = check_and_time(module, session.remote.device(task.device, 0), inputs, expected, task)
            return MeasureStatus(reply.status), reply.latencies, reply.error
        except Exception as error:  # noqa: BLE001 - the candidate's own error, or the server gone
            if not _alive(session):
                session.lost = True
                return MeasureStatus.DEVICE_LOST, (), f"RPC session {session.name} lost: {describe_error(error)}"
            return MeasureStatus.RUN_ERROR, (), describe_error(error)
        finally:
            if not session.lost:
                try:
                    session.remote.remove(remote_name)
                except Exception:  # noqa: BLE001 - a file left in the server's temporary folder is harmless
                    pass


def _alive(session: _Session) -> bool:
    """Whether the session still answers (after an error: the candidate's, or the server's end)."""
    try:
        session.remote.listdir(".")
    except Exception:  # noqa: BLE001 - any failure means the session is gone
        return False
    return True
