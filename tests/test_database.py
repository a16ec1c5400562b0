"""Tests of the SQLite tuning database: durability, schema checks, lookups, bad rows."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import tvm
import tvm_ffi
from tvm import te

import probtune.database.database
from probtune.database.database import SCHEMA_VERSION, STATUSES, Database, Record
from probtune.database.measure_key import MeasureKey
from probtune.errors import DatabaseError, DatabaseRowError, SchemaVersionError

TARGET = '{"kind": "llvm", "mcpu": "znver4"}'
OTHER_TARGET = '{"kind": "llvm", "mtriple": "aarch64-linux-gnu"}'
PYTHON_DIR = Path(probtune.database.database.__file__).resolve().parents[2]  # holds the package


def matmul_module(m: int = 16, n: int = 16, k: int = 16) -> tvm.IRModule:
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "tune.db"


@pytest.fixture
def db(db_path: Path) -> Iterator[Database]:
    with Database(db_path) as database:
        yield database


@pytest.fixture
def workload_id(db: Database) -> int:
    return db.commit_workload("matmul_16", matmul_module())


def add_ok(
    db: Database, workload_id: int, latency: float, decision_hash: int = 1, target: str = TARGET
) -> int:
    return db.add_record(workload_id, target, "[]", decision_hash, "ok", [latency])


def insert_raw_record(db_path: Path, workload_id: int, **overrides: object) -> int:
    """Write a record row by hand, bypassing add_record's checks, as a damaged file would."""
    row = {
        "workload_id": workload_id,
        "target": TARGET,
        "trace_json": "[]",
        "decision_hash": "00000000000000aa",
        "status": "ok",
        "latencies_json": "[0.5]",
        "mean_latency": 0.5,
    }
    row.update(overrides)
    with sqlite3.connect(db_path) as connection:
        cursor = connection.execute(
            f"INSERT INTO records ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
            list(row.values()),
        )
    connection.close()
    return cursor.lastrowid


StartPython = Callable[[str], "subprocess.Popen[str]"]


@pytest.fixture
def run_python() -> Iterator[StartPython]:
    """Start Python processes running given code; any still alive at teardown are killed."""
    python_path = os.pathsep.join(filter(None, [str(PYTHON_DIR), os.environ.get("PYTHONPATH")]))
    processes: list[subprocess.Popen[str]] = []

    def start(code: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": python_path},
        )
        processes.append(process)
        return process

    yield start
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.communicate()


# ------------------------------------------------------------ files and durability


def test_create_and_reopen_round_trip(db_path: Path) -> None:
    mod = matmul_module()
    with Database(db_path) as db:
        assert db.path == db_path
        workload_id = db.commit_workload("matmul_16", mod)
        ok_id = db.add_record(
            workload_id,
            TARGET,
            '[["split", 0]]',
            decision_hash=2**64 - 1,
            status="ok",
            latencies=[0.002, 0.004],
            program_hash=2**63,
            build_seconds=0.3,
            run_seconds=0.1,
        )
        error_id = db.add_record(workload_id, TARGET, "[]", 7, "build_error", error="boom")

    with Database(db_path) as db:
        workload = db.workload(workload_id)
        assert workload.key == "matmul_16"
        assert workload.structural_hash == tvm_ffi.structural_hash(mod)
        assert tvm_ffi.structural_equal(workload.mod, mod)
        assert [w.id for w in db.workloads()] == [workload_id]

        ok = db.record(ok_id)
        assert ok == Record(
            id=ok_id,
            workload_id=workload_id,
            target=TARGET,
            trace_json='[["split", 0]]',
            decision_hash=2**64 - 1,
            program_hash=2**63,
            status="ok",
            latencies=(0.002, 0.004),
            mean_latency=pytest.approx(0.003),
            error=None,
            build_seconds=0.3,
            run_seconds=0.1,
            created=ok.created,
        )
        assert ok.created is not None
        failed = db.record(error_id)
        assert (failed.status, failed.error, failed.mean_latency, failed.latencies) == (
            "build_error",
            "boom",
            None,
            (),
        )
        assert db.count() == 2

    with sqlite3.connect(db_path) as connection:
        meta = dict(connection.execute("SELECT key, value FROM meta"))
    connection.close()
    assert meta == {"schema_version": str(SCHEMA_VERSION), "created_by": "probtune"}


