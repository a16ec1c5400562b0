"""probtune.measure: every candidate gets a result, whatever it does to its process.

Candidates share the signature of a 64x64x64 float32 matmul ``main(A, B, C)``, so
one reference serves them all: a correct scheduled matmul, a wrong one (A@B + 1),
one that segfaults (libc ``raise(SIGSEGV)``), one that hangs (libc ``sleep``), one
that TVM refuses to compile, and one whose compile takes minutes (fully unrolled).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tvm
from tvm import te
from tvm.script import tirx as T

from probtune.interfaces import TargetSpec
from probtune.measure import (
    BuildResult,
    LocalBuilder,
    LocalRunner,
    MeasureReference,
    MeasureStatus,
    RunResult,
    prepare_reference,
)
from probtune.measure._process import _BOOTSTRAP
from probtune.workloads.workload import Workload

N = 64
TARGET = TargetSpec("test-cpu", "this CPU", {"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu(), "num-cores": 2}, ())
RUNNER_TIMEOUT = 5.0


def matmul(plus_one: bool = False) -> tvm.tirx.PrimFunc:
    a = te.placeholder((N, N), name="A")
    b = te.placeholder((N, N), name="B")
    k = te.reduce_axis((0, N), name="k")
    c = te.compute((N, N), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    if not plus_one:
        return te.create_prim_func([a, b, c])
    d = te.compute((N, N), lambda i, j: c[i, j] + 1.0, name="D")
    return te.create_prim_func([a, b, d])


def clamped_matmul() -> tvm.tirx.PrimFunc:
    """``min(max(A @ B, lo), hi)`` with the bounds as scalar inputs, as ONNX's Clip (ReLU6) reaches a model's tasks."""
    a, b = te.placeholder((N, N), name="A"), te.placeholder((N, N), name="B")
    lo, hi = te.placeholder((), name="lo"), te.placeholder((), name="hi")
    k = te.reduce_axis((0, N), name="k")
    c = te.compute((N, N), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    d = te.compute((N, N), lambda i, j: te.min(te.max(c[i, j], lo()), hi()), name="D")
    return te.create_prim_func([a, b, lo, hi, d])


def scheduled_matmul(plus_one: bool = False) -> tvm.IRModule:
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": matmul(plus_one)}))
    i, j, k = sch.get_loops(sch.get_sblock("C"))
    j_outer, j_inner = sch.split(j, [None, 8])
    sch.reorder(i, j_outer, k, j_inner)
    sch.parallel(i)
    sch.vectorize(j_inner)
    return sch.mod


def slow_to_compile_matmul() -> tvm.IRModule:
    """All 262,144 multiply-adds unrolled: LLVM needs minutes for it."""
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": matmul()}))
    for loop in sch.get_loops(sch.get_sblock("C")):
        sch.unroll(loop)
    return sch.mod


@T.prim_func
def segfaults(
    A: T.Buffer((N, N), "float32"), B: T.Buffer((N, N), "float32"), C: T.Buffer((N, N), "float32")
):
    T.func_attr({"global_symbol": "main", "tir.noalias": True})
    T.evaluate(T.call_extern("int32", "raise", 11))  # libc raise(SIGSEGV)


@T.prim_func
def hangs(
    A: T.Buffer((N, N), "float32"), B: T.Buffer((N, N), "float32"), C: T.Buffer((N, N), "float32")
):
    T.func_attr({"global_symbol": "main", "tir.noalias": True})
    T.evaluate(T.call_extern("uint32", "sleep", 1000))  # libc sleep, in seconds


@T.prim_func
def does_not_compile(
    A: T.Buffer((N, N), "float32"), B: T.Buffer((N, N), "float32"), C: T.Buffer((N, N), "float32")
):
    T.func_attr({"global_symbol": "main", "tir.noalias": True})
    T.evaluate(T.tvm_warp_activemask())  # a GPU intrinsic the LLVM CPU back end does not know


CANDIDATES = {
    "good": scheduled_matmul,
    "wrong": lambda: scheduled_matmul(plus_one=True),
    "segfaults": lambda: tvm.IRModule({"main": segfaults}),
    "hangs": lambda: tvm.IRModule({"main": hangs}),
    "does_not_compile": lambda: tvm.IRModule({"main": does_not_compile}),
}


def spawned_children() -> set[int]:
    """Pids of this process's measurement children.

    A child caught between fork and exec still shows this process's command line; on a
    busy machine a worker started just before the call is often still there.
    """
    me = psutil.Process()
    own = me.cmdline()
    children = set()
    for child in me.children():
        try:
            cmdline = child.cmdline()
        except psutil.NoSuchProcess:  # ended since it was listed
            continue
        if cmdline == own or _BOOTSTRAP in cmdline:
            children.add(child.pid)
    return children


def children_started_since(before: set[int], timeout: float = 10.0) -> set[int]:
    """Measurement children not in ``before``, waiting up to ``timeout`` s for at least one.

    A worker started just now may not show its command line yet (CI once sampled none
    right after a replacement), so one empty sample is not the answer.
    """
    deadline = time.monotonic() + timeout
    while not (fresh := spawned_children() - before) and time.monotonic() < deadline:
        time.sleep(0.01)
    return fresh


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("measure")


@pytest.fixture(scope="module")
def reference(workdir: Path) -> MeasureReference:
    return prepare_reference(Workload.from_module(matmul(), name="matmul"), workdir, seed=0)


def test_a_reference_of_a_task_named_by_hundreds_of_operators_is_saved(tmp_path: Path) -> None:
    name = "fused_" + "_".join(f"transpose{i}_tir_clip{i}_multiply{i}" for i in range(20))  # a real model's fused task
    saved = prepare_reference(Workload.from_module(matmul(), name=name), tmp_path, seed=0)
    assert Path(saved.path).is_file() and len(Path(saved.path).name) < 100 < len(name)


@pytest.fixture(scope="module")
def built(workdir: Path) -> dict[str, BuildResult]:
    names = list(CANDIDATES)
    programs = [CANDIDATES[name]() for name in names]
    names.append("good as text")  # what a search helper sends back
    programs.append(tvm.ir.save_json(CANDIDATES["good"]()))
    with LocalBuilder(workers=2, timeout=60.0) as builder:
        results = dict(builder.build(programs, TARGET, workdir))
    return {name: results[index] for index, name in enumerate(names)}


@pytest.fixture(scope="module")
def runner() -> Iterator[LocalRunner]:
    with LocalRunner(timeout=RUNNER_TIMEOUT, repeat=3, min_repeat_ms=20.0) as runner:
        yield runner


def run_all(
    runner: LocalRunner, reference: MeasureReference, items: list[str | BuildResult | None]
) -> list[RunResult]:
    results = list(runner.run(reference, items, TARGET))
    assert [index for index, _ in results] == list(range(len(items)))
    return [result for _, result in results]


def test_prepare_reference_saves_inputs_and_expected_outputs(
    workdir: Path, reference: MeasureReference
) -> None:
    workload = Workload.from_module(matmul(), name="matmul")
    assert prepare_reference(workload, workdir, seed=0) == reference  # same content, same file
    assert prepare_reference(workload, workdir, seed=1).path != reference.path
    with np.load(reference.path) as arrays:
        a, b, c = arrays["input_0"], arrays["input_1"], arrays["output_0"]
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    assert reference.num_inputs == 2
    assert (reference.rtol, reference.atol) == workload.tolerance([c])


def test_a_bfloat16_reference_is_read_back_in_bfloat16(tmp_path: Path) -> None:
    """An .npz file holds no ml_dtypes type: a bf16 task's inputs are saved as their bits and read back typed."""
    import ml_dtypes

    from probtune.measure.timing import random_inputs, read_reference

    a = te.placeholder((8, 16), "bfloat16", name="a")
    b = te.compute((8, 16), lambda i, j: a[i, j].astype("float32") * 2.0, name="b")
    workload = Workload.from_module(te.create_prim_func([a, b]), name="widen")
    saved = prepare_reference(workload, tmp_path, seed=0)
    (x,), (y,) = read_reference(saved.path, 1)
    assert x.dtype == ml_dtypes.bfloat16 and y.dtype == np.float32
    np.testing.assert_array_equal(y, x.astype(np.float32) * 2)
    assert len(np.unique(x)) > 5  # drawn as floats in (-1, 1), not as the small integers of an integer input
    assert random_inputs(0, [((8, 16), "bfloat16")])[0].dtype == ml_dtypes.bfloat16


