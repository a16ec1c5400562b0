"""One task's search session: its workload, design space, search strategy, reference outputs and progress.

A session owns what is particular to one task; the measurement pipeline
(:mod:`probtune.measure.pipeline`) that builds, times and records its candidates is
shared by every task of a run. ``tune`` drives one session, ``tune_model``
many, under a task scheduler.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tvm

from probtune._core import Rng, Trace
from probtune.database.database import Database, Record
from probtune.database.measure_key import MeasureKey
from probtune.errors import NOT_REPLAYABLE, TuningConfigError, warn_caller
from probtune.interfaces import CostModel, Mutator, SpaceModule, TargetSpec
from probtune.measure import prepare_reference
from probtune.measure.constant_layouts import MeasuredForm, layout_free_params
from probtune.plugins import get_registry
from probtune.search.search_strategy import INIT_MEASURED, SearchStrategy
from probtune.search.strategies import EVOLUTIONARY, SearchStart, StrategyKind
from probtune.space.design_space import Candidate, DesignSpace
from probtune.space.space_generator import generate_space
from probtune.workloads.workload import Workload

__all__ = ["Replayed", "TaskSession", "best_replayable", "replayable"]

BEST_CANDIDATES = 8  # the best records tried, fastest first, for one whose trace replays


@dataclass
class TaskSession:
    """One task under search: what it proposes next, what it has measured, and its best latency so far.

    What the database holds of it is read under ``key``: where ``target`` is measured, and how.
    """

    workload: Workload
    target: TargetSpec
    key: MeasureKey
    workload_id: int
    space: DesignSpace
    search: SearchStrategy
    form: MeasuredForm  # each candidate's program as timed, and its reference outputs
    best_latency: float | None
    measured: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    exhausted: bool = False  # the space had no new program left to offer
    search_seconds: float = 0.0  # choosing candidates and learning from them

    @classmethod
    def open(
        cls,
        workload: Workload,
        target: TargetSpec,
        key: MeasureKey,
        db: Database,
        model: CostModel | None,
        *,
        workdir: str,
        seed: int = 0,
        modules: Sequence[str | SpaceModule] | None = None,
        search_options: dict[str, Any] | None = None,
        strategy: StrategyKind = EVOLUTIONARY,
    ) -> TaskSession:
        """A session for ``workload``, primed with what ``db`` holds of it (measured programs are not offered again).

        Its search is ``strategy``'s; one that ``uses_cost_model`` is guided by
        ``model`` (one model may serve many sessions: it groups its samples by
        workload). Candidates are timed with the layout copies of
        the parameters the workload marks constant (``layout_free_params``)
        made beforehand (:class:`MeasuredForm`).
        """
        space = generate_space(workload, target, modules=modules, seed=seed)
        workload_id = db.commit_workload(workload.key, workload.mod)
        rng = Rng(seed).fork()
        start = _search_start(strategy, model, search_options or {}, db, workload_id, workload, target, key, space, rng)
        search = strategy.start(start)
        try:
            reference = prepare_reference(workload, workdir, seed=seed)
        except BaseException:
            search.close()
            raise
        best = db.best(workload_id, key)
        form = MeasuredForm(reference, frozenset(layout_free_params(workload.mod["main"])))
        return cls(workload, target, key, workload_id, space, search, form, best[0].mean_latency if best else None)

    @property
    def name(self) -> str:
        return self.workload.key

    def next_batch(self, size: int) -> list[Candidate]:
        """Up to ``size`` new candidates; an empty batch marks the session exhausted."""
        started = time.perf_counter()
        batch = self.search.next_batch(size)
        self.search_seconds += time.perf_counter() - started
        if not batch:
            self.exhausted = True
        return batch

    def record(self, status: str, latency: float | None) -> None:
        """Count one measured candidate; a correct one may be the new best."""
        self.measured += 1
        self.statuses[status] += 1
        if latency is not None and (self.best_latency is None or latency < self.best_latency):
            self.best_latency = latency

    def observe(self, observed: Sequence[tuple[Candidate, float | None]]) -> None:
        started = time.perf_counter()
        self.search.observe(observed)
        self.search_seconds += time.perf_counter() - started

    def best(self, db: Database) -> Replayed | None:
        """The fastest correct record of this task whose trace replays, with its program; or None."""
        return best_replayable(db, self.workload_id, self.key, self.space)

    def close(self) -> None:
        self.search.close()


def _search_start(
    strategy: StrategyKind,
    model: CostModel | None,
    options: dict[str, Any],
    db: Database,
    workload_id: int,
    work: Workload,
    spec: TargetSpec,
    key: MeasureKey,
    space: DesignSpace,
    rng: Rng,
) -> SearchStart:
    """What the search starts from, read from the database under ``key`` (the cost model's state is the caller's).

    The fastest measured traces are replayed only for a strategy a cost model guides.
    """
    measured: list[tuple[Trace, float]] = []
    if strategy.uses_cost_model:
        best = db.best(workload_id, key, k=options.get("init_measured", INIT_MEASURED))
        measured = [
            (replayed.trace, replayed.record.mean_latency)
            for replayed in replayable(best, space, db.path)
            if replayed.record.mean_latency is not None
        ]
    return SearchStart(
        space, rng, work.key, db.seen_decision_hashes(workload_id, key), db.seen_program_hashes(workload_id, key),
        cost_model=model if strategy.uses_cost_model else None, measured=measured, mutators=target_mutators(spec),
        mutator_weights=spec.mutators, options=options,
    )


def target_mutators(spec: TargetSpec) -> list[Mutator]:
    """The registered mutators that ``spec`` names (all of them where it names none); an unknown name is an error."""
    registered = get_registry().mutators
    unknown = sorted(set(spec.mutators) - set(registered))
    if unknown:
        raise TuningConfigError(
            f"target {spec.name!r} names unknown mutator(s) {', '.join(unknown)}; registered: {', '.join(sorted(registered))}"
        )
    return [registered[name] for name in spec.mutators] if spec.mutators else list(registered.values())


@dataclass(frozen=True)
class Replayed:
    """A record whose trace replays into a program the validators accept."""

    record: Record
    trace: Trace
    program: tvm.IRModule


def replayable(records: list[Record], space: DesignSpace, db_path: Path, limit: int | None = None) -> list[Replayed]:
    """The records (up to ``limit`` of them, in order) whose traces parse and replay into a valid program.

    A record that does not (a hand-edited or damaged row, or one from a space
    or validator that has changed since) is left out with a warning that
    names it, and stays in the database as it is: one bad row must not stop
    the tuning of its workload.
    """
    kept: list[Replayed] = []
    left_out: list[tuple[int, Exception]] = []
    for record in records:
        if limit is not None and len(kept) == limit:
            break
        try:
            trace = Trace.from_json(record.trace_json)
            kept.append(Replayed(record, trace, space.program(trace)))
        except NOT_REPLAYABLE as exc:
            left_out.append((record.id, exc))
    if left_out:  # one warning for all: a space that changed since the records were made leaves out many
        ids = ", ".join(str(record_id) for record_id, _ in left_out)
        named = f"record {ids} is" if len(left_out) == 1 else f"records {ids} are"
        first_id, first = left_out[0]
        warn_caller(
            f"{db_path}: {named} left out: the trace is malformed or does not replay into a valid program "
            f"(record {first_id}: {first})"
        )
    return kept


def best_replayable(db: Database, workload_id: int, key: MeasureKey, space: DesignSpace) -> Replayed | None:
    """The fastest correct record under ``key`` whose trace replays into a valid program (among the best few), with it; or None."""
    found = replayable(db.best(workload_id, key, k=BEST_CANDIDATES), space, db.path, limit=1)
    return found[0] if found else None