def test_wal_mode_is_on(db: Database, db_path: Path) -> None:
    connection = sqlite3.connect(db_path)
    try:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        connection.close()


def test_closed_database_raises(db_path: Path) -> None:
    with Database(db_path) as db:
        pass
    db.close()  # closing twice is fine
    with pytest.raises(DatabaseError, match="closed"):
        db.count()


def test_two_open_databases_see_each_others_records(db_path: Path) -> None:
    with Database(db_path) as first, Database(db_path) as second:
        workload_id = first.commit_workload("matmul_16", matmul_module())
        assert second.commit_workload("matmul_16", matmul_module()) == workload_id
        first_id = add_ok(first, workload_id, 0.2)
        second_id = add_ok(second, workload_id, 0.1, decision_hash=2)
        assert [r.id for r in second.records(workload_id)] == [first_id, second_id]
        assert [r.id for r in first.best(workload_id, TARGET)] == [second_id]


# A process that adds records, printing "id index" once each one is committed.
WRITER = """
    import os
    from probtune.database.database import Database
    db = Database({path!r})
    for index in range({count}):
        trace = f"trace {{index}}"
        record_id = db.add_record({workload_id}, "t", trace, index, "ok", [index + 1.0])
        print(record_id, index, flush=True)
    {at_end}
"""


def test_records_survive_writer_exiting_without_close(
    db_path: Path, run_python: StartPython
) -> None:
    with Database(db_path) as db:
        workload_id = db.commit_workload("matmul_16", matmul_module())
    code = WRITER.format(path=str(db_path), count=40, workload_id=workload_id, at_end="os._exit(0)")
    writer = run_python(code)
    stdout, stderr = writer.communicate(timeout=120)
    assert writer.returncode == 0, stderr
    written = [tuple(map(int, line.split())) for line in stdout.splitlines()]
    assert len(written) == 40

    with Database(db_path) as db:
        for record_id, index in written:
            record = db.record(record_id)
            assert (record.trace_json, record.decision_hash) == (f"trace {index}", index)
        assert db.count(workload_id, "t") == 40


def test_records_survive_writer_killed_mid_way(db_path: Path, run_python: StartPython) -> None:
    with Database(db_path) as db:
        workload_id = db.commit_workload("matmul_16", matmul_module())
    code = WRITER.format(path=str(db_path), count=100_000, workload_id=workload_id, at_end="")
    writer = run_python(code)
    written = []
    while len(written) < 50:
        line = writer.stdout.readline()
        assert line, writer.stderr.read()
        written.append(tuple(map(int, line.split())))
    writer.send_signal(signal.SIGKILL)
    writer.communicate()
    assert writer.returncode == -signal.SIGKILL

    with Database(db_path) as db:
        for record_id, index in written:
            record = db.record(record_id)
            assert (record.trace_json, record.decision_hash) == (f"trace {index}", index)
        assert db.count(workload_id) >= len(written)
        assert db.seen_decision_hashes(workload_id, "t") >= {index for _, index in written}
        next_id = db.add_record(workload_id, "t", "after the kill", 2**40, "timeout")
        assert db.record(next_id).trace_json == "after the kill"
    with sqlite3.connect(db_path) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    connection.close()


