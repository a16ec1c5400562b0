"""The tuning database: workloads and every measured candidate, in one SQLite file.

Each record is committed the moment it is added, so a killed tuning run loses
nothing it had measured (with synchronous=NORMAL only a power cut can lose the
last few commits), and a later or concurrent run, in any process, continues from
everything recorded so far. Rows are never deleted or rewritten; a row that does
not parse is skipped by listings with a warning. The one exception is the
saved state of a cost model, which each save replaces.
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import re
import sqlite3
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import tvm
import tvm_ffi

from probtune.database.measure_key import MeasureKey
from probtune.errors import DatabaseError, DatabaseRowError, SchemaVersionError, warn_caller
from probtune.measure.results import MeasureStatus

__all__ = [
    "SCHEMA_VERSION",
    "STATUSES",
    "Database",
    "MeasuredOn",
    "Record",
    "WorkloadRow",
]

SCHEMA_VERSION = 1

STATUSES: tuple[str, ...] = tuple(status.value for status in MeasureStatus)
"""Outcomes of a candidate, as records hold them."""

_CREATED_BY = "probtune"
_BUSY_TIMEOUT_SECONDS = 30.0
_WAL_RETRY_SECONDS = 0.01
_U64_LIMIT = 1 << 64
_HEX_HASH = re.compile(r"[0-9a-fA-F]{16}")
_Row = TypeVar("_Row", "WorkloadRow", "Record")

# Added after schema version 1 was released: created on open when missing (older
# files gain it; nothing in them changes), and ignored by readers that predate it.
_COST_MODELS_TABLE = """CREATE TABLE IF NOT EXISTS cost_models (
        name TEXT NOT NULL,
        target TEXT NOT NULL,
        state BLOB NOT NULL,
        updated REAL,
        PRIMARY KEY (name, target)
    )"""

# Where records were measured: records.target and cost_models.target hold a key of this table, the target's
# name and the device (a CPU's model, rpc:KEY), so that records of one target from two machines never mix. Added
# like cost_models; records made before it keep the target's name as their key, with no TVM target or device.
_MEASURED_ON_TABLE = """CREATE TABLE IF NOT EXISTS measured_on (
        key TEXT PRIMARY KEY,
        target TEXT NOT NULL,
        tvm_target TEXT,
        device TEXT,
        created REAL
    )"""

_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE workloads (
        id INTEGER PRIMARY KEY,
        key TEXT NOT NULL,
        structural_hash TEXT NOT NULL,
        program_json TEXT NOT NULL,
        created REAL
    )""",
    "CREATE INDEX workloads_by_hash ON workloads (structural_hash)",
    """CREATE TABLE records (
        id INTEGER PRIMARY KEY,
        workload_id INTEGER NOT NULL REFERENCES workloads (id),
        target TEXT NOT NULL,
        trace_json TEXT NOT NULL,
        decision_hash TEXT NOT NULL,
        program_hash TEXT,
        status TEXT NOT NULL,
        latencies_json TEXT NOT NULL,
        mean_latency REAL,
        error TEXT,
        build_seconds REAL,
        run_seconds REAL,
        created REAL
    )""",
    "CREATE INDEX records_by_target ON records (workload_id, target)",
    "CREATE INDEX records_by_latency ON records (workload_id, target, mean_latency)",
    "CREATE INDEX records_by_decision ON records (workload_id, target, decision_hash)",
    _COST_MODELS_TABLE,
)

# NULLs and non-numbers sort last so that malformed "ok" rows never hide good ones.
_BY_LATENCY = "ORDER BY mean_latency NULLS LAST, id"


@dataclass(frozen=True)
class MeasuredOn:
    """A key records are kept under, with the TVM target and the device it was registered for.

    ``tvm_target`` and ``device`` are None for records made before they were
    kept; ``device`` is the one registered (the key's own, unless the row was edited).
    """

    key: MeasureKey
    tvm_target: dict[str, Any] | None
    device: str | None

    @property
    def target(self) -> str:
        """The target's name with its timing mode (``TARGET+cold-llc`` for cold timings), as the table keeps it."""
        return self.key.timed_target


