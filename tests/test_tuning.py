"""End-to-end tuning: results, the database, resuming, bad input."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sqlite3
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import tvm

import probtune
from conftest import host_key, matmul_module, run_module
from probtune import Database, Trace, Workload
from probtune.database.measure_key import MeasureKey
from probtune.measure import prepare_reference
from probtune.measure.builder import LocalBuilder
from probtune.measure.constant_layouts import MeasuredForm
from probtune.measure.pipeline import COLD_CACHE
from probtune.measure.pipeline import confirm_best as _confirm_best
from probtune.measure.results import BuildResult, RunResult
from probtune.measure.runner import LocalRunner
from probtune.search.realize import Realizer
from probtune.space.design_space import program_hash
from probtune.targets import resolve_target
from probtune.task.session import replayable as _replayable
from probtune_cpu.host_cpu import cpu_features

SMALL = dict(shape=(64, 64, 64), target="host", batch_size=4)


def test_tune_matmul_end_to_end(tmp_path):
    db = tmp_path / "tuning.db"
    outcomes = []
    result = probtune.tune("matmul", trials=6, database=db, seed=0, progress=outcomes.append, **SMALL)
    assert result.measured == 6 and [o.trial for o in outcomes] == [1, 2, 3, 4, 5, 6]
    assert result.statuses["ok"] == 6
    assert result.best_latency is not None and result.best_latency > 0
    assert result.best_gflops > 0
    assert isinstance(result.best_trace, Trace)

    lib = result.build()
    a, b = result.workload.random_inputs(3)
    out = run_module(lib, [a, b, np.zeros((64, 64), "float32")])[2]
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)

    with Database(db) as database:
        workload = database.workloads()[0]
        records = database.records(workload.id)
        assert len(records) == 6 and all(r.status == "ok" and r.latencies for r in records)
        assert database.best(workload.id, host_key())[0].id == result.best.id


def test_a_builder_and_runner_made_by_the_caller_measure_and_stay_open_for_the_next_run(tmp_path):
    db = tmp_path / "tuning.db"
    with probtune.LocalBuilder(workers=1) as builder, probtune.LocalRunner(repeat=2, min_repeat_ms=1) as runner:
        first = probtune.tune("matmul", trials=3, database=db, builder=builder, runner=runner, confirm=0, **SMALL)
        second = probtune.tune("matmul", trials=2, database=db, builder=builder, runner=runner, confirm=0, **SMALL)
        assert first.measured == 3 and second.measured == 2
        with Database(db) as database:
            records = database.records(database.workloads()[0].id)
    assert len(records) == 5 and all(r.status == probtune.MeasureStatus.OK for r in records)
    # the given runner's two repeats (a candidate far slower than the best gets one), not the default three
    assert {len(r.latencies) for r in records} <= {1, 2} and any(len(r.latencies) == 2 for r in records)
    assert {r.target for r in records} == {host_key()} == {first.measured_on}


def test_a_runner_that_flushes_the_caches_keeps_its_records_apart(tmp_path):
    db = tmp_path / "tuning.db"
    with probtune.LocalRunner(cache_flush=True, min_repeat_ms=1) as cold:
        probtune.tune("matmul", trials=2, database=db, runner=cold, confirm=0, **SMALL)
        with pytest.raises(probtune.TuningConfigError, match=r"cache_flush=False but the runner given flushes"):
            probtune.tune_model(_tiny_relax_model(), trials=1, runner=cold, cache_flush=False, database=db)
    with Database(db) as database:
        assert {r.target for r in database.records(database.workloads()[0].id)} == {host_key("host" + COLD_CACHE)}


def _tiny_relax_model():
    from tvm import relax
    from tvm.script import relax as R

    @tvm.script.ir_module
    class Tiny:
        @R.function
        def main(x: R.Tensor((4, 4), "float32")) -> R.Tensor((4, 4), "float32"):
            with R.dataflow():
                y = R.add(x, x)
                R.output(y)
            return y

    assert isinstance(Tiny["main"], relax.Function)
    return Tiny


def test_an_unknown_builder_or_runner_name_is_named(tmp_path):
    with pytest.raises(probtune.PluginError, match=r"builder 'far-away'.*registered builders: local"):
        probtune.tune("matmul", trials=1, database=tmp_path / "t.db", builder="far-away", **SMALL)
    with pytest.raises(probtune.PluginError, match=r"runner 'far-away'.*registered runners: local"):
        probtune.tune("matmul", trials=1, database=tmp_path / "t.db", runner="far-away", **SMALL)


def test_second_run_continues_from_the_database(tmp_path):
    db = tmp_path / "tuning.db"
    first = probtune.tune("matmul", trials=4, database=db, seed=0, **SMALL)
    second = probtune.tune("matmul", trials=4, database=db, seed=0, **SMALL)
    with Database(db) as database:
        (workload,) = database.workloads()
        records = database.records(workload.id)
    assert len(records) == 8
    assert len({r.decision_hash for r in records}) == 8  # nothing measured twice
    # The best of both runs, timed again at the end of each (so not necessarily at or below first's).
    assert second.best.id == min((r for r in records if r.status == "ok"), key=lambda r: (r.mean_latency, r.id)).id
    assert len(next(r for r in records if r.id == first.best.id).latencies) > 3  # timed again, not lost


def test_the_best_records_are_timed_again_at_the_end(tmp_path):
    passes = 2 * 3  # two more passes of the runner's three repeats
    result = probtune.tune("matmul", trials=6, database=tmp_path / "t.db", seed=0, confirm=3, **SMALL)
    with Database(tmp_path / "t.db") as database:
        records = database.records(database.workloads()[0].id)
    confirmed = [r for r in records if len(r.latencies) > 3]  # one pass gives at most 3
    assert 3 <= len(confirmed) <= 6 and all(len(r.latencies) in (1 + passes, 3 + passes) for r in confirmed)

    def first_pass(record):
        return float(np.mean(record.latencies[: len(record.latencies) - passes if record in confirmed else None]))

    ranked = sorted(records, key=lambda r: (first_pass(r), r.id))
    assert {r.id for r in ranked[:3]} <= {r.id for r in confirmed}  # the three best of the first pass, at least
    assert result.best.id == min(records, key=lambda r: (r.mean_latency, r.id)).id
    assert result.best.id in {r.id for r in confirmed}

    unconfirmed = probtune.tune("matmul", trials=3, database=tmp_path / "u.db", seed=0, confirm=0, **SMALL)
    with Database(tmp_path / "u.db") as database:
        assert all(len(r.latencies) <= 3 for r in database.records(database.workloads()[0].id))
    assert unconfirmed.measured == 3


class RewritingRunner:
    """A runner whose outcomes pass through ``rewrite(pass_number, position, outcome)``; it counts its passes."""

    def __init__(self, inner, rewrite):
        self.inner, self.rewrite, self.passes = inner, rewrite, 0

    def run(self, reference, artifacts, target, **options):
        self.passes += 1
        for position, outcome in self.inner.run(reference, artifacts, target, **options):
            yield position, self.rewrite(self.passes, position, outcome)


@contextlib.contextmanager
def tuned_without_confirmation(tmp_path, trials):
    """A small tune's database, its local builder and runner, and ``confirm(top, builder, runner)`` that times its best again.

    ``confirm`` uses the local builder and runner unless given others (wrappers around them).
    """
    result = probtune.tune("matmul", trials=trials, database=tmp_path / "t.db", seed=0, confirm=0, **SMALL)
    reference = prepare_reference(result.workload, str(tmp_path), seed=0)
    with Database(tmp_path / "t.db") as db, LocalBuilder() as local_builder, LocalRunner() as local_runner:
        workload_id = db.workloads()[0].id

        def confirm(top, builder=local_builder, runner=local_runner):
            _confirm_best(
                db, workload_id, result.target, MeasureKey.parse(result.measured_on), result.space, builder, runner,
                MeasuredForm(reference), str(tmp_path), top,
            )

        yield db, workload_id, local_builder, local_runner, confirm


def test_a_record_that_overtakes_the_timed_again_ones_is_timed_again_too(tmp_path):
    def first_round_slow(passes, position, outcome):  # its records fall behind the others
        # the first round's two passes slow, the later ones fast: no untimed record can overtake by timing noise
        scale = 1000 if passes <= 2 else 1 / 1000
        return RunResult(outcome.status, tuple(t * scale for t in outcome.latencies), None, outcome.seconds)

    with tuned_without_confirmation(tmp_path, trials=5) as (db, workload_id, _, runner, confirm):
        before = {r.id: r for r in db.records(workload_id)}
        first_round = [r.id for r in db.best(workload_id, host_key(), k=2)]
        slow = RewritingRunner(runner, first_round_slow)
        confirm(2, runner=slow)
        after = {r.id: r for r in db.records(workload_id)}
        best = db.best(workload_id, host_key())[0]
    timed_again = {i for i in after if len(after[i].latencies) > len(before[i].latencies)}
    assert slow.passes == 4  # two rounds of two passes; the second round's best is timed again: no third
    assert set(first_round) < timed_again and len(timed_again) == 4
    assert best.id in timed_again - set(first_round)


def test_a_best_record_that_no_longer_builds_or_runs_is_named_and_the_others_still_confirmed(tmp_path):
    class FirstFailsToBuild:
        def __init__(self, inner):
            self.inner = inner

        def build(self, mods, target, workdir, **options):
            rest = dict(self.inner.build(mods[1:], target, workdir, **options))
            yield 0, BuildResult(None, "the compiler is gone", 0.0)
            yield from ((i + 1, built) for i, built in rest.items())

    def first_pass_fails_first(passes, position, outcome):
        if passes == 1 and position == 0:
            return RunResult("run_error", (), "the device is gone", outcome.seconds)
        return outcome

    with tuned_without_confirmation(tmp_path, trials=4) as (db, workload_id, builder, runner, confirm):
        best = db.best(workload_id, host_key(), k=3)
        with pytest.warns(UserWarning) as warned:
            confirm(3, builder=FirstFailsToBuild(builder), runner=RewritingRunner(runner, first_pass_fails_first))
        messages = [str(w.message) for w in warned]
        assert any(f"record {best[0].id}" in m and "does not build now: the compiler is gone" in m for m in messages)
        assert any(f"record {best[1].id}" in m and "run_error when timed again: the device is gone" in m
                   for m in messages)
        after = {r.id: r for r in db.records(workload_id)}
    assert after[best[0].id].latencies == best[0].latencies  # not timed again
    assert len(after[best[1].id].latencies) == len(best[1].latencies) + 3  # the second pass only
    assert len(after[best[2].id].latencies) == len(best[2].latencies) + 6  # both passes


def test_the_builders_workers_realize_candidates_for_the_search(tmp_path, monkeypatch):
    """One set of TVM processes: the search borrows the builder's workers between builds, it starts none."""
    builders, lent, received = [], [], []
    original_init, original_lend, original_receive = LocalBuilder.__init__, LocalBuilder.lend_workers, Realizer._receive

    def init(self, *args, **kwargs):
        builders.append(self)
        original_init(self, *args, **kwargs)

    def lend(self, count):
        lent.append(original_lend(self, count))
        return lent[-1]

    def receive(self, helper, chunk):
        received.append(helper)
        return original_receive(self, helper, chunk)

    monkeypatch.setattr(LocalBuilder, "__init__", init)
    monkeypatch.setattr(LocalBuilder, "lend_workers", lend)
    monkeypatch.setattr(Realizer, "_receive", receive)
    options = {"realize_workers": 1, "population_size": 16, "init_samples": 8}
    result = probtune.tune("matmul", trials=12, seed=0, search_options=options, database=tmp_path / "t.db", **SMALL)
    assert result.statuses["ok"] == 12
    assert len(builders) == 1  # the tuning's builder, none of the search's own
    assert lent and all(len(workers) == 1 for workers in lent)
    assert received and set(received) <= {worker for workers in lent for worker in workers}