# A process that, in each round, waits until every racer is ready and then opens
# the round's new file at the same moment as the others, commits the same workload
# and adds records. It prints the workload id it got in each round.
RACER = """
    import os
    import time
    import tvm
    from tvm import te
    from probtune.database.database import Database
    a = te.placeholder((16, 16), name="A")
    b = te.placeholder((16, 16), name="B")
    r = te.reduce_axis((0, 16), name="k")
    c = te.compute((16, 16), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    mod = tvm.IRModule({{"main": te.create_prim_func([a, b, c])}})
    for round in range({rounds}):
        open(os.path.join({folder!r}, f"ready-{{round}}-{{os.getpid()}}"), "w").close()
        deadline = time.monotonic() + 60
        while sum(f.startswith(f"ready-{{round}}-") for f in os.listdir({folder!r})) < {racers}:
            if time.monotonic() > deadline:
                raise SystemExit("the other racers never got ready")
        with Database(os.path.join({folder!r}, f"round-{{round}}.db")) as db:
            workload_id = db.commit_workload("matmul_16", mod)
            for index in range({count}):
                db.add_record(workload_id, "t", "[]", index, "ok", [1.0])
        print(workload_id, flush=True)
"""


def test_processes_creating_one_file_at_once_share_it(
    tmp_path: Path, run_python: StartPython
) -> None:
    racers, rounds, count = 2, 20, 5
    code = RACER.format(folder=str(tmp_path), racers=racers, rounds=rounds, count=count)
    processes = [run_python(code) for _ in range(racers)]
    workload_ids_by_round: list[set[int]] = [set() for _ in range(rounds)]
    for process in processes:
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
        for round_ids, workload_id in zip(workload_ids_by_round, stdout.split(), strict=True):
            round_ids.add(int(workload_id))
    for round, round_ids in enumerate(workload_ids_by_round):
        with Database(tmp_path / f"round-{round}.db") as db:
            assert [w.id for w in db.workloads()] == list(round_ids)
            assert db.count() == racers * count


# ------------------------------------------------------------ files that are not ours


def test_file_that_is_not_sqlite_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    content = b"these are not the tuning records you are looking for\n" * 20
    path.write_bytes(content)
    with pytest.raises(DatabaseError, match="not an SQLite file") as caught:
        Database(path)
    assert str(path) in str(caught.value)
    assert path.read_bytes() == content


def test_unopenable_path_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "missing-folder" / "tune.db"
    with pytest.raises(DatabaseError, match="cannot open") as caught:
        Database(path)
    assert str(path) in str(caught.value)


def make_sqlite_file(path: Path, *statements: str) -> bytes:
    connection = sqlite3.connect(path)
    for statement in statements:
        connection.execute(statement)
    connection.commit()
    connection.close()
    return path.read_bytes()


@pytest.mark.parametrize(
    ("statements", "found"),
    [
        (["CREATE TABLE people (name TEXT)", "INSERT INTO people VALUES ('ada')"], "none"),
        (
            [
                "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
                "INSERT INTO meta VALUES ('schema_version', '2'), ('created_by', 'probtune')",
            ],
            "2",
        ),
        (["CREATE TABLE meta (version INTEGER)", "INSERT INTO meta VALUES (1)"], "none"),
    ],
    ids=["foreign_schema", "other_version", "foreign_meta_table"],
)
def test_sqlite_file_of_another_schema_is_refused_untouched(
    tmp_path: Path, statements: list[str], found: str
) -> None:
    path = tmp_path / "other.db"
    content = make_sqlite_file(path, *statements)
    with pytest.raises(SchemaVersionError) as caught:
        Database(path)
    message = str(caught.value)
    assert str(path) in message
    assert f"schema version {found}" in message
    assert f"reads schema version {SCHEMA_VERSION}" in message
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


# ------------------------------------------------------------------------ workloads


def test_commit_workload_is_idempotent(db: Database) -> None:
    first = db.commit_workload("matmul_16", matmul_module())
    again = db.commit_workload("matmul_16 rebuilt", matmul_module())
    other = db.commit_workload("matmul_32", matmul_module(32, 16, 16))
    assert first == again
    assert other != first
    assert [w.id for w in db.workloads()] == [first, other]
    assert db.find_workload(matmul_module()).id == first
    assert db.find_workload(matmul_module(16, 16, 8)) is None