@dataclass(frozen=True)
class WorkloadRow:
    """A tuned program; its TVM module is only deserialized when first asked for."""

    id: int
    key: str
    structural_hash: int
    created: float | None
    program_json: str = field(repr=False)

    @cached_property
    def mod(self) -> tvm.IRModule:
        """The program as a TVM module (deserialized once, on first use)."""
        try:
            mod = tvm.ir.load_json(self.program_json)
        except Exception as exc:  # TVM raises various errors for bad JSON
            raise DatabaseRowError(
                f"workloads row {self.id}: program_json does not load as a TVM module ({exc})"
            ) from exc
        if not isinstance(mod, tvm.IRModule):
            raise DatabaseRowError(
                f"workloads row {self.id}: program_json holds a {type(mod).__name__}, "
                "not an IRModule"
            )
        return mod


@dataclass(frozen=True)
class Record:
    """One candidate program tried on one workload and target, and its outcome."""

    id: int
    workload_id: int
    target: str
    trace_json: str
    decision_hash: int
    program_hash: int | None
    status: str
    latencies: tuple[float, ...]
    mean_latency: float | None
    error: str | None
    build_seconds: float | None
    run_seconds: float | None
    created: float | None


class Database:
    """A probtune tuning database in one SQLite file (WAL mode, one connection).

    Several Database objects, in one process or many, may use the same file at
    once: SQLite serializes the writers, and each waits up to 30 s for a lock.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)
        self._connection: sqlite3.Connection | None = None
        try:
            connection = sqlite3.connect(
                self._path, timeout=_BUSY_TIMEOUT_SECONDS, isolation_level=None
            )
        except sqlite3.Error as exc:
            raise DatabaseError(f"cannot open {self._path}: {exc}") from exc
        connection.row_factory = sqlite3.Row
        self._connection = connection
        try:
            self._open_schema()
        except BaseException:
            self.close()
            raise

    @property
    def path(self) -> Path:
        return self._path

    def close(self) -> None:
        """Close the connection; committed records are already on disk. Idempotent."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Database({str(self._path)!r})"

    # ----------------------------------------------------------------- workloads

    def commit_workload(self, key: str, mod: tvm.IRModule) -> int:
        """Return the id of the workload structurally equal to `mod`, adding it if new.

        Equal hashes are confirmed with structural equality, so a hash collision
        never merges two different programs.
        """
        if not isinstance(mod, tvm.IRModule):
            raise TypeError(f"commit_workload needs a tvm.IRModule, got {type(mod).__name__}")
        hash_text = _hash_to_text(tvm_ffi.structural_hash(mod), "structural_hash")
        program_json = tvm.ir.save_json(mod)
        # The write lock comes first, so two processes committing the same
        # program cannot both miss it and insert it twice.
        with self._write_transaction():
            existing = self._find_workload(mod, hash_text)
            if existing is not None:
                workload_id = existing.id
            else:
                cursor = self._execute(
                    "INSERT INTO workloads (key, structural_hash, program_json, created) "
                    "VALUES (?, ?, ?, ?)",
                    (key, hash_text, program_json, time.time()),
                )
                workload_id = _inserted_id(cursor)
        return workload_id

    def find_workload(self, mod: tvm.IRModule) -> WorkloadRow | None:
        """The stored workload structurally equal to `mod`, or None."""
        return self._find_workload(
            mod, _hash_to_text(tvm_ffi.structural_hash(mod), "structural_hash")
        )

    def workload(self, workload_id: int) -> WorkloadRow:
        """The workload with this id; DatabaseRowError if its row does not parse."""
        rows = self._query("SELECT * FROM workloads WHERE id = ?", (workload_id,))
        if not rows:
            raise DatabaseError(f"{self._path} has no workload with id {workload_id}")
        return _parse_workload(rows[0])

    def workloads(self) -> list[WorkloadRow]:
        """All workloads by id, skipping (with one warning) rows that do not parse."""
        workloads, problems = _parse_rows(
            self._query("SELECT * FROM workloads ORDER BY id"), _parse_workload
        )
        self._warn_skipped(problems)
        return workloads

    # ------------------------------------------------------------------- records

    def add_record(
        self,
        workload_id: int,
        target: str | MeasureKey,
        trace_json: str,
        decision_hash: int,
        status: str,
        latencies: Sequence[float] = (),
        error: str | None = None,
        program_hash: int | None = None,
        build_seconds: float | None = None,
        run_seconds: float | None = None,
    ) -> int:
        """Store one outcome under ``target`` (a :class:`MeasureKey` or its text) and commit it at once, so a crash
        right after keeps it."""
        _check_status(status)
        target = _key_text(target)
        if not isinstance(target, str) or not target:
            raise ValueError(f"target must be a non-empty string, got {target!r}")
        if not isinstance(trace_json, str):
            raise TypeError(f"trace_json must be a string, got {type(trace_json).__name__}")
        latency_values = [_check_latency(value) for value in latencies]
        if status == "ok" and not latency_values:
            raise ValueError('a record with status "ok" needs at least one latency')
        mean_latency = statistics.fmean(latency_values) if status == "ok" else None
        row = (
            workload_id,
            target,
            trace_json,
            _hash_to_text(decision_hash, "decision_hash"),
            None if program_hash is None else _hash_to_text(program_hash, "program_hash"),
            status,
            json.dumps(latency_values),
            mean_latency,
            error,
            _optional_number(build_seconds, "build_seconds"),
            _optional_number(run_seconds, "run_seconds"),
            time.time(),
        )
        try:
            cursor = self._connection_or_raise().execute(
                "INSERT INTO records (workload_id, target, trace_json, decision_hash, "
                "program_hash, status, latencies_json, mean_latency, error, build_seconds, "
                "run_seconds, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )
        except sqlite3.IntegrityError as exc:  # the only constraint we do not check first
            raise DatabaseError(
                f"{self._path} has no workload with id {workload_id}; "
                "add it with commit_workload first"
            ) from exc
        except sqlite3.Error as exc:
            raise self._wrapped(exc) from exc
        return _inserted_id(cursor)

    def add_latencies(self, record_id: int, latencies: Sequence[float]) -> Record:
        """Append later timings to an "ok" record (a confirmation pass); its mean then covers them all."""
        values = [_check_latency(value) for value in latencies]
        if not values:
            raise ValueError("add_latencies needs at least one latency")
        with self._write_transaction():  # read and write under one lock: another process may add too
            record = self.record(record_id)
            if record.status != "ok":
                raise ValueError(f"record {record_id} has status {record.status!r}; only an ok record is timed again")
            merged = [*record.latencies, *values]
            self._execute(
                "UPDATE records SET latencies_json = ?, mean_latency = ? WHERE id = ?",
                (json.dumps(merged), statistics.fmean(merged), record_id),
            )
        return self.record(record_id)

    def record(self, record_id: int) -> Record:
        """The record with this id; DatabaseRowError if its row does not parse."""
        rows = self._query("SELECT * FROM records WHERE id = ?", (record_id,))
        if not rows:
            raise DatabaseError(f"{self._path} has no record with id {record_id}")
        return _parse_record(rows[0])

    def records(
        self, workload_id: int, target: str | MeasureKey | None = None, status: str | None = None
    ) -> list[Record]:
        """A workload's records by id, optionally of one target and/or one status."""
        sql = "SELECT * FROM records WHERE workload_id = ?"
        params: list[Any] = [workload_id]
        if target is not None:
            sql += " AND target = ?"
            params.append(_key_text(target))
        if status is not None:
            _check_status(status)
            sql += " AND status = ?"
            params.append(status)
        records, problems = _parse_rows(self._query(sql + " ORDER BY id", params), _parse_record)
        self._warn_skipped(problems)
        return records

    def best(self, workload_id: int, target: str | MeasureKey, k: int = 1) -> list[Record]:
        """Up to k fastest "ok" records of a workload under a key, fastest first."""
        best, problems = self._best(workload_id, _key_text(target), k)
        self._warn_skipped(problems)
        return best

    def best_per_workload(self, target: str | MeasureKey | None = None) -> list[tuple[WorkloadRow, Record]]:
        """The fastest "ok" record of each (workload, target) pair, by workload id and target."""
        sql = "SELECT DISTINCT workload_id, target FROM records WHERE status = 'ok'"
        params: tuple[Any, ...] = ()
        if target is not None:
            sql += " AND target = ?"
            params = (_key_text(target),)
        pairs = self._query(sql + " ORDER BY workload_id, target", params)
        workloads, problems = _parse_rows(
            self._query("SELECT * FROM workloads ORDER BY id"), _parse_workload
        )
        workloads_by_id = {workload.id: workload for workload in workloads}
        result = []
        for workload_id, pair_target in pairs:
            workload = workloads_by_id.get(workload_id)
            if workload is None:  # its row did not parse (already reported)
                continue
            best, pair_problems = self._best(workload_id, pair_target, 1)
            problems += pair_problems
            if best:
                result.append((workload, best[0]))
        self._warn_skipped(problems)
        return result

    def seen_decision_hashes(self, workload_id: int, target: str | MeasureKey) -> set[int]:
        """Decision hashes already tried on a workload under a key, whatever their outcome."""
        return self._seen_hashes("decision_hash", workload_id, _key_text(target))

    def seen_program_hashes(self, workload_id: int, target: str | MeasureKey) -> set[int]:
        """Program hashes already tried on a workload under a key, whatever their outcome."""
        return self._seen_hashes("program_hash", workload_id, _key_text(target))

    def count(self, workload_id: int | None = None, target: str | MeasureKey | None = None) -> int:
        """How many record rows there are (malformed ones included), optionally filtered."""
        conditions: list[str] = []
        params: list[Any] = []
        if workload_id is not None:
            conditions.append("workload_id = ?")
            params.append(workload_id)
        if target is not None:
            conditions.append("target = ?")
            params.append(_key_text(target))
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        return self._query(f"SELECT COUNT(*) FROM records{where}", params)[0][0]

    # --------------------------------------------------------------- cost models

    def save_cost_model(self, name: str, target: str | MeasureKey, state: bytes) -> None:
        """Store a cost model's state (``CostModel.save()``) under a key, replacing the previous one."""
        target = _key_text(target)
        if not isinstance(state, bytes):
            raise TypeError(f"a cost model's state must be bytes, got {type(state).__name__}")
        self._execute(
            "INSERT OR REPLACE INTO cost_models (name, target, state, updated) VALUES (?, ?, ?, ?)",
            (name, target, state, time.time()),
        )

    def load_cost_model(self, name: str, target: str | MeasureKey) -> bytes | None:
        """The state last saved for this cost model under a key, or None."""
        target = _key_text(target)
        rows = self._query(
            "SELECT state FROM cost_models WHERE name = ? AND target = ?", (name, target)
        )
        if not rows:
            return None
        state = rows[0][0]
        if not isinstance(state, bytes):
            raise DatabaseRowError(
                f"{self._path}: cost_models row ({name!r}, {target!r}) holds "
                f"{type(state).__name__}, not the bytes of a saved model"
            )
        return state

    # -------------------------------------------------------------- measured on

    def measured_on(self, key: MeasureKey, tvm_target: dict[str, Any]) -> MeasureKey:
        """``key`` (a target's name, a device, a timing mode) for records measured with ``tvm_target``; registered if new.

        Where that key was registered with another TVM target, a digest of this
        one is added to it, so that the two never mix.
        """
        text = json.dumps(tvm_target, sort_keys=True)
        with self._write_transaction():
            known = self._query("SELECT tvm_target FROM measured_on WHERE key = ?", (key.text,))
            if known and known[0]["tvm_target"] != text:
                key = key.with_digest_of(text)
                known = self._query("SELECT tvm_target FROM measured_on WHERE key = ?", (key.text,))
            if not known:
                self._execute(
                    "INSERT INTO measured_on (key, target, tvm_target, device, created) VALUES (?, ?, ?, ?, ?)",
                    (key.text, key.timed_target, text, key.device, time.time()),
                )
        return key

    def measurements(self, target: str | None = None) -> list[MeasuredOn]:
        """The keys records are kept under, optionally only those of one target's name, by key."""
        sql, params = "SELECT * FROM measured_on", []
        if target is not None:
            sql, params = sql + " WHERE target = ?", [target]
        return [_parse_measured_on(row) for row in self._query(sql + " ORDER BY key", params)]

    def record_counts(self) -> dict[str, tuple[int, int]]:
        """Records by key: (all of them, those with status "ok")."""
        rows = self._query("SELECT target, COUNT(*) AS n, SUM(status = 'ok') AS ok FROM records GROUP BY target")
        return {row["target"]: (int(row["n"]), int(row["ok"] or 0)) for row in rows}

    # ---------------------------------------------------------------- merging

    def merge_from(self, source: str | os.PathLike[str], *, target: str | None = None,
                   device: str | None = None) -> dict[str, int]:
        """Copy what ``source`` (another probtune database) holds into this one; what is here already is kept.

        Only records of ``target`` (a name) and ``device``, where given. Workloads
        are matched by structural equality, keys by name: a key that both hold
        for different TVM targets or devices is an error, and nothing is copied.
        A record already here (same workload, key, decision and time) is not
        copied twice. Returns how many workloads, keys, records and cost-model
        states were added.
        """
        with Database(source) as other:  # registers the keys of its older records
            wanted = [m for m in other.measurements(target) if device is None or m.device == device]
            workloads = other.workloads()
        keys = {m.key.text: m for m in wanted}
        for mine in self.measurements():
            theirs = keys.get(mine.key.text)
            if theirs is not None and (theirs.tvm_target, theirs.device) != (mine.tvm_target, mine.device):
                raise DatabaseError(f"{source} and {self._path} both hold key {mine.key.text!r}, for different targets or "
                                    f"devices ({theirs.device!r} against {mine.device!r}): nothing was merged")
        ids = {workload.id: self.commit_workload(workload.key, workload.mod) for workload in workloads}
        counts = {"workloads": len(self.workloads()), "keys": len(self.measurements())}
        before = self.count()
        self._execute("ATTACH DATABASE ? AS source", (str(Path(source)),))
        try:
            with self._write_transaction():
                self._copy_from_source(keys, ids)
            states = self._execute(
                "INSERT OR IGNORE INTO cost_models SELECT * FROM source.cost_models WHERE target IN "
                f"({','.join('?' * len(keys))})", list(keys),
            ).rowcount if keys else 0
        finally:
            self._execute("DETACH DATABASE source")
        return {
            "workloads": len(self.workloads()) - counts["workloads"],
            "keys": len(self.measurements()) - counts["keys"],
            "records": self.count() - before,
            "cost_models": max(states, 0),
        }

    def _copy_from_source(self, keys: dict[str, MeasuredOn], ids: dict[int, int]) -> None:
        """Within a transaction, with ``source`` attached: its keys' rows, then their records not already here."""
        for key in keys:
            self._execute(
                "INSERT OR IGNORE INTO measured_on (key, target, tvm_target, device, created) "
                "SELECT key, target, tvm_target, device, created FROM source.measured_on WHERE key = ?", (key,)
            )
        columns = ("target, trace_json, decision_hash, program_hash, status, latencies_json, mean_latency, error, "
                   "build_seconds, run_seconds, created")
        for source_id, own_id in ids.items():
            for key in keys:
                self._execute(
                    f"INSERT INTO records (workload_id, {columns}) SELECT ?, {columns} FROM source.records AS s "
                    "WHERE s.workload_id = ? AND s.target = ? AND NOT EXISTS (SELECT 1 FROM records AS r WHERE "
                    "r.workload_id = ? AND r.target = s.target AND r.decision_hash = s.decision_hash "
                    "AND r.created IS s.created) ORDER BY s.id",
                    (own_id, source_id, key, own_id),
                )

    # ------------------------------------------------------------------ internals

    def _register_older_keys(self) -> None:
        """Give the keys of records made before devices were kept (a target's name alone) their row."""
        self._execute(
            "INSERT OR IGNORE INTO measured_on (key, target) "
            "SELECT DISTINCT target, target FROM records WHERE target NOT IN (SELECT key FROM measured_on)"
        )

    def _open_schema(self) -> None:
        """Create the schema in a fresh file, or check that an existing file is ours."""
        try:
            tables = self._table_names()
        except sqlite3.DatabaseError as exc:
            if _has_error_code(exc, sqlite3.SQLITE_NOTADB, "file is not a database"):
                raise DatabaseError(
                    f"{self._path} is not a probtune database (not an SQLite file)"
                ) from exc
            raise self._wrapped(exc) from exc
        if not tables:
            self._create_schema()
        self._check_schema_version()
        self._enable_wal()
        self._execute(_COST_MODELS_TABLE)
        self._execute(_MEASURED_ON_TABLE)
        self._register_older_keys()
        self._execute("PRAGMA synchronous = NORMAL")
        self._execute("PRAGMA foreign_keys = ON")

    def _enable_wal(self) -> None:
        """Switch to WAL, retrying when processes opening a new file collide.

        When two connections try to upgrade their read locks at the same moment,
        SQLite fails one of them at once, without its busy handler, to avoid a
        deadlock. Once the file is in WAL mode the pragma changes nothing.
        """
        connection = self._connection_or_raise()
        deadline = time.monotonic() + _BUSY_TIMEOUT_SECONDS
        while True:
            try:
                mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as exc:
                locked = _has_error_code(exc, sqlite3.SQLITE_BUSY, "database is locked")
                if not locked or time.monotonic() > deadline:
                    raise self._wrapped(exc) from exc
                time.sleep(_WAL_RETRY_SECONDS)
        if mode.lower() != "wal":
            raise DatabaseError(f"{self._path}: cannot switch to WAL mode (still in {mode!r})")

    def _table_names(self) -> set[str]:
        rows = self._connection_or_raise().execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'"
        )
        return {name for (name,) in rows}

    def _create_schema(self) -> None:
        """Create our tables, unless another process did so while we were looking."""
        with self._write_transaction():
            if not self._table_names():
                for statement in _SCHEMA:
                    self._execute(statement)
                self._execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?), ('created_by', ?)",
                    (str(SCHEMA_VERSION), _CREATED_BY),
                )

    def _check_schema_version(self) -> None:
        """Refuse (without writing anything) a file that another schema wrote."""
        try:
            rows = self._connection_or_raise().execute(
                "SELECT value FROM meta WHERE key = 'schema_version'"
            ).fetchall()
        except sqlite3.OperationalError:  # no meta table, or one of another layout
            found = "none (no probtune meta table)"
        else:
            found = str(rows[0][0]) if rows else "none (no schema_version in meta)"
        if found != str(SCHEMA_VERSION):
            raise SchemaVersionError(
                f"{self._path} has database schema version {found}; "
                f"this probtune reads schema version {SCHEMA_VERSION}"
            )

    def _find_workload(self, mod: tvm.IRModule, hash_text: str) -> WorkloadRow | None:
        candidates, problems = _parse_rows(
            self._query(
                "SELECT * FROM workloads WHERE structural_hash = ? ORDER BY id", (hash_text,)
            ),
            _parse_workload,
        )
        match = None
        for candidate in candidates:
            try:
                if tvm_ffi.structural_equal(candidate.mod, mod):
                    match = candidate
                    break
            except DatabaseRowError as exc:
                problems.append(str(exc))
        self._warn_skipped(problems)
        return match

    def _best(self, workload_id: int, target: str, k: int) -> tuple[list[Record], list[str]]:
        """The k best parseable "ok" records, and the problems of rows skipped on the way.

        Asks SQLite for only k rows, and for more only when some of those do not parse.
        """
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        limit = k
        while True:
            rows = self._query(
                "SELECT * FROM records WHERE workload_id = ? AND target = ? AND status = 'ok' "
                f"{_BY_LATENCY} LIMIT ?",
                (workload_id, target, limit),
            )
            records, problems = _parse_rows(rows, _parse_record)
            if len(records) >= k or len(rows) < limit:
                return records[:k], problems
            limit = k + len(problems)

    def _seen_hashes(self, column: str, workload_id: int, target: str) -> set[int]:
        rows = self._query(
            f"SELECT id, {column} FROM records WHERE workload_id = ? AND target = ? "
            f"AND {column} IS NOT NULL ORDER BY id",
            (workload_id, target),
        )
        hashes, problems = set(), []
        for row_id, text in rows:
            try:
                hashes.add(_text_to_hash(text, column))
            except ValueError as exc:
                problems.append(f"records row {row_id}: {exc}")
        self._warn_skipped(problems)
        return hashes

    def _warn_skipped(self, problems: list[str]) -> None:
        """One warning per call for all skipped rows."""
        if problems:
            warn_caller(f"{self._path}: skipped {len(problems)} malformed row(s): " + "; ".join(problems))

    def _connection_or_raise(self) -> sqlite3.Connection:
        if self._connection is None:
            raise DatabaseError(f"database {self._path} is closed")
        return self._connection

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        try:
            return self._connection_or_raise().execute(sql, params)
        except sqlite3.Error as exc:
            raise self._wrapped(exc) from exc

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        try:
            return self._connection_or_raise().execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise self._wrapped(exc) from exc

    @contextlib.contextmanager
    def _write_transaction(self) -> Iterator[None]:
        """A transaction that holds the write lock from its start (BEGIN IMMEDIATE); any error rolls it back."""
        self._execute("BEGIN IMMEDIATE")
        try:
            yield
            self._execute("COMMIT")
        except BaseException:
            self._rollback()
            raise

    def _rollback(self) -> None:
        connection = self._connection
        if connection is not None and connection.in_transaction:
            connection.execute("ROLLBACK")

    def _wrapped(self, exc: sqlite3.Error) -> DatabaseError:
        return DatabaseError(f"{self._path}: {exc}")


