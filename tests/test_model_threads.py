"""A compiled model runs on the threads asked for, even where the calling thread's TVM pool is smaller."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

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