def test_same_seed_same_search(tmp_path):
    # Random search: the candidates depend on the seed only. (The evolutionary search also depends on
    # the measured latencies; tests/test_search.py checks it is deterministic given the same ones.)
    def hashes(name: str) -> list[int]:
        probtune.tune("matmul", trials=5, database=tmp_path / name, seed=42, strategy="random", **SMALL)
        with Database(tmp_path / name) as database:
            return [r.decision_hash for r in database.records(database.workloads()[0].id)]

    assert hashes("a.db") == hashes("b.db")


def test_wrong_results_are_recorded_and_tuning_goes_on(tmp_path):
    def wrong_reference(a, b):
        return [a @ b + 1.0]

    base = Workload.from_module(matmul_module(32, 32, 32))
    workload = Workload(base.name, None, base.dtype, base.mod, base.num_inputs, base.flops, wrong_reference)
    result = probtune.tune(workload, target="host", trials=3, database=tmp_path / "t.db", batch_size=3)
    assert result.measured == 3 and result.statuses == {"wrong_result": 3}
    assert result.best is None
    with Database(tmp_path / "t.db") as database:
        records = database.records(database.workloads()[0].id)
    assert all(r.status == "wrong_result" and "tolerance" in r.error for r in records)


def test_killed_run_loses_nothing(tmp_path):
    db = tmp_path / "killed.db"
    cmd = [sys.executable, "-m", "probtune.cli", "tune", "--workload", "matmul", "--shape", "64,64,64",
           "--trials", "200", "--batch-size", "2", "--database", str(db)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    reported = 0
    deadline = time.monotonic() + 180
    for line in proc.stdout:  # wait until a few results were reported, then kill the whole process group
        reported += line.startswith("[")
        if reported >= 3 or time.monotonic() > deadline:
            break
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert reported >= 3
    with Database(db) as database:
        (workload,) = database.workloads()
        kept = database.records(workload.id)
    assert len(kept) >= reported
    resumed = probtune.tune("matmul", trials=2, database=db, **SMALL)
    with Database(db) as database:
        assert database.count(workload.id) == len(kept) + resumed.measured


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(workload="nope"), probtune.UnknownWorkloadError, "unknown workload 'nope'.*matmul"),
        (dict(workload="matmul", shape=(64, 64)), probtune.WorkloadShapeError, "3 shape parameters"),
        (dict(workload="matmul", shape="64,x,64"), probtune.WorkloadShapeError, "64,x,64"),
        (dict(workload="matmul", target="tpu-v9"), probtune.UnknownTargetError, "unknown target 'tpu-v9'.*host"),
        (dict(workload="matmul", trials=0), probtune.TuningConfigError, "trials must be a positive integer"),
        (dict(workload="matmul", trials=-3), probtune.TuningConfigError, "got -3"),
        (dict(workload="matmul", strategy="annealing"), probtune.TuningConfigError, "unknown search strategy"),
        (dict(workload="matmul", cost_model="oracle"), probtune.PluginError, "unknown cost model 'oracle'.*xgb"),
        (dict(workload="matmul", confirm=-1), probtune.TuningConfigError, "confirm must be a non-negative integer"),
    ],
)
def test_bad_input_is_named(kwargs, error, message, tmp_path):
    kwargs = {"trials": 2, "shape": (64, 64, 64), **kwargs}
    with pytest.raises(error, match=message):
        probtune.tune(database=tmp_path / "t.db", **kwargs)