# ---------------------------------------------------------------- row parsing


def _inserted_id(cursor: sqlite3.Cursor) -> int:
    """The id of the row an INSERT just added (SQLite always gives one)."""
    if cursor.lastrowid is None:
        raise DatabaseError("SQLite did not report the id of the row it inserted")
    return cursor.lastrowid


def _parse_rows(
    rows: list[sqlite3.Row], parse: Callable[[sqlite3.Row], _Row]
) -> tuple[list[_Row], list[str]]:
    """Parse each row; collect the problems of those that do not parse instead of raising."""
    parsed, problems = [], []
    for row in rows:
        try:
            parsed.append(parse(row))
        except DatabaseRowError as exc:
            problems.append(str(exc))
    return parsed, problems


def _parse_measured_on(row: sqlite3.Row) -> MeasuredOn:
    tvm_target = json.loads(row["tvm_target"]) if row["tvm_target"] is not None else None
    return MeasuredOn(MeasureKey.parse(row["key"], row["target"]), tvm_target, row["device"])


def _parse_workload(row: sqlite3.Row) -> WorkloadRow:
    row_id = row["id"]
    try:
        if not isinstance(row["key"], str):
            raise ValueError("key is not text")
        if not isinstance(row["program_json"], str):
            raise ValueError("program_json is not text")
        return WorkloadRow(
            id=row_id,
            key=row["key"],
            structural_hash=_text_to_hash(row["structural_hash"], "structural_hash"),
            created=_optional_number(row["created"], "created"),
            program_json=row["program_json"],
        )
    except ValueError as exc:
        raise DatabaseRowError(f"workloads row {row_id}: {exc}") from None


