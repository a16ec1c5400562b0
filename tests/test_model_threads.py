"""A compiled model runs on the threads asked for, even where the calling thread's TVM pool is smaller."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from probtune.model import thread_count
from probtune.model.thread_count import candidate_counts, fastest_count
from probtune.model.threads import PoolThread

_SMALL_POOL_FIRST = textwrap.dedent(
    """
    import os
    os.environ["TVM_NUM_THREADS"] = "1"
    import tvm
    assert tvm.get_global_func("runtime.NumThreads")() == 1  # this thread's pool now exists, with one worker
    from probtune.model.threads import PoolThread, set_num_threads
    print(set_num_threads(2), PoolThread(2).workers())
    """
)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores")
def test_a_pool_started_with_one_worker_is_not_what_the_model_runs_on():
    done = subprocess.run(
        [sys.executable, "-c", _SMALL_POOL_FIRST], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    resized, used = done.stdout.split()
    assert (resized, used) == ("1", "2")  # TVM cannot grow the old pool; the model's own thread has two workers


_WORKER_CORES = textwrap.dedent(
    """
    import os
    allowed = os.sched_getaffinity(0)
    from probtune.model.threads import set_num_threads
    before = set(os.listdir("/proc/self/task"))
    set_num_threads(len(allowed))
    workers = set(os.listdir("/proc/self/task")) - before
    print(len(workers), all(os.sched_getaffinity(int(worker)) >= allowed for worker in workers))
    """
)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs two cores, Linux")
def test_the_pools_workers_are_not_pinned_to_a_core_each():
    # Pinned, a worker shares its core with the calling thread whenever the system puts that thread there.
    done = subprocess.run([sys.executable, "-c", _WORKER_CORES], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    started, free = done.stdout.split()
    assert int(started) >= 1 and free == "True"


def test_a_pool_that_fits_runs_calls_in_the_calling_thread():
    pool = PoolThread(1)
    try:
        assert pool.run(threading.get_ident) == threading.get_ident()
        assert pool.workers() == 1
    finally:
        pool.close()


def test_the_model_reports_its_threads(encoder_onnx, host):
    from probtune.model import fuse, load_model
    from probtune.model.compile import CompiledModel, compile_model, default_program
    from probtune.model.tasks import extract_tasks
    from probtune.space.space_generator import generate_space

    model = load_model(encoder_onnx)
    fused = fuse(model, host)
    programs = {}
    for task in extract_tasks(fused):
        programs.update({name: default_program(generate_space(task.workload, host)) for name in task.functions})
    executable, _, _ = compile_model(fused, programs, host)
    compiled = CompiledModel(executable, model.inputs, host.num_cores)
    assert compiled.threads() == min(host.num_cores, os.cpu_count() or 1)
    outputs = compiled(*model.random_inputs(0))
    assert outputs and all(np.isfinite(out).all() for out in outputs)


_TWO_POOL_SIZES = textwrap.dedent(
    """
    import threading
    from probtune.model.threads import PoolThread
    pools = [PoolThread(2), PoolThread(1)]
    here = threading.get_ident()
    print(*[pool.run(lambda: (threading.get_ident() == here, pool.workers())) for pool in pools + pools])
    """
)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores")
def test_pools_of_different_sizes_in_one_thread_each_get_their_own_count():
    done = subprocess.run([sys.executable, "-c", _TWO_POOL_SIZES], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["(True,", "2)", "(True,", "1)"] * 2  # each sets its count again after the other's


def test_the_counts_tried_are_powers_of_two_below_the_cores_and_the_cores(monkeypatch):
    monkeypatch.setattr(thread_count.os, "cpu_count", lambda: 16)
    assert candidate_counts(16) == [1, 2, 4, 8, 16]
    assert candidate_counts(6) == [1, 2, 4, 6]
    assert candidate_counts(2) == [1, 2]
    assert candidate_counts(1) == [1]
    assert candidate_counts(64) == [1, 2, 4, 8, 16]  # no more than this machine has


def _timer(figures: dict[int, list[float]], calls: list[int]):
    def seconds_at(count: int) -> float:
        calls.append(count)
        return figures[count][sum(c == count for c in calls) - 1]

    return seconds_at


def test_fewer_threads_are_chosen_where_they_are_faster_than_the_margin():
    calls: list[int] = []
    figures = {1: [1.0, 1.4, 1.0, 1.0, 1.0], 2: [1.2, 1.2, 0.9, 1.2, 1.2]}  # one slow round each: medians decide
    choice = fastest_count(_timer(figures, calls), [1, 2], rounds=5, margin=0.03)
    assert choice.count == 1 and choice.medians == {1: 1.0, 2: 1.2}
    assert calls == [1, 2] * 5  # in turns, not one count after the other
    assert str(choice) == "runs on 1 thread: 1000.000 ms per inference (median of 5 rounds; 1200.000 ms on 2)"
    alone = fastest_count(_timer({1: [2.0]}, []), [1], rounds=1, margin=0.03)
    assert str(alone) == "runs on 1 thread: 2000.000 ms per inference (median of 1 rounds)"


def test_all_cores_are_kept_unless_fewer_are_clearly_faster():
    figures = {1: [0.99] * 3, 2: [1.0] * 3, 4: [1.01] * 3}
    assert fastest_count(_timer(figures, []), [1, 2, 4], rounds=3, margin=0.03).count == 4
    figures = {1: [0.9] * 3, 2: [0.8] * 3, 4: [1.0] * 3}
    assert fastest_count(_timer(figures, []), [1, 2, 4], rounds=3, margin=0.03).count == 2


def test_a_count_far_slower_than_another_is_timed_no_further():
    calls: list[int] = []
    figures = {1: [1.9], 2: [1.0] * 5}
    choice = fastest_count(_timer(figures, calls), [1, 2], rounds=5, margin=0.03, drop=1.5)
    assert calls == [1, 2] and choice.count == 2 and choice.rounds == 1  # one count left: the rounds end
    calls.clear()
    figures = {1: [1.9, 3.0], 2: [1.0] * 5, 4: [1.1, 1.0, 1.0, 1.0, 1.0]}
    choice = fastest_count(_timer(figures, calls), [1, 2, 4], rounds=5, margin=0.03, drop=1.5)
    assert calls == [1, 2, 4] + [2, 4] * 4 and choice.count == 4 and choice.medians[1] == 1.9
    calls.clear()
    figures = {1: [0.5] * 5, 2: [1.0]}  # all cores can be left behind too
    assert fastest_count(_timer(figures, calls), [1, 2], rounds=5, margin=0.03, drop=1.5).count == 1
    assert calls == [1, 2]