def test_a_reference_s_tolerance_is_scaled_by_its_own_outputs(workdir: Path) -> None:
    """A clamp whose bounds are inputs: seed 4 clamps every output to one value near zero, seed 1 lets them through.

    Scaled by seed 4's outputs, seed 1's absolute tolerance would be 20 times too
    tight, and correct reorderings of the reduction refused (MobileNetV2's ReLU6 was).
    """
    workload = Workload.from_module(clamped_matmul(), name="clamped")
    small, large = (prepare_reference(workload, workdir, seed=seed) for seed in (4, 1))
    with np.load(small.path) as arrays:
        assert np.ptp(arrays["output_0"]) == 0.0  # seed 4 draws the lower bound above the upper one
    with np.load(large.path) as arrays:
        inputs = [arrays[f"input_{i}"] for i in range(large.num_inputs)]
        outputs = [arrays["output_0"]]
    assert (large.rtol, large.atol) == workload.tolerance(outputs, workload.rounding_change(inputs, outputs, seed=1))
    assert large.atol > 10 * small.atol


def test_builder_builds_every_compilable_candidate(built: dict[str, BuildResult]) -> None:
    for name in ["good", "wrong", "segfaults", "hangs"]:
        assert built[name].error is None, built[name].error
        assert built[name].artifact is not None and os.path.isfile(built[name].artifact)
        assert built[name].seconds > 0