def _parse_record(row: sqlite3.Row) -> Record:
    row_id = row["id"]
    try:
        status = row["status"]
        if status not in STATUSES:
            raise ValueError(f"status {status!r} is not one of {', '.join(STATUSES)}")
        for column in ("target", "trace_json"):
            if not isinstance(row[column], str):
                raise ValueError(f"{column} is not text")
        if not isinstance(row["workload_id"], int):
            raise ValueError("workload_id is not an integer")
        error = row["error"]
        if error is not None and not isinstance(error, str):
            raise ValueError("error is neither text nor NULL")
        mean_latency = _optional_number(row["mean_latency"], "mean_latency")
        if (mean_latency is None) == (status == "ok"):
            raise ValueError(f"mean_latency must be set for status 'ok' only, not {status!r}")
        program_hash = row["program_hash"]
        if program_hash is not None:
            program_hash = _text_to_hash(program_hash, "program_hash")
        return Record(
            id=row_id,
            workload_id=row["workload_id"],
            target=row["target"],
            trace_json=row["trace_json"],
            decision_hash=_text_to_hash(row["decision_hash"], "decision_hash"),
            program_hash=program_hash,
            status=status,
            latencies=_parse_latencies(row["latencies_json"]),
            mean_latency=mean_latency,
            error=error,
            build_seconds=_optional_number(row["build_seconds"], "build_seconds"),
            run_seconds=_optional_number(row["run_seconds"], "run_seconds"),
            created=_optional_number(row["created"], "created"),
        )
    except ValueError as exc:
        raise DatabaseRowError(f"records row {row_id}: {exc}") from None