def test_equal_hash_with_different_program_is_not_merged(db: Database, db_path: Path) -> None:
    """A forged hash collision: same structural_hash text, different program."""
    mod = matmul_module()
    impostor = matmul_module(8, 8, 8)
    with sqlite3.connect(db_path) as connection:
        connection.execute(
            "INSERT INTO workloads (key, structural_hash, program_json) VALUES (?, ?, ?)",
            ("impostor", f"{tvm_ffi.structural_hash(mod):016x}", tvm.ir.save_json(impostor)),
        )
    connection.close()
    impostor_id = db.workloads()[0].id
    workload_id = db.commit_workload("matmul_16", mod)
    assert workload_id != impostor_id
    assert db.find_workload(mod).id == workload_id


def test_unknown_workload_id(db: Database) -> None:
    with pytest.raises(DatabaseError, match="no workload with id 42"):
        db.workload(42)
    with pytest.raises(DatabaseError, match="no workload with id 42"):
        db.add_record(42, TARGET, "[]", 1, "invalid")
    assert db.count() == 0


# -------------------------------------------------------------------------- records


def test_add_record_validates_its_arguments(db: Database, workload_id: int) -> None:
    with pytest.raises(ValueError, match="unknown record status 'fast'"):
        db.add_record(workload_id, TARGET, "[]", 1, "fast", [0.1])
    with pytest.raises(ValueError, match="at least one latency"):
        db.add_record(workload_id, TARGET, "[]", 1, "ok")
    with pytest.raises(ValueError, match="latency"):
        db.add_record(workload_id, TARGET, "[]", 1, "ok", [float("nan")])
    with pytest.raises(ValueError, match="decision_hash"):
        db.add_record(workload_id, TARGET, "[]", -1, "ok", [0.1])
    with pytest.raises(ValueError, match="program_hash"):
        db.add_record(workload_id, TARGET, "[]", 1, "ok", [0.1], program_hash=2**64)
    with pytest.raises(ValueError, match="unknown record status"):
        db.records(workload_id, status="fast")
    assert db.count() == 0


def test_every_status_is_accepted(db: Database, workload_id: int) -> None:
    for decision_hash, status in enumerate(STATUSES):
        db.add_record(workload_id, TARGET, "[]", decision_hash, status, [0.1])
    assert [r.status for r in db.records(workload_id)] == list(STATUSES)
    assert [r.status for r in db.records(workload_id, status="timeout")] == ["timeout"]
    assert [r.mean_latency is None for r in db.records(workload_id)] == [
        status != "ok" for status in STATUSES
    ]


def test_best_orders_by_mean_latency(db: Database, workload_id: int) -> None:
    slow = add_ok(db, workload_id, 0.30, decision_hash=1)
    fast = db.add_record(workload_id, TARGET, "[]", 2, "ok", [0.05, 0.15])  # mean 0.10
    tie = add_ok(db, workload_id, 0.10, decision_hash=3)
    db.add_record(workload_id, TARGET, "[]", 4, "wrong_result", [0.01])
    db.add_record(workload_id, TARGET, "[]", 5, "timeout")
    elsewhere = add_ok(db, workload_id, 0.01, decision_hash=6, target=OTHER_TARGET)

    assert [r.id for r in db.best(workload_id, TARGET)] == [fast]
    assert [r.id for r in db.best(workload_id, TARGET, k=10)] == [fast, tie, slow]
    assert [r.id for r in db.best(workload_id, OTHER_TARGET, k=3)] == [elsewhere]
    assert db.best(workload_id, "cuda") == []
    with pytest.raises(ValueError, match="k must be at least 1"):
        db.best(workload_id, TARGET, k=0)
    assert [r.id for r in db.records(workload_id, target=OTHER_TARGET)] == [elsewhere]
    assert db.count(workload_id, TARGET) == 5
    assert db.count(target=OTHER_TARGET) == 1