def test_build_failure_is_reported_and_passed_on_by_the_runner(
    built: dict[str, BuildResult], runner: LocalRunner, reference: MeasureReference
) -> None:
    failed = built["does_not_compile"]
    assert failed.artifact is None
    assert "tvm_warp_activemask" in failed.error
    results = run_all(runner, reference, [failed, built["good"].artifact, None])
    assert results[0].status == "build_error" and results[0].error == failed.error
    assert results[1].status == "ok", results[1].error
    assert results[2].status == "build_error"
    # one status type for the builder's results and the runner's
    assert failed.status is MeasureStatus.BUILD_ERROR and built["good"].status is MeasureStatus.OK
    assert [result.status for result in results] == [MeasureStatus.BUILD_ERROR, MeasureStatus.OK, MeasureStatus.BUILD_ERROR]
    assert all(type(result.status) is MeasureStatus for result in results)


def test_correct_candidate_is_timed(
    built: dict[str, BuildResult], runner: LocalRunner, reference: MeasureReference
) -> None:
    (result,) = run_all(runner, reference, [built["good"].artifact])
    assert result.status == "ok", result.error
    assert result.error is None
    assert len(result.latencies) == 3 and all(latency > 0 for latency in result.latencies)
    assert result.seconds > 0


def test_a_program_given_as_its_json_text_builds_and_runs(
    built: dict[str, BuildResult], runner: LocalRunner, reference: MeasureReference
) -> None:
    (result,) = run_all(runner, reference, [built["good as text"].artifact])
    assert result.status == "ok", result.error


def test_wrong_result_is_caught(
    built: dict[str, BuildResult], runner: LocalRunner, reference: MeasureReference
) -> None:
    wrong, good = run_all(runner, reference, [built["wrong"].artifact, built["good"].artifact])
    assert wrong.status == "wrong_result"
    assert wrong.latencies == ()
    assert "max abs error 1 exceeds tolerance" in wrong.error and "output 0" in wrong.error
    assert good.status == "ok", good.error


@pytest.mark.parametrize(("stop_above", "repeats"), [(1e-9, 1), (1e9, 3), (None, 3)])
def test_stop_above_ends_the_timing_of_a_slow_candidate_after_one_repeat(
    built: dict[str, BuildResult],
    runner: LocalRunner,
    reference: MeasureReference,
    stop_above: float | None,
    repeats: int,
) -> None:
    [(_, result)] = runner.run(reference, [built["good"].artifact], TARGET, stop_above=stop_above)
    assert result.status == "ok", result.error
    assert len(result.latencies) == repeats and all(latency > 0 for latency in result.latencies)


