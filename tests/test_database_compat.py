"""A database written by an earlier version (``tests/data/old_database.db``) still opens, replays and compiles."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest
from test_model_tuning import CNN_SHAPES

from conftest import host_key
from probtune import generate_space, tune_model
from probtune.database.database import Database
from probtune.plugins import get_registry
from probtune.task.session import replayable
from probtune.workloads.catalog import resolve_workload
from probtune_cpu.host_cpu import cpu_model

OLD = "tests/data/old_database.db"


@pytest.fixture
def old_database(tmp_path, host):
    """A copy of the old database whose records are keyed to this machine, as if they had been measured here.

    Records are kept per CPU model; the file was written on another machine,
    whose key would make every record someone else's.
    """
    path = tmp_path / "old.db"
    shutil.copyfile(OLD, path)
    with sqlite3.connect(path) as conn:
        (device,) = conn.execute("SELECT DISTINCT device FROM measured_on").fetchone()
        for table, column in (("records", "target"), ("cost_models", "target"), ("measured_on", "key")):
            conn.execute(f"UPDATE {table} SET {column} = replace({column}, ?, ?)", (device, cpu_model()))
        conn.execute("UPDATE measured_on SET device = ?, tvm_target = ?",
                     (cpu_model(), json.dumps(host.tvm_target, sort_keys=True)))
    return path


def test_the_old_models_records_replay_and_compile_without_tuning(old_database, small_cnn_onnx):
    result = tune_model(small_cnn_onnx, trials=0, input_shapes=CNN_SHAPES, database=old_database, confirm=0)
    assert result.trials == 0 and [row.program for row in result.tasks] == ["tuned"] * len(result.tasks)
    assert result.compile().check.max_rel_error < 1e-3


def test_the_old_operators_best_record_replays_in_todays_space(old_database, host):
    workload = resolve_workload("matmul", (64, 64, 64), "float32", get_registry().workloads)
    with Database(old_database) as db:
        workload_id = db.commit_workload(workload.key, workload.mod)  # the old row, matched by structure
        assert db.count() == 20 and db.count(workload_id) == 8
        replayed = replayable(db.best(workload_id, host_key(), k=8), generate_space(workload, host), db.path)
    assert len(replayed) == 8