def test_later_timings_join_a_record_and_its_mean(db: Database, workload_id: int) -> None:
    lucky = db.add_record(workload_id, TARGET, "[]", 1, "ok", [0.05, 0.05])
    steady = add_ok(db, workload_id, 0.08, decision_hash=2)
    assert [r.id for r in db.best(workload_id, TARGET)] == [lucky]
    record = db.add_latencies(lucky, [0.11, 0.11, 0.11, 0.11])
    assert record.latencies == (0.05, 0.05, 0.11, 0.11, 0.11, 0.11) and record.mean_latency == pytest.approx(0.09)
    assert [r.id for r in db.best(workload_id, TARGET, k=2)] == [steady, lucky]
    failed = db.add_record(workload_id, TARGET, "[]", 3, "run_error")
    with pytest.raises(ValueError, match="status 'run_error'"):
        db.add_latencies(failed, [0.1])
    with pytest.raises(ValueError, match="latency"):
        db.add_latencies(steady, [-1.0])
    with pytest.raises(ValueError, match="at least one latency"):
        db.add_latencies(steady, [])
    with pytest.raises(DatabaseError, match="no record with id 999"):
        db.add_latencies(999, [0.1])
    assert db.record(steady).latencies == (0.08,)  # the refused updates changed nothing
    assert not db._connection.in_transaction  # a refused update leaves no transaction open


def test_best_per_workload(db: Database, workload_id: int) -> None:
    other_id = db.commit_workload("matmul_32", matmul_module(32, 16, 16))
    add_ok(db, workload_id, 0.3)
    best_here = add_ok(db, workload_id, 0.2, decision_hash=2)
    best_there = add_ok(db, workload_id, 0.5, target=OTHER_TARGET)
    best_other = add_ok(db, other_id, 0.9)
    db.commit_workload("never measured", matmul_module(4, 4, 4))
    db.add_record(other_id, OTHER_TARGET, "[]", 9, "crash")

    pairs = [(w.id, r.target, r.id) for w, r in db.best_per_workload()]
    assert pairs == sorted(
        [
            (workload_id, TARGET, best_here),
            (workload_id, OTHER_TARGET, best_there),
            (other_id, TARGET, best_other),
        ]
    )
    assert [(w.id, r.id) for w, r in db.best_per_workload(OTHER_TARGET)] == [
        (workload_id, best_there)
    ]


def test_seen_hashes(db: Database, workload_id: int) -> None:
    db.add_record(workload_id, TARGET, "[]", 2**64 - 1, "invalid", program_hash=5)
    db.add_record(workload_id, TARGET, "[]", 0, "ok", [0.1])
    db.add_record(workload_id, OTHER_TARGET, "[]", 3, "ok", [0.1], program_hash=6)
    assert db.seen_decision_hashes(workload_id, TARGET) == {2**64 - 1, 0}
    assert db.seen_program_hashes(workload_id, TARGET) == {5}
    assert db.seen_decision_hashes(workload_id, "cuda") == set()


# -------------------------------------------------------------------- malformed rows


def test_malformed_records_are_skipped_with_one_warning(
    db: Database, db_path: Path, workload_id: int
) -> None:
    good_slow = add_ok(db, workload_id, 0.4)
    bad_latencies = insert_raw_record(
        db_path, workload_id, latencies_json='{"not": "a list"}', mean_latency=0.001
    )
    bad_hash = insert_raw_record(db_path, workload_id, decision_hash="xyz", mean_latency=0.002)
    bad_status = insert_raw_record(db_path, workload_id, status="amazing", mean_latency=None)
    no_mean = insert_raw_record(db_path, workload_id, mean_latency=None)
    good_fast = add_ok(db, workload_id, 0.3, decision_hash=2)

    with pytest.warns(UserWarning) as caught:
        records = db.records(workload_id)
    assert [r.id for r in records] == [good_slow, good_fast]
    assert len(caught) == 1 and caught[0].filename == __file__  # the warning points at the call
    message = str(caught[0].message)
    assert str(db_path) in message
    assert f"records row {bad_latencies}: latencies_json is not a JSON list of numbers" in message
    assert f"records row {bad_hash}: decision_hash 'xyz' is not a 16-digit hex string" in message
    assert f"records row {bad_status}: status 'amazing'" in message
    assert f"records row {no_mean}: mean_latency" in message

    with pytest.warns(UserWarning, match=f"records row {bad_latencies}") as caught:
        best = db.best(workload_id, TARGET, k=2)
    assert [r.id for r in best] == [good_fast, good_slow]
    assert len(caught) == 1 and caught[0].filename == __file__

    with pytest.warns(UserWarning, match=f"records row {bad_hash}"):
        pairs = db.best_per_workload()
    assert [(w.id, r.id) for w, r in pairs] == [(workload_id, good_fast)]

    with pytest.warns(UserWarning, match=f"records row {bad_hash}"):
        assert db.seen_decision_hashes(workload_id, TARGET) == {0xAA, 1, 2}

    with pytest.raises(DatabaseRowError, match=f"records row {bad_latencies}: latencies_json"):
        db.record(bad_latencies)
    with pytest.raises(DatabaseRowError, match=f"records row {bad_status}: status 'amazing'"):
        db.record(bad_status)
    assert db.count() == 6  # nothing was deleted