@pytest.mark.parametrize("stop_above", [1e-9, 1e9])
def test_stop_above_never_skips_the_check(
    built: dict[str, BuildResult],
    runner: LocalRunner,
    reference: MeasureReference,
    stop_above: float,
) -> None:
    [(_, wrong)] = runner.run(reference, [built["wrong"].artifact], TARGET, stop_above=stop_above)
    assert wrong.status == "wrong_result" and wrong.latencies == ()


@pytest.mark.parametrize(("stop_above", "repeats"), [(1e-9, 1), (1e9, 3), (None, 3)])
def test_a_cold_runner_checks_then_times_each_call_after_a_flush(
    built: dict[str, BuildResult], reference: MeasureReference, stop_above: float | None, repeats: int
) -> None:
    with LocalRunner(timeout=RUNNER_TIMEOUT, repeat=3, min_repeat_ms=5.0, cache_flush=True) as cold:
        wrong, good = [result for _, result in cold.run(
            reference, [built["wrong"].artifact, built["good"].artifact], TARGET, stop_above=stop_above
        )]
    assert wrong.status == "wrong_result" and wrong.latencies == ()
    assert good.status == "ok", good.error
    assert len(good.latencies) == repeats and all(latency > 0 for latency in good.latencies)


class _RecordingModule:
    """Stands for a loaded candidate: records how it is timed, answers with set timings."""

    def __init__(self, timings: list[list[float]]) -> None:
        self.timings = timings
        self.calls: list[dict[str, object]] = []

    def time_evaluator(self, name: str, device: object, **options: object) -> object:
        self.calls.append(options)
        results = self.timings[len(self.calls) - 1]
        return lambda *args: type("Result", (), {"results": results})()


class _Device:
    """Stands for a TVM device: here (type 1, the CPU) or behind an RPC session (the session's mask added)."""

    def __init__(self, remote: bool) -> None:
        self.remote = remote

    def dlpack_device_type(self) -> int:
        from tvm.runtime.device import RPC_SESS_MASK

        return 1 + RPC_SESS_MASK if self.remote else 1


@pytest.mark.parametrize(("first", "calls"), [(1e-4, 10), (0.002, 3), (1.0, 1)])
def test_cold_timing_flushes_before_every_call_and_averages_up_to_ten_a_repeat(first: float, calls: int) -> None:
    from probtune.measure.timing import RunTask, time_cold

    timings = [float(i) for i in range(3 * calls)]
    module = _RecordingModule([[first], timings])
    task = RunTask("ref.npz", 2, 0.0, 0.0, "a.so", "cpu", 3, 5.0, 1, None, True)
    latencies = time_cold(module, _Device(remote=False), [], task)
    assert [call["repeat"] for call in module.calls] == [1, 3 * calls]  # a first call sizes the repeats
    assert all(call["number"] == 1 and call["f_preproc"] == "probtune.cache_flush_all" for call in module.calls)
    assert latencies == tuple(float(np.mean(timings[i * calls : (i + 1) * calls])) for i in range(3))


def test_cold_timing_flushes_every_argument_here_and_all_but_the_input_through_rpc() -> None:
    import tvm

    from probtune.measure.timing import cache_flush_function

    assert cache_flush_function(_Device(remote=True)) == "cache_flush_cpu_non_first_arg"  # all a server knows
    here = cache_flush_function(_Device(remote=False))
    assert here == "probtune.cache_flush_all"
    tensors = [tvm.runtime.tensor(np.arange(n, dtype="float32")) for n in (1 << 16, 3, 1)]
    tvm.get_global_func(here)(*tensors)  # flushing changes no value
    assert [t.numpy().tolist() for t in tensors[1:]] == [[0.0, 1.0, 2.0], [0.0]]


def test_the_eviction_read_is_sized_by_the_largest_cache_the_machine_describes(tmp_path: Path) -> None:
    from probtune.measure.timing import FALLBACK_LLC_BYTES, last_level_cache_bytes

    for index, size in enumerate(["32K", "1024K", "32768K", "bogus"]):  # Linux's sysfs: L1d, L2, L3 and a broken entry
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    assert last_level_cache_bytes(str(tmp_path)) == 32 << 20
    assert last_level_cache_bytes(str(tmp_path / "absent")) == FALLBACK_LLC_BYTES  # not Linux: an assumed size