def _parse_latencies(text: Any) -> tuple[float, ...]:
    problem = "latencies_json is not a JSON list of numbers"
    try:
        values = json.loads(text)
    except (TypeError, ValueError):
        raise ValueError(problem) from None
    if not isinstance(values, list) or not all(_is_latency(value) for value in values):
        raise ValueError(problem)
    return tuple(float(value) for value in values)


def _optional_number(value: Any, name: str) -> float | None:
    if value is None:
        return None
    if not _is_number(value):
        raise ValueError(f"{name} is not a finite number ({value!r})")
    return float(value)


def _is_number(value: Any) -> bool:
    """Real and finite; numpy scalars count, bools do not."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _is_latency(value: Any) -> bool:
    return _is_number(value) and value >= 0


# ---------------------------------------------------------------- validation


def _key_text(key: str | MeasureKey) -> str:
    """How a key is stored: a :class:`MeasureKey`'s text, or a key already written as text."""
    return key.text if isinstance(key, MeasureKey) else key


def _check_status(status: str) -> None:
    if status not in STATUSES:
        expected = ", ".join(STATUSES)
        raise ValueError(f"unknown record status {status!r}; expected one of {expected}")


def _check_latency(value: float) -> float:
    if not _is_latency(value):
        raise ValueError(f"a latency must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def _has_error_code(exc: sqlite3.Error, code: int, message: str) -> bool:
    """Python < 3.11 has no sqlite_errorcode; there, SQLite's message tells the code."""
    return getattr(exc, "sqlite_errorcode", None) == code or str(exc) == message


def _hash_to_text(value: int, name: str) -> str:
    """A u64 hash as 16 hex digits: SQLite integers are signed and would overflow."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _U64_LIMIT:
        raise ValueError(f"{name} must be an unsigned 64-bit integer, got {value!r}")
    return f"{value:016x}"


def _text_to_hash(text: Any, name: str) -> int:
    if not isinstance(text, str) or not _HEX_HASH.fullmatch(text):
        raise ValueError(f"{name} {text!r} is not a 16-digit hex string")
    return int(text, 16)
