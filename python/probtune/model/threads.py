"""Run a compiled model on a TVM thread pool of a chosen size, whatever pool the calling thread already has.

TVM keeps one thread pool per calling thread, sized when that thread first
runs parallel code (``TVM_NUM_THREADS``, else half the logical CPUs); it can
later use fewer of its workers but never more. A model handed back in a
process that has already run TVM code (the tuning process itself) would run
on that old pool, one thread on a 2-core machine, at half the speed tuning
measured. :class:`PoolThread` runs calls where a pool of the right size is.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import tvm

__all__ = ["PoolThread", "set_num_threads"]

T = TypeVar("T")

_configured = threading.local()  # per thread: the worker count set_num_threads last gave that thread's TVM pool


SHARE_ALL_CORES = -3  # TVM's kSpecifyThreadShareAllCore: every worker may run on any of the given cores


def set_num_threads(count: int) -> int:
    """Size the calling thread's TVM pool to ``count`` workers, free to run on any core; returns how many it uses.

    TVM would otherwise pin its workers one per core and leave the calling
    thread, which runs a share of each parallel loop itself, free: where the
    system puts that thread on a worker's core, the two take turns and every
    parallel loop takes twice as long, for as long as it stays there.
    Fewer than ``count`` when the pool was started before with fewer workers,
    or when the machine has fewer cores than ``count``.
    """
    os.environ["TVM_NUM_THREADS"] = str(count)  # sizes pools started from now on, in any thread
    cores = [str(core) for core in range(os.cpu_count() or 1)]  # as TVM numbers them (a pool may have pinned this thread)
    tvm.get_global_func("runtime.config_threadpool")(SHARE_ALL_CORES, count, cores)
    _configured.count = count
    return int(tvm.get_global_func("runtime.NumThreads")())


class PoolThread:
    """Runs calls with ``count`` TVM workers: in the calling thread when its pool allows, else in a thread of its own."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.reachable = min(count, os.cpu_count() or 1)  # TVM caps a pool at the machine's cores
        self._fits = threading.local()  # per calling thread: does its pool reach ``reachable`` workers?
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def run(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)``, on a thread whose TVM pool has the workers asked for."""
        if self._fits_here():
            return function(*args)
        return self._own_thread().submit(function, *args).result()

    def workers(self) -> int:
        """How many TVM workers the calls run on."""
        return self.run(tvm.get_global_func("runtime.NumThreads"))

    def close(self) -> None:
        """Stop the thread of its own, if it started one."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def _fits_here(self) -> bool:
        fits = getattr(self._fits, "value", None)
        if fits is None or getattr(_configured, "count", None) != self.count:  # another count was set here since
            fits = self._fits.value = set_num_threads(self.count) >= self.reachable
        return fits

    def _own_thread(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                executor = ThreadPoolExecutor(1, thread_name_prefix="probtune-model")
                executor.submit(set_num_threads, self.count).result()  # its pool starts now, at this size
                self._executor = executor
            return self._executor
