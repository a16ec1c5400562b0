"""Tuning whole models: import, tasks, a small budget, compile, outputs equal to onnxruntime's; resume; bad input."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from tvm import relax

import probtune
from conftest import host_key
from probtune.database.database import Database
from probtune.errors import ModelCheckError
from probtune.measure.pipeline import COLD_CACHE
from probtune.model import CompiledModel, tune_model
from probtune.model import check as check_module
from probtune.model.thread_count import candidate_counts

CNN_SHAPES = {"x": (1, 3, 16, 16)}
FAST = dict(batch_size=4, confirm=0)


@pytest.fixture(scope="module")
def cnn_result(small_cnn_onnx, tmp_path_factory):
    database = tmp_path_factory.mktemp("cnn") / "tuning.db"
    return tune_model(small_cnn_onnx, "host", trials=20, input_shapes=CNN_SHAPES, database=database, seed=0, **FAST)


def test_a_cnn_is_tuned_compiled_and_matches_onnxruntime(cnn_result, tmp_path):
    rows = cnn_result.tasks
    assert cnn_result.trials == 20 == sum(row.trials for row in rows)
    assert all(row.program == "tuned" and row.best_latency > 0 for row in rows)
    assert sum(row.share for row in rows) == pytest.approx(1.0)
    assert cnn_result.estimated_latency == pytest.approx(sum(r.weight * r.best_latency for r in rows))
    assert "fused_conv2d" in cnn_result.table()

    compiled = cnn_result.compile()
    assert compiled.check.reference == "onnxruntime" and compiled.check.max_rel_error < 1e-3
    assert compiled.num_threads == compiled.thread_choice.count == compiled.threads()  # timed on 1 and all cores
    assert sorted(compiled.thread_choice.medians) == candidate_counts(cnn_result.target.num_cores)
    inputs = cnn_result.model.random_inputs(5)
    (logits,) = compiled(*inputs)
    assert logits.shape == (1, 10)
    assert min(compiled.time(inputs, repeat=2, min_repeat_ms=1)) > 0

    path = compiled.export_library(tmp_path / "cnn.so")
    loaded = CompiledModel.load(path, cnn_result.model.inputs)
    np.testing.assert_array_equal(loaded(*inputs)[0], logits)


class _RecordingVM:
    """A compiled model's VM, with the arguments of its timers kept."""

    def __init__(self, vm) -> None:
        self.vm = vm
        self.timers: list[dict] = []

    def time_evaluator(self, *args, **kwargs):
        self.timers.append(kwargs)
        return self.vm.time_evaluator(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.vm, name)


def test_a_repeat_runs_the_model_once_unless_min_repeat_ms_asks_for_more(cnn_result):
    compiled = cnn_result.compile(check=False, num_threads=1)
    compiled._vm = _RecordingVM(compiled._vm)
    assert len(compiled.time(cnn_result.model.random_inputs(0), repeat=3, min_repeat_ms=0)) == 3
    assert compiled._vm.timers == [{"number": 1, "repeat": 3, "min_repeat_ms": 0}]  # TVM's own default is 10 calls


def test_a_thread_count_asked_for_is_kept_untimed(cnn_result):
    compiled = cnn_result.compile(check=False, num_threads=1)
    assert compiled.num_threads == compiled.threads() == 1 and compiled.thread_choice is None


def test_export_and_load_print_nothing_of_tvms_executable_scope(cnn_result, tmp_path, capfd):
    path = cnn_result.compile(check=False).export_library(tmp_path / "cnn.so")
    CompiledModel.load(path, cnn_result.model.inputs)
    assert "Scope" not in capfd.readouterr().err


def test_a_compiled_models_library_folder_goes_with_it_quietly(cnn_result, recwarn):
    compiled = cnn_result.compile(check=False)
    folder = compiled._library.parent
    assert folder.is_dir() and folder.name.startswith("probtune-model-")
    del compiled
    gc.collect()
    assert not folder.exists()
    assert not [w for w in recwarn if "Implicitly cleaning up" in str(w.message)]


def test_calls_from_several_threads_each_get_their_own_outputs(cnn_result):
    compiled = cnn_result.compile()
    inputs = [cnn_result.model.random_inputs(seed) for seed in range(4)]
    expected = [compiled(*batch)[0] for batch in inputs]
    first = expected[0].copy()
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda i: compiled(*inputs[i % 4])[0], range(32)))
    for i, out in enumerate(got):
        np.testing.assert_array_equal(out, expected[i % 4])
    np.testing.assert_array_equal(expected[0], first)  # later calls do not write into an earlier call's outputs
    with pytest.raises(ValueError, match=r"input 'x' must be float32\[1, 3, 16, 16\], got float64"):
        compiled(inputs[0][0].astype("float64"))


