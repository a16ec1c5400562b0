"""What runs inside the measurement child processes, never in the tuning process.

Each child imports TVM once, says it is ready, then serves tasks from its pipe
until the parent kills it or goes away.  Errors a candidate causes are
caught and reported; a crash or a hang is left to the parent to detect.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from probtune.measure._process import serve
from probtune.measure.timing import RunReply, RunTask, check_and_time, describe_error, read_reference

__all__ = ["BuildReply", "BuildTask", "build_worker_main", "run_worker_main"]

_M_MMAP_THRESHOLD = -3  # mallopt parameter, from glibc's malloc.h


@dataclass(frozen=True)
class BuildTask:
    mod_json: str  # tvm.ir.save_json of the candidate: TVM objects do not pickle reliably
    target: dict[str, Any]
    compiler: Any  # the target's Compiler, or None for tvm.compile
    artifact_path: str
    scratch_dir: str  # export_library's object files: removed afterwards (by the parent if we die)


@dataclass(frozen=True)
class BuildReply:
    error: str | None
    seconds: float  # measured here: the parent may read the reply late
    resident_bytes: int  # the worker's memory afterwards: compiling grows it, and it is not given back


def build_worker_main(connection: Connection) -> None:
    """Compile candidates and export each as a shared library.

    Any other task is a picklable callable, called here and answered with
    what it returns: the builder lends its idle workers to the search, which
    has them realize candidates (one set of TVM processes for both, each
    about 200 MB).
    """
    import psutil
    import tvm

    from probtune.measure.codegen import compile_with, export_with

    me = psutil.Process()

    def build(task: BuildTask) -> BuildReply:
        started = time.perf_counter()
        try:
            mod = tvm.ir.load_json(task.mod_json)
            executable = compile_with(task.compiler, mod, task.target)
            os.makedirs(task.scratch_dir, exist_ok=True)
            export_with(task.compiler, executable, task.artifact_path, task.scratch_dir)
        except Exception as error:  # noqa: BLE001 - a candidate TVM rejects is a result, not a worker failure
            Path(task.artifact_path).unlink(missing_ok=True)
            return BuildReply(describe_error(error), time.perf_counter() - started, me.memory_info().rss)
        finally:
            shutil.rmtree(task.scratch_dir, ignore_errors=True)
        return BuildReply(None, time.perf_counter() - started, me.memory_info().rss)

    serve(connection, lambda task: build(task) if isinstance(task, BuildTask) else task())


def run_worker_main(connection: Connection, num_threads: int | None) -> None:
    """Load, check and time candidates one at a time."""
    if num_threads is not None:
        os.environ["TVM_NUM_THREADS"] = str(num_threads)  # read when TVM's thread pool starts
    os.environ["TVM_BIND_THREADS"] = "0"  # workers not pinned to cores (why: probtune.model.threads.set_num_threads)
    os.environ["TVM_USE_RUNTIME_LIB"] = "1"  # load and time only: TVM's runtime holds ~110 MB less than its compiler
    _return_large_frees_to_the_system()
    import tvm

    def measure(task: RunTask) -> RunReply:
        inputs, expected = read_reference(task.reference_path, task.num_inputs)
        device = tvm.device(task.device, 0)
        module = tvm.runtime.load_module(task.artifact_path)
        return check_and_time(module, device, inputs, expected, task)

    def run(task: RunTask) -> RunReply:
        try:
            return measure(task)
        except Exception as error:  # noqa: BLE001 - load failures, runtime errors raised by TVM
            return RunReply("run_error", (), describe_error(error))

    serve(connection, run)


def _return_large_frees_to_the_system() -> None:
    """Have glibc serve every allocation above 128 KiB by mmap, so that freeing it gives the memory back.

    glibc raises that threshold after the first large free; candidates' tensors
    and workspaces (megabytes each) then come from heap arenas that never
    shrink, and the runner grew with every candidate, without bound over a
    tune. With a fixed threshold it stays flat (bench/results/NOTES.md).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to set
        return
    libc.mallopt(_M_MMAP_THRESHOLD, 128 * 1024)
