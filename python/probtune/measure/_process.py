"""The tuning process's handle on one measurement child process.

A child is a fresh interpreter that runs ``main(connection, *args)`` and talks
to the parent over a socket pair.  Unlike ``multiprocessing``'s spawn, it does
not run the parent's main script again: it inherits none of the tuner's state
(TVM objects, threads, open databases), holds only what its own task imports
(the runner loads TVM's runtime, not its compiler), and a user's script needs
no ``if __name__ == "__main__":`` guard for it.  A child leads its own process
group, so killing it also kills whatever it started (e.g. the linker run by
``export_library``).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["READY", "WorkerProcess", "WorkerStartError", "describe_exit", "serve"]

READY = "ready"
"""First message of every child: its imports are done and it takes tasks."""

# The child's whole program before ``main`` is unpickled (which imports main's module):
# the parent's import path, then the function and its arguments.
_BOOTSTRAP = """\
import sys
from multiprocessing.connection import Connection
connection = Connection(int(sys.argv[1]))
sys.path[:] = connection.recv()
main, args = connection.recv()
main(connection, *args)
"""


class WorkerStartError(RuntimeError):
    """A child that died or hung before it was ready: the environment is broken, not a candidate."""


class WorkerProcess:
    """A spawned child running ``main(connection, *args)``, with the parent's end of the pipe."""

    def __init__(self, main: Callable[..., None], args: tuple[Any, ...], name: str) -> None:
        self.name = name
        self.connection, child_end = multiprocessing.Pipe()
        self._process = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP, str(child_end.fileno())],
            pass_fds=(child_end.fileno(),),
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, made before it runs any code
        )
        self._reaped = False
        child_end.close()  # the child holds the only other end: its death reads as EOF here
        try:  # read by the child before it imports anything heavy: these sends do not wait for TVM
            self.connection.send(sys.path)
            self.connection.send((main, args))
        except OSError:  # it died at once; wait_ready reports how
            pass

    def wait_ready(self, timeout: float) -> None:
        """Block until the child reports that it is ready; kill it and raise if it does not."""
        if not self.connection.poll(timeout):
            self.kill()
            raise WorkerStartError(f"{self.name} did not start within {timeout:g} s")
        try:
            self.connection.recv()  # the first message says it is ready
        except (EOFError, ConnectionResetError):
            raise WorkerStartError(f"{self.name} failed to start ({self.kill()})") from None

    @property
    def finished(self) -> bool:
        """Whether it was killed (its connection is closed then)."""
        return self._reaped

    def kill(self) -> str:
        """Kill the child and its process group, reap it, and say how it ended."""
        if self._reaped:
            return describe_exit(self._process.returncode)
        # Signal the group before reaping the child: until then its pid, hence the
        # group id, cannot have been reused by an unrelated process.
        try:
            os.killpg(self._process.pid, signal.SIGKILL)
        except OSError:  # the group is gone
            pass
        self._process.wait()
        self._reaped = True
        self.connection.close()
        return describe_exit(self._process.returncode)


def describe_exit(exitcode: int | None) -> str:
    """``SIGSEGV`` for a child killed by a signal, ``exit code 1`` for one that exited."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


def serve(connection: Connection, handle: Callable[[Any], Any]) -> None:
    """A child's loop: say it is ready, then answer each task with ``handle(task)`` until the parent goes away."""
    connection.send(READY)
    for task in _tasks(connection):
        try:
            connection.send(handle(task))
        except (BrokenPipeError, ConnectionResetError):  # the parent is gone
            return


def _tasks(connection: Connection) -> Iterator[Any]:
    while True:
        try:
            yield connection.recv()
        except EOFError:  # the parent is gone
            return