def test_cache_flush_is_refused_for_a_device_other_than_the_cpu(reference: MeasureReference) -> None:
    with LocalRunner(cache_flush=True) as cold:
        with pytest.raises(ValueError, match=r"cache_flush flushes CPU caches; target 'gpu' runs on cuda"):
            cold.run(reference, [None], TargetSpec("gpu", "a GPU", {"kind": "cuda"}, ()))


@pytest.mark.parametrize("stop_above", [-1.0, float("nan")])
def test_stop_above_must_not_be_negative(
    runner: LocalRunner, reference: MeasureReference, stop_above: float
) -> None:
    with pytest.raises(ValueError, match="stop_above must not be negative"):
        runner.run(reference, [], TARGET, stop_above=stop_above)


def test_segfault_is_a_crash_and_the_next_candidate_still_runs(
    built: dict[str, BuildResult], runner: LocalRunner, reference: MeasureReference
) -> None:
    crash, good = run_all(runner, reference, [built["segfaults"].artifact, built["good"].artifact])
    assert crash.status == "crash"
    assert crash.error == "runner crashed (SIGSEGV)"
    assert good.status == "ok", good.error


def test_hang_times_out_and_the_next_candidate_still_runs(
    built: dict[str, BuildResult], runner: LocalRunner, reference: MeasureReference
) -> None:
    hang, good = run_all(runner, reference, [built["hangs"].artifact, built["good"].artifact])
    assert hang.status == "timeout"
    assert hang.error == f"timed out after {RUNNER_TIMEOUT:g} s"
    assert good.status == "ok", good.error


def test_unloadable_artifact_is_a_run_error(
    workdir: Path, runner: LocalRunner, reference: MeasureReference
) -> None:
    (result,) = run_all(runner, reference, [str(workdir / "missing.so")])
    assert result.status == "run_error"
    assert "missing.so" in result.error


def test_builder_kills_and_replaces_a_worker_that_compiles_too_long(workdir: Path) -> None:
    with LocalBuilder(workers=1, timeout=2.0) as builder:
        mods = [slow_to_compile_matmul(), scheduled_matmul()]
        results = dict(builder.build(mods, TARGET, workdir))
    assert results[0].artifact is None
    assert results[0].error == "build timed out after 2 s"
    assert results[1].error is None and os.path.isfile(results[1].artifact)


def test_builder_replaces_a_worker_that_dies(workdir: Path) -> None:
    before = spawned_children()
    with LocalBuilder(workers=1, timeout=60.0) as builder:
        mods = [scheduled_matmul(), slow_to_compile_matmul(), scheduled_matmul()]
        results = builder.build(mods, TARGET, workdir)
        first_index, first = next(results)
        (worker,) = spawned_children() - before  # now compiling the slow candidate
        psutil.Process(worker).kill()
        rest = dict(results)
    assert first_index == 0 and first.error is None
    assert rest[1].artifact is None and rest[1].error == "builder worker crashed (SIGKILL)"
    assert rest[2].error is None and os.path.isfile(rest[2].artifact)


def test_builder_replaces_a_worker_grown_past_its_memory_limit(workdir: Path) -> None:
    before = spawned_children()
    workers: set[int] = set()
    with LocalBuilder(workers=1, timeout=60.0, max_worker_mb=1.0) as builder:  # every worker is over 1 MB
        for _, result in builder.build([scheduled_matmul()] * 3, TARGET, workdir):
            assert result.error is None and os.path.isfile(result.artifact)
            workers |= children_started_since(before)
    assert len(workers) == 3  # a fresh worker after each build
    with pytest.raises(ValueError, match="max_worker_mb must be positive"):
        LocalBuilder(max_worker_mb=0)


def _worker_pid() -> int:
    """Called in a lent worker: its pid."""
    return os.getpid()