def test_a_mismatch_with_the_reference_is_an_error(cnn_result, monkeypatch):
    real = check_module.reference_outputs

    def off_by_a_little(model, inputs):
        name, outputs = real(model, inputs)
        return name, [out + 0.01 * np.abs(out).max() for out in outputs]

    monkeypatch.setattr(check_module, "reference_outputs", off_by_a_little)
    with pytest.raises(ModelCheckError, match=r"output 0 of the compiled model differs from onnxruntime's in \d+ of 10"):
        cnn_result.compile()


def test_an_encoder_layer_is_tuned_and_matches_onnxruntime(encoder_onnx, tmp_path):
    result = tune_model(encoder_onnx, "host", trials=16, database=tmp_path / "t.db", **FAST)
    assert any("softmax" in row.name for row in result.tasks)
    assert any("layer_norm" in row.name for row in result.tasks)
    assert len(result.tasks) <= 16 and all(row.trials >= 1 for row in result.tasks)  # every task reached
    compiled = result.compile()
    assert compiled.check.reference == "onnxruntime"


def test_fewer_trials_than_tasks_leave_the_rest_on_default_programs(small_cnn_onnx, tmp_path):
    with pytest.warns(UserWarning, match=r"2 trials cannot reach all \d+ untuned tasks of the model"):
        result = tune_model(small_cnn_onnx, trials=2, input_shapes=CNN_SHAPES, database=tmp_path / "t.db", **FAST)
    defaults = [row for row in result.tasks if row.program == "default"]
    assert len(defaults) == len(result.tasks) - 2 and all(row.best_latency is None for row in defaults)
    assert result.estimated_latency is None
    assert result.compile().check is not None  # default programs compute the right thing too


def test_zero_trials_compile_the_databases_best_programs(cnn_result, small_cnn_onnx):
    with Database(cnn_result.database) as db:
        before = db.count()
    again = tune_model(small_cnn_onnx, trials=0, input_shapes=CNN_SHAPES, database=cnn_result.database, **FAST)
    assert again.trials == 0 and all(row.trials == 0 for row in again.tasks)
    assert [row.program for row in again.tasks] == ["tuned"] * len(cnn_result.tasks)
    assert again.programs.keys() == cnn_result.programs.keys()
    with Database(cnn_result.database) as db:
        assert db.count() == before
    assert again.compile().check is not None