def test_not_a_database_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "notes.db"
    path.write_text("my precious notes\n")
    with pytest.raises(probtune.DatabaseError, match=r"notes\.db"):
        probtune.tune("matmul", trials=2, database=path, **SMALL)
    assert path.read_text() == "my precious notes\n"


def test_database_of_another_schema_version_is_refused(tmp_path):
    path = tmp_path / "old.db"
    probtune.tune("matmul", trials=1, database=path, **SMALL)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(probtune.SchemaVersionError, match="99"):
        probtune.tune("matmul", trials=1, database=path, **SMALL)


@pytest.mark.skipif("avx512f" in cpu_features(), reason="this CPU runs AVX-512 code")
def test_target_this_cpu_cannot_run_is_refused(tmp_path):
    with pytest.raises(probtune.UnsupportedTargetError, match=r"x86-avx512.*avx512f"):
        probtune.tune("matmul", target="x86-avx512", trials=1, shape=(64, 64, 64), database=tmp_path / "t.db")


def test_compile_best_reads_the_database(tmp_path):
    db = tmp_path / "tuning.db"
    probtune.tune("matmul", trials=3, database=db, **SMALL)
    lib = probtune.compile_best("matmul", "host", db, shape=(64, 64, 64))
    a = np.random.default_rng(0).standard_normal((64, 64)).astype("float32")
    out = run_module(lib, [a, a, np.zeros((64, 64), "float32")])[2]
    np.testing.assert_allclose(out, a @ a, rtol=1e-4, atol=1e-4)