def test_lent_workers_answer_callables_and_one_killed_by_its_borrower_is_replaced_before_use(workdir: Path) -> None:
    before = spawned_children()
    with LocalBuilder(workers=2, timeout=60.0) as builder:
        (lent,) = builder.lend_workers(1)  # only as many as asked are started
        lent.connection.send(_worker_pid)
        (pid,) = spawned_children() - before
        assert lent.connection.recv() == pid
        all_of_them = builder.lend_workers(3)
        assert len(all_of_them) == 2 and all_of_them[0] is lent  # at most `workers`, the same ones again
        lent.kill()  # a borrower gave up on it: the next lend replaces it
        (fresh,) = builder.lend_workers(1)
        assert fresh is not lent and not fresh.finished and not alive(pid)
        fresh.connection.send(_worker_pid)
        assert fresh.connection.recv() != pid
        fresh.kill()  # and so does the next build
        results = dict(builder.build([scheduled_matmul()] * 3, TARGET, workdir))
        assert all(r.error is None and os.path.isfile(r.artifact) for r in results.values())
        assert builder.lend_workers(1)[0] is not fresh
        building = builder.build([scheduled_matmul()], TARGET, workdir)
        next(building)  # suspended while building
        with pytest.raises(RuntimeError, match="busy"):
            builder.lend_workers(1)
        building.close()
    with pytest.raises(RuntimeError, match="closed"):
        builder.lend_workers(1)


def test_abandoned_build_kills_the_busy_worker(workdir: Path) -> None:
    before = spawned_children()
    with LocalBuilder(workers=1, timeout=60.0) as builder:
        results = builder.build([scheduled_matmul(), slow_to_compile_matmul()], TARGET, workdir)
        next(results)
        (worker,) = spawned_children() - before  # now compiling the slow candidate
        results.close()  # the caller stops listening
        assert not alive(worker)


def test_close_and_garbage_collection_leave_no_child_process(
    workdir: Path, reference: MeasureReference
) -> None:
    before = spawned_children()
    builder = LocalBuilder(workers=2)
    runner = LocalRunner()
    built = dict(builder.build([scheduled_matmul(), scheduled_matmul()], TARGET, workdir))
    builder_workers = spawned_children() - before
    [(_, result)] = runner.run(reference, [built[0]], TARGET)
    runner_child = spawned_children() - before - builder_workers
    assert result.status == "ok" and len(builder_workers) == 2 and len(runner_child) == 1

    builder.close()
    assert not any(alive(pid) for pid in builder_workers)
    del runner  # never closed: its finalizer must kill the child
    gc.collect()
    assert not any(alive(pid) for pid in runner_child)
    assert spawned_children() == before


def test_runner_child_loads_tvm_runtime_without_its_compiler(
    workdir: Path, built: dict[str, BuildResult], reference: MeasureReference
) -> None:
    before = spawned_children()
    with LocalRunner() as runner:
        [(_, result)] = runner.run(reference, [built["good"]], TARGET)
        (child,) = spawned_children() - before
        libraries = {Path(m.path).name for m in psutil.Process(child).memory_maps()}
    assert result.status == "ok"
    assert "libtvm_runtime.so" in libraries and "libtvm_compiler.so" not in libraries


def test_children_do_not_run_the_main_script_again(tmp_path: Path) -> None:
    """A script without a ``__main__`` guard starts a child once, and its top level runs once."""
    marker = tmp_path / "ran"
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from pathlib import Path\n"
        f"with Path({str(marker)!r}).open('a') as f:\n"
        "    f.write('top level\\n')\n"
        "from probtune.measure._process import WorkerProcess\n"
        "from probtune.measure._worker import run_worker_main\n"
        "child = WorkerProcess(run_worker_main, (None,), name='probe')\n"
        "child.wait_ready(60)\n"
        "print(child.kill())\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "SIGKILL"
    assert marker.read_text() == "top level\n"


def test_a_scalar_input_stays_a_scalar_from_reference_to_timing(workdir: Path, runner: LocalRunner) -> None:
    """A 0-d parameter (an index a model normalizes, say) is not turned into a 1-element array on the way."""
    a = te.placeholder((N,), "int64", name="A")
    s = te.placeholder((), "int64", name="S")
    out = te.compute((N,), lambda i: tvm.tirx.Select(a[i] < 0, a[i] + s(), a[i]), name="out")
    workload = Workload.from_module(te.create_prim_func([a, s, out]), name="where")
    reference = prepare_reference(workload, workdir, seed=0)
    with np.load(reference.path) as arrays:
        assert arrays["input_1"].shape == ()
    with LocalBuilder(workers=1) as builder:
        [(_, built)] = list(builder.build([workload.mod], TARGET, workdir))
    (result,) = run_all(runner, reference, [built.artifact])
    assert result.status == "ok", result.error