def test_malformed_workload_is_skipped_with_warning(
    db: Database, db_path: Path, workload_id: int
) -> None:
    with sqlite3.connect(db_path) as connection:
        bad_hash = connection.execute(
            "INSERT INTO workloads (key, structural_hash, program_json) "
            "VALUES ('x', 'nothex', '{}')"
        ).lastrowid
        bad_program = connection.execute(
            "INSERT INTO workloads (key, structural_hash, program_json) "
            "VALUES ('y', '0000000000000001', 'not json')"
        ).lastrowid
    connection.close()

    with pytest.warns(UserWarning, match=f"workloads row {bad_hash}: structural_hash"):
        workloads = db.workloads()
    assert [w.id for w in workloads] == [workload_id, bad_program]
    with pytest.raises(DatabaseRowError, match=f"workloads row {bad_hash}"):
        db.workload(bad_hash)
    with pytest.raises(DatabaseRowError, match=f"workloads row {bad_program}: program_json"):
        _ = db.workload(bad_program).mod
    assert tvm_ffi.structural_equal(db.workload(workload_id).mod, matmul_module())


def test_cost_model_state_round_trip_and_replace(db: Database, db_path: Path) -> None:
    assert db.load_cost_model("xgb", "host") is None
    db.save_cost_model("xgb", "host", b"first")
    db.save_cost_model("xgb", "host", b"second")
    db.save_cost_model("xgb", "x86-avx2", b"other target")
    with Database(db_path) as again:
        assert again.load_cost_model("xgb", "host") == b"second"
        assert again.load_cost_model("xgb", "x86-avx2") == b"other target"
        assert again.load_cost_model("random", "host") is None
    with pytest.raises(TypeError, match="must be bytes"):
        db.save_cost_model("xgb", "host", "text")  # type: ignore[arg-type]


def test_file_without_cost_model_table_gains_it_and_keeps_its_records(
    db: Database, db_path: Path, workload_id: int
) -> None:
    db.add_record(workload_id, "host", "[]", 1, "ok", [1e-3])
    db.close()
    with sqlite3.connect(db_path) as raw:  # as written by the first release of schema 1
        raw.execute("DROP TABLE cost_models")
    with Database(db_path) as again:
        assert again.count(workload_id) == 1
        again.save_cost_model("xgb", "host", b"state")
        assert again.load_cost_model("xgb", "host") == b"state"


def test_malformed_cost_model_row_is_named(db: Database, db_path: Path) -> None:
    with sqlite3.connect(db_path) as raw:
        raw.execute("INSERT INTO cost_models (name, target, state) VALUES ('xgb', 'host', 'not bytes')")
    with pytest.raises(DatabaseRowError, match=r"cost_models row \('xgb', 'host'\)"):
        db.load_cost_model("xgb", "host")


# ----------------------------------------------------------------- where records were measured

HOST = {"kind": "llvm", "mcpu": "znver4"}