def _saved_model_samples(db_path, name: str = "xgb") -> int:
    from probtune_xgb.model import XGBCostModel

    with Database(db_path) as database:
        state = database.load_cost_model(name, host_key())
    assert state is not None
    model = XGBCostModel(seed=0)
    model.load(state)
    return model.num_samples


def test_cost_model_is_kept_in_the_database_and_shared_across_workloads(tmp_path):
    db = tmp_path / "tuning.db"
    first = probtune.tune("matmul", trials=4, database=db, **SMALL)
    assert _saved_model_samples(db) == first.measured == 4
    again = probtune.tune("matmul", trials=2, database=db, **SMALL)  # continues: learns on top of what it had
    assert _saved_model_samples(db) == 6
    other = probtune.tune("matmul", trials=2, database=db, **{**SMALL, "shape": (32, 64, 48)})
    assert _saved_model_samples(db) == 8  # the new shape started from the model trained on the first
    assert again.best is not None and other.best is not None
    a, b = other.workload.random_inputs(0)
    out = run_module(other.build(), [a, b, np.zeros((32, 64), "float32")])[2]  # (M, N, K) = (32, 64, 48)
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


def test_unreadable_cost_model_state_is_replaced_with_a_warning(tmp_path):
    db = tmp_path / "tuning.db"
    with Database(db) as database:
        database.save_cost_model("xgb", host_key(), b"not a model")
    with pytest.warns(UserWarning, match="cost model 'xgb'.*does not load") as caught:
        result = probtune.tune("matmul", trials=5, database=db, **SMALL)
    assert _warned_at_this_call(caught, "does not load")
    assert result.measured == 5
    assert _saved_model_samples(db) == 5