def test_a_model_tvm_cannot_compile_is_refused_before_the_first_trial(tmp_path):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 6, 6, 4), "float32"))
    w = relax.const(np.ones((4, 4, 2, 2), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():  # nothing lowers a transposed convolution with NHWC data and an OIHW kernel
            out = bb.emit_output(relax.op.nn.conv2d_transpose(x, w, strides=2, data_layout="NHWC", kernel_layout="OIHW"))
        bb.emit_func_output(out)
    seen = []
    with pytest.raises(probtune.ModelCompileError, match=r"TVM cannot compile the model.*conv2d_transpose.*no trial was spent"):
        tune_model(bb.get(), trials=8, database=tmp_path / "t.db", progress=seen.append, **FAST)
    assert seen == [] and _count(tmp_path / "t.db") == 0


def test_only_tasks_that_weigh_in_the_model_are_confirmed(small_cnn_onnx, tmp_path, monkeypatch):
    from probtune.defaults import CONFIRM_SHARE
    from probtune.measure.pipeline import MeasurePipeline

    confirmed = []
    monkeypatch.setattr(MeasurePipeline, "confirm", lambda self, session, top: confirmed.append(session.workload.name))
    result = tune_model(small_cnn_onnx, trials=16, input_shapes=CNN_SHAPES, database=tmp_path / "t.db", batch_size=2,
                        confirm=1)
    shares = {row.name: row.share for row in result.tasks}
    assert confirmed and all(shares[name] >= CONFIRM_SHARE * 0.5 for name in confirmed)
    assert {row.name for row in result.tasks if row.share and row.share >= 2 * CONFIRM_SHARE} <= set(confirmed)


def test_a_second_run_reuses_the_records_of_shared_tasks(cnn_result, small_cnn_onnx):
    with Database(cnn_result.database) as db:
        before = db.count()
    again = tune_model(small_cnn_onnx, trials=4, input_shapes=CNN_SHAPES, database=cnn_result.database, **FAST)
    assert sum(row.total_trials for row in again.tasks) == before + 4
    assert sum(row.trials for row in again.tasks) == 4


def test_cold_and_warm_timings_are_recorded_apart(small_cnn_onnx, tmp_path):
    database = tmp_path / "t.db"
    cold = tune_model(small_cnn_onnx, trials=4, input_shapes=CNN_SHAPES, database=database, cache_flush=True, **FAST)
    warm = tune_model(small_cnn_onnx, trials=4, input_shapes=CNN_SHAPES, database=database, cache_flush=False, **FAST)
    assert sum(row.total_trials for row in warm.tasks) == 4  # the cold records are not warm ones
    assert _record_keys(database) == {host_key(cold.target.name + COLD_CACHE), host_key(warm.target.name)}


def test_a_model_that_fits_the_last_level_cache_is_timed_warm_by_default(cnn_result):
    assert _record_keys(cnn_result.database) == {host_key(cnn_result.target.name)}  # a few KiB of weights: no +cold-llc


def _record_keys(database) -> set[str]:
    """The keys a database's records are kept under."""
    with Database(database) as db:
        return {record.target for workload in db.workloads() for record in db.records(workload.id)}


def test_a_relax_module_is_checked_against_its_untuned_build(tmp_path):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    w = relax.const(np.random.default_rng(0).standard_normal((16, 4)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.matmul(x, w)))
        bb.emit_func_output(out)
    result = probtune.tune_model(bb.get(), trials=4, database=tmp_path / "t.db", **FAST)
    assert result.compile().check.reference == "untuned build"


def test_kill_9_loses_no_record_and_the_same_command_resumes(small_cnn_onnx, tmp_path):
    database = tmp_path / "tuning.db"
    script = textwrap.dedent(f"""
        import probtune
        probtune.tune_model({str(small_cnn_onnx)!r}, trials=200, input_shapes={CNN_SHAPES!r},
                            database={str(database)!r}, batch_size=4, confirm=0)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and child.poll() is None:
            time.sleep(1)
            if database.exists() and _count(database) >= 6:
                break
        assert child.poll() is None, "the tune ended before it could be killed"
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    recorded = _count(database)
    assert recorded >= 6
    tune_model(small_cnn_onnx, trials=4, input_shapes=CNN_SHAPES, database=database, **FAST)
    with Database(database) as db:
        assert db.count() == recorded + 4
        for workload in db.workloads():
            hashes = [r.decision_hash for r in db.records(workload.id)]
            assert len(hashes) == len(set(hashes)), "nothing measured before is measured again"


def _count(database) -> int:
    with Database(database) as db:
        return db.count()


def test_bad_options_are_named_before_anything_runs(small_cnn_onnx):
    with pytest.raises(probtune.TuningConfigError, match="trials must be a non-negative integer"):
        tune_model(small_cnn_onnx, trials=-1, input_shapes=CNN_SHAPES)
    with pytest.raises(ValueError, match="unknown task scheduler"):
        tune_model(small_cnn_onnx, trials=4, input_shapes=CNN_SHAPES, scheduler="fastest")
    with pytest.raises(probtune.UnknownTargetError):
        tune_model(small_cnn_onnx, "z80", trials=4, input_shapes=CNN_SHAPES)
    with pytest.raises(probtune.ModelImportError, match="dynamic shape"):
        tune_model(small_cnn_onnx, trials=4)
    with pytest.raises(probtune.TuningConfigError, match="unknown precision 'int4'"):
        tune_model(small_cnn_onnx, trials=4, input_shapes=CNN_SHAPES, precision="int4")


def test_an_fp16_model_computes_in_float16_and_matches_onnxruntime_within_float16s_tolerance(encoder_onnx, tmp_path):
    result = tune_model(encoder_onnx, "host", trials=0, database=tmp_path / "t.db", precision="fp16", **FAST)
    halves = [name for name, program in result.programs.items()
              if any(str(param.dtype) == "float16" for param in program["main"].params)]
    assert halves and any("matmul" in name for name in halves)  # the matrix products take float16 operands
    compiled = result.compile()
    assert compiled.check is not None and compiled.check.rtol == 1e-2
    assert 0 < compiled.check.max_rel_error < 1e-2  # float16's rounding shows, within its tolerance