def test_records_are_kept_under_the_target_and_the_device_they_were_measured_on(db: Database) -> None:
    key = db.measured_on(MeasureKey("host", "AMD EPYC 9R14"), HOST).text
    assert key == "host@AMD EPYC 9R14" and db.measured_on(MeasureKey("host", "AMD EPYC 9R14"), HOST).text == key
    other_machine = db.measured_on(MeasureKey("host", "Intel Xeon 8375C"), {"kind": "llvm", "mcpu": "skylake-avx512"}).text
    assert other_machine == "host@Intel Xeon 8375C"
    # the same name and device with another TVM target: a key of its own, never the same records
    changed = db.measured_on(MeasureKey("host", "AMD EPYC 9R14"), {"kind": "llvm", "mcpu": "znver3"}).text
    assert changed.startswith("host@AMD EPYC 9R14#") and changed != key
    assert [(m.key.text, m.device) for m in db.measurements("host")] == sorted(
        [(key, "AMD EPYC 9R14"), (other_machine, "Intel Xeon 8375C"), (changed, "AMD EPYC 9R14")]
    )
    assert db.measurements("host")[0].tvm_target in (HOST, {"kind": "llvm", "mcpu": "znver3"})


def test_records_made_before_devices_were_kept_keep_their_key(db_path: Path, db: Database, workload_id: int) -> None:
    add_ok(db, workload_id, 0.5, target="host")  # as a database of the first schema holds them
    db.close()
    with Database(db_path) as again:
        [older] = again.measurements("host")
        assert (older.key.text, older.tvm_target, older.device) == ("host", None, None)
        assert again.best(workload_id, "host")[0].mean_latency == 0.5


def _database_with(path: Path, device: str, latencies: list[float]) -> str:
    with Database(path) as db:
        workload = db.commit_workload("matmul_16", matmul_module())
        key = db.measured_on(MeasureKey("host", device), HOST).text
        for index, latency in enumerate(latencies):
            add_ok(db, workload, latency, decision_hash=index + 1, target=key)
        db.save_cost_model("xgb", key, b"state of " + device.encode())
    return key


def test_a_database_from_another_machine_merges_without_mixing_timings(tmp_path: Path) -> None:
    here = _database_with(tmp_path / "here.db", "AMD EPYC", [0.5, 0.6])
    there = _database_with(tmp_path / "there.db", "Intel Xeon", [0.1, 0.2, 0.3])
    with Database(tmp_path / "here.db") as db:
        added = db.merge_from(tmp_path / "there.db")
        assert added == {"workloads": 0, "keys": 1, "records": 3, "cost_models": 1}
        [workload] = db.workloads()  # the same program: one workload
        assert db.best(workload.id, here)[0].mean_latency == 0.5  # this machine's best is still its own
        assert db.best(workload.id, there)[0].mean_latency == 0.1
        assert db.load_cost_model("xgb", there) == b"state of Intel Xeon"
        assert db.merge_from(tmp_path / "there.db") == {"workloads": 0, "keys": 0, "records": 0, "cost_models": 0}


def test_an_export_takes_one_device_and_a_conflicting_key_merges_nothing(tmp_path: Path) -> None:
    _database_with(tmp_path / "a.db", "AMD EPYC", [0.5])
    there = _database_with(tmp_path / "b.db", "Intel Xeon", [0.1])
    with Database(tmp_path / "a.db") as db:
        db.merge_from(tmp_path / "b.db")
    with Database(tmp_path / "out.db") as out:
        assert out.merge_from(tmp_path / "a.db", device="Intel Xeon")["records"] == 1
        assert [m.key.text for m in out.measurements()] == [there]
    with sqlite3.connect(tmp_path / "b.db") as raw:  # the same key, claimed for another device
        raw.execute("UPDATE measured_on SET device = 'Intel Xeon (renamed)'")
    raw.close()
    with Database(tmp_path / "a.db") as db, pytest.raises(DatabaseError, match=r"both hold key 'host@Intel Xeon'"):
        before = db.count()
        db.merge_from(tmp_path / "b.db")
    with Database(tmp_path / "a.db") as db:
        assert db.count() == before