def _damage_record(db_path, damage, rank: int = 0) -> int:
    """Replace the trace JSON of the ``rank``-th best record by ``damage`` of it, as a hand edit or a bad disk
    might; its id."""
    with contextlib.closing(sqlite3.connect(db_path)) as conn, conn:
        record_id, text = conn.execute(
            "SELECT id, trace_json FROM records WHERE status = 'ok' ORDER BY mean_latency, id LIMIT 1 OFFSET ?",
            (rank,),
        ).fetchone()
        damaged = damage(text)
        assert damaged != text
        conn.execute("UPDATE records SET trace_json = ? WHERE id = ?", (damaged, record_id))
    return record_id


def test_damaged_records_are_named_in_one_warning(tmp_path):
    db = tmp_path / "tuning.db"
    result = probtune.tune("matmul", trials=4, database=db, seed=0, confirm=0, **SMALL)
    first = _damage_record(db, lambda text: text[:60])
    second = _damage_record(db, lambda text: text.replace('"kind":"split"', '"kind":"splitt"', 1), rank=2)
    with Database(db) as database:
        records = database.best(database.workloads()[0].id, host_key(), k=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kept = _replayable(records, result.space, db)
    (message,) = [str(w.message) for w in caught if "left out" in str(w.message)]
    assert message.startswith(
        f"{db}: records {first}, {second} are left out: the trace is malformed or does not replay "
        f"into a valid program (record {first}: trace JSON"
    )
    assert [replayed.record.id for replayed in kept] == [r.id for r in records if r.id not in (first, second)]


DAMAGES = pytest.mark.parametrize(
    "damage",
    [
        lambda text: text[:60],
        lambda text: text.replace('"kind":"split"', '"kind":"splitt"', 1),
        lambda text: text.replace('"n":4', '"n":123456789012345678901234', 1),  # JSON reads it as a float
    ],
    ids=["cut-short", "unknown-instruction", "integer-too-large"],
)


def _warned_at_this_call(caught, text: str) -> bool:
    """The warnings saying ``text`` point at this file, where probtune was called, not inside probtune."""
    lines = [w for w in caught if text in str(w.message)]
    return bool(lines) and all(w.filename == __file__ for w in lines)


@DAMAGES
def test_a_damaged_best_record_is_named_left_out_and_kept(damage, tmp_path):
    db = tmp_path / "tuning.db"
    probtune.tune("matmul", trials=4, database=db, seed=0, **SMALL)
    damaged = _damage_record(db, damage)
    left_out = f"record {damaged} is left out: the trace is malformed or does not replay"
    with pytest.warns(UserWarning, match=left_out) as caught:
        result = probtune.tune("matmul", trials=4, database=db, seed=0, **SMALL)
    assert _warned_at_this_call(caught, "is left out")
    assert result.measured == 4 and result.best is not None and result.best.id != damaged
    with Database(db) as database:
        records = database.records(database.workloads()[0].id)
    assert len(records) == 8 and damaged in {r.id for r in records}  # kept as it is: nothing recorded is lost


def test_compile_best_takes_this_machines_records_or_the_devices_named(tmp_path):
    db = tmp_path / "tuning.db"
    result = probtune.tune("matmul", trials=3, database=db, seed=0, confirm=0, **SMALL)
    with Database(db) as database:
        workload = database.workloads()[0].id
        for device in ("Board A", "Board B"):  # another device's records of the same target: one slow program each
            key = database.measured_on(MeasureKey("host", device), result.target.tvm_target).text
            database.add_record(workload, key, result.best.trace_json, 7, "ok", [1.0])
    a, b = result.workload.random_inputs(0)
    for device in (None, "Board A"):
        lib = probtune.compile_best("matmul", "host", db, shape=(64, 64, 64), device=device)
        out = run_module(lib, [a, b, np.zeros((64, 64), "float32")])[2]
        np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)
    with pytest.raises(LookupError, match=r"records of target 'host' from the devices: .*Board A.*Board B"):
        probtune.compile_best("matmul", "host", db, shape=(64, 64, 64), device="Board C")


@DAMAGES
def test_compile_best_passes_over_a_damaged_best_record(damage, tmp_path):
    db = tmp_path / "tuning.db"
    result = probtune.tune("matmul", trials=4, database=db, seed=0, confirm=0, **SMALL)
    damaged = _damage_record(db, damage)
    left_out = f"record {damaged} is left out: the trace is malformed or does not replay"
    with pytest.warns(UserWarning, match=left_out) as caught:
        lib = probtune.compile_best("matmul", "host", db, shape=(64, 64, 64))
    assert _warned_at_this_call(caught, "is left out")
    a, b = result.workload.random_inputs(1)
    out = run_module(lib, [a, b, np.zeros((64, 64), "float32")])[2]
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


def test_compile_best_passes_over_a_best_record_whose_program_a_validator_now_rejects(tmp_path):
    db = tmp_path / "tuning.db"
    result = probtune.tune("matmul", trials=4, database=db, seed=0, confirm=0, **SMALL)
    with Database(db) as database:
        best = database.best(database.workloads()[0].id, host_key())[0]

    class RejectsTheBest:
        """A validator added since the records were made: it rejects the best record's program."""

        name = "rejects-the-best"

        def check(self, sch, ctx):
            return "rejected for the test" if program_hash(sch.mod) == best.program_hash else None

    host = resolve_target("host")
    stricter = dataclasses.replace(host, validators=(*host.validators, RejectsTheBest()))
    with pytest.warns(UserWarning, match=f"record {best.id} is left out: .*rejects-the-best"):
        lib = probtune.compile_best("matmul", stricter, db, shape=(64, 64, 64))
    a, b = result.workload.random_inputs(1)
    out = run_module(lib, [a, b, np.zeros((64, 64), "float32")])[2]
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workload", "nope"], "unknown workload 'nope'"),
        (["--target", "tpu-v9"], "unknown target 'tpu-v9'"),
        (["--shape", "64,x,64"], "64,x,64"),
    ],
)
def test_cli_refuses_bad_input_before_announcing_a_run(argv, message, capsys, tmp_path):
    from probtune.cli import main

    assert main(["tune", "--database", str(tmp_path / "t.db"), *argv]) == 2
    out, err = capsys.readouterr()
    assert message in err and "tuning" not in out
    assert not (tmp_path / "t.db").exists()


def test_cli_refuses_a_non_positive_trial_count(capsys):
    from probtune.cli import main

    with pytest.raises(SystemExit):
        main(["tune", "--trials", "0"])
    assert "must be a positive integer, got 0" in capsys.readouterr().err


def test_cli_refuses_a_negative_confirm_count(capsys):
    from probtune.cli import main

    with pytest.raises(SystemExit):
        main(["tune", "--confirm", "-1"])
    assert "must be a non-negative integer, got -1" in capsys.readouterr().err
