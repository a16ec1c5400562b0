"""The tuning loop: sample candidates, build and time them, record every result as it arrives."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import tvm

from probtune._core import Rng, Trace
from probtune.codegen import compile_for
from probtune.database import Database, Record
from probtune.errors import NOT_REPLAYABLE, PluginError, TuningConfigError, warn_caller
from probtune.interfaces import CostModel, SpaceModule, TargetSpec
from probtune.measure import prepare_reference
from probtune.plugins import get_registry
from probtune.search import BATCH_SIZE, INIT_MEASURED, EvolutionarySearch, RandomSearch, SearchStrategy
from probtune.space import Candidate, DesignSpace, generate_space
from probtune.targets import check_runs_here, resolve_target
from probtune.workload import Workload, resolve_workload

__all__ = ["TuneResult", "TrialOutcome", "tune", "compile_best"]

Progress = Callable[["TrialOutcome"], None]


@dataclass(frozen=True)
class TrialOutcome:
    """One measured candidate, as reported to a progress callback."""

    trial: int  # 1-based within this run
    trials: int
    status: str
    latency: float | None
    best_latency: float | None
    error: str | None
    flops: float | None


@dataclass
class TuneResult:
    """What a tuning run found; the best record spans every run recorded in the database."""

    workload: Workload
    target: TargetSpec
    database: Path
    space: DesignSpace
    best: Record | None
    measured: int
    statuses: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    search_seconds: float = 0.0  # choosing candidates and learning from them
    measure_seconds: float = 0.0  # building, timing and recording candidates; the rest of ``seconds`` is setup

    @property
    def best_latency(self) -> float | None:
        """Mean latency in seconds of the fastest correct program."""
        return self.best.mean_latency if self.best else None

    @property
    def best_gflops(self) -> float | None:
        if self.best is None or not self.workload.flops:
            return None
        return self.workload.flops / self.best.mean_latency / 1e9

    @property
    def best_trace(self) -> Trace | None:
        return Trace.from_json(self.best.trace_json) if self.best else None

    @property
    def rejections(self) -> dict[str, int]:
        """Candidates dropped before measurement, by validator."""
        return dict(self.space.rejections)

    def schedule(self) -> tvm.IRModule:
        """The best program (the best trace replayed with its decisions, then finished by the validators)."""
        trace = self.best_trace
        if trace is None:
            raise RuntimeError(f"no correct program of {self.workload.key} was measured on {self.target.name}")
        return self.space.program(trace)

    def build(self) -> Any:
        """The best program compiled for the target: a runnable TVM module (``lib["main"](*tensors)``)."""
        return compile_for(self.schedule(), self.target)


def _factory(kind: str, table: dict[str, Callable[..., Any]], name: str, target: str) -> Callable[..., Any]:
    if name not in table:
        raise PluginError(
            f"target {target!r} uses the {kind} {name!r}, which no installed plugin registers "
            f"(registered {kind}s: {', '.join(sorted(table)) or 'none'}); install a plugin that provides it, "
            f"or tune for a target this machine can measure, such as 'host'"
        )
    return table[name]


def tune(
    workload: str | Workload | tvm.IRModule | tvm.tirx.PrimFunc,
    target: str | TargetSpec = "host",
    trials: int = 64,
    *,
    shape: Sequence[int] | str | None = None,
    dtype: str = "float32",
    database: str | Path | None = None,
    seed: int = 0,
    batch_size: int = BATCH_SIZE,
    strategy: str = "evolutionary",
    cost_model: str | CostModel = "xgb",
    search_options: dict[str, Any] | None = None,
    modules: Sequence[str | SpaceModule] | None = None,
    build_timeout: float = 60.0,
    run_timeout: float = 10.0,
    confirm: int = 4,
    progress: Progress | None = None,
) -> TuneResult:
    """Tune ``workload`` for ``target`` with ``trials`` new measurements, recorded in ``database``.

    ``workload`` is a catalog name (with ``shape``), a :class:`Workload`, or an
    IRModule/PrimFunc. A database that already holds records for this workload
    and target is continued: nothing measured before is measured again, and
    the best record may come from an earlier run.

    ``strategy`` is "evolutionary" (guided by ``cost_model``, a registered
    name or a :class:`CostModel`; its state is kept in the database, so a
    later run, on this workload or another, starts from what it learned;
    ``search_options`` go to :class:`EvolutionarySearch`) or "random".

    At the end, the ``confirm`` best records are timed again, in passes
    over all of them, and the timings join their records: one pass is good
    to about ±20% on a busy machine, and the fastest of hundreds of records
    is the one whose pass was luckiest. If a record timed once then leads,
    the new best ones are timed again too, until the best is a record timed
    again. ``confirm=0`` skips it.
    """
    if not isinstance(trials, int) or trials <= 0:
        raise TuningConfigError(f"trials must be a positive integer, got {trials!r}")
    if batch_size <= 0:
        raise TuningConfigError(f"batch_size must be positive, got {batch_size!r}")
    if not isinstance(confirm, int) or confirm < 0:
        raise TuningConfigError(f"confirm must be a non-negative integer, got {confirm!r}")
    if strategy not in _STRATEGIES:
        raise TuningConfigError(f"unknown search strategy {strategy!r}; choose one of {', '.join(_STRATEGIES)}")
    spec = resolve_target(target)
    registry = get_registry()
    work = resolve_workload(workload, shape, dtype, registry.workloads)
    builder_factory = _factory("builder", registry.builders, spec.builder, spec.name)
    runner_factory = _factory("runner", registry.runners, spec.runner, spec.name)
    if spec.runner == "local":
        check_runs_here(spec)
    model = _cost_model(cost_model, registry.cost_models, seed) if strategy == "evolutionary" else None

    started = time.perf_counter()
    rng = Rng(seed)
    space = generate_space(work, spec, modules=modules, seed=seed)
    with contextlib.ExitStack() as stack:
        scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="probtune-"))
        db_path = Path(database) if database is not None else Path(scratch) / "tuning.db"
        with Database(db_path) as db:
            workload_id = db.commit_workload(work.key, work.mod)
            builder = stack.enter_context(builder_factory(timeout=build_timeout))
            runner = stack.enter_context(runner_factory(timeout=run_timeout))
            # the builder's workers, idle while the search runs, realize candidates for it
            search_options = {"realize_helpers": getattr(builder, "lend_workers", None), **(search_options or {})}
            search = _make_search(model, search_options, db, workload_id, work, spec, space, rng.fork())
            stack.callback(search.close)
            reference = prepare_reference(work, scratch, seed=seed)
            statuses: Counter[str] = Counter()
            best = db.best(workload_id, spec.name)
            best_latency = best[0].mean_latency if best else None
            measured = 0
            search_seconds = measure_seconds = 0.0
            while measured < trials:
                search_started = time.perf_counter()
                batch = search.next_batch(min(batch_size, trials - measured))
                search_seconds += time.perf_counter() - search_started
                if not batch:
                    break  # the space has no new program left to offer
                observed = []
                measure_started = time.perf_counter()
                for candidate, status, latencies, error, build_s, run_s in _measure(
                    batch, builder, runner, reference, spec, scratch, best_latency
                ):
                    db.add_record(
                        workload_id,
                        spec.name,
                        candidate.trace.to_json(),
                        candidate.decision_hash,
                        status,
                        latencies,
                        error,
                        program_hash=candidate.program_hash,
                        build_seconds=build_s,
                        run_seconds=run_s,
                    )
                    measured += 1
                    statuses[status] += 1
                    latency = sum(latencies) / len(latencies) if status == "ok" and latencies else None
                    observed.append((candidate, latency))
                    if latency is not None and (best_latency is None or latency < best_latency):
                        best_latency = latency
                    if progress is not None:
                        progress(TrialOutcome(measured, trials, status, latency, best_latency, error, work.flops))
                measure_seconds += time.perf_counter() - measure_started
                search_started = time.perf_counter()
                search.observe(observed)
                if model is not None:
                    db.save_cost_model(model.name, spec.name, model.save())
                search_seconds += time.perf_counter() - search_started
            if measured and confirm:
                measure_started = time.perf_counter()
                _confirm_best(db, workload_id, spec, space, builder, runner, reference, scratch, confirm)
                measure_seconds += time.perf_counter() - measure_started
            best = _best_replayable(db, workload_id, spec, space)
    return TuneResult(
        workload=work,
        target=spec,
        database=db_path,
        space=space,
        best=best.record if best else None,
        measured=measured,
        statuses=statuses,
        seconds=time.perf_counter() - started,
        search_seconds=search_seconds,
        measure_seconds=measure_seconds,
    )


_STRATEGIES = ("evolutionary", "random")
_CLEARLY_SLOWER = 2.0  # a first timing this many times the best so far ends a candidate's timing
_CONFIRM_PASSES = 2
_CONFIRM_ROUNDS = 3
_BEST_CANDIDATES = 8  # the best records tried, fastest first, for one whose trace replays


def _cost_model(model: str | CostModel, factories: dict[str, Callable[..., Any]], seed: int) -> CostModel:
    if not isinstance(model, str):
        return model
    if model not in factories:
        raise PluginError(
            f"unknown cost model {model!r}; registered: {', '.join(sorted(factories)) or 'none'} "
            f"(the built-in ones come with the probtune-xgb plugin)"
        )
    return factories[model](seed=seed)


def _make_search(
    model: CostModel | None,
    options: dict[str, Any],
    db: Database,
    workload_id: int,
    work: Workload,
    spec: TargetSpec,
    space: DesignSpace,
    rng: Rng,
) -> SearchStrategy:
    """The search, primed with what the database holds: what was measured, and the cost model's state."""
    seen = {
        "seen_decisions": db.seen_decision_hashes(workload_id, spec.name),
        "seen_programs": db.seen_program_hashes(workload_id, spec.name),
    }
    if model is None:
        return RandomSearch(space, rng, **seen)
    state = db.load_cost_model(model.name, spec.name)
    if state is not None:
        try:
            model.load(state)
        except ValueError as exc:
            warn_caller(
                f"{db.path}: the saved state of cost model {model.name!r} for {spec.name} does not load "
                f"({exc}); starting from an untrained model, whose state will replace it"
            )
    best = db.best(workload_id, spec.name, k=options.get("init_measured", INIT_MEASURED))
    measured = [(replayed.trace, replayed.record.mean_latency) for replayed in _replayable(best, space, db.path)]
    mutators = list(get_registry().mutators.values())
    options = {"realize_workers": _spare_cores(), **options}
    return EvolutionarySearch(space, rng, model, mutators, group=work.key, measured=measured, **seen, **options)


@dataclass(frozen=True)
class _Replayed:
    """A record whose trace replays into a program the validators accept."""

    record: Record
    trace: Trace
    program: tvm.IRModule


def _replayable(
    records: list[Record], space: DesignSpace, db_path: Path, limit: int | None = None
) -> list[_Replayed]:
    """The records (up to ``limit`` of them, in order) whose traces parse and replay into a valid program.

    A record that does not (a hand-edited or damaged row, or one from a space
    or validator that has changed since) is left out with a warning that
    names it, and stays in the database as it is: one bad row must not stop
    the tuning of its workload.
    """
    replayable, left_out = [], []
    for record in records:
        if limit is not None and len(replayable) == limit:
            break
        try:
            trace = Trace.from_json(record.trace_json)
            replayable.append(_Replayed(record, trace, space.program(trace)))
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
    return replayable


def _best_replayable(db: Database, workload_id: int, spec: TargetSpec, space: DesignSpace) -> _Replayed | None:
    """The fastest correct record whose trace replays into a valid program (among the best few), with it; or None."""
    replayable = _replayable(db.best(workload_id, spec.name, k=_BEST_CANDIDATES), space, db.path, limit=1)
    return replayable[0] if replayable else None


def _spare_cores() -> int:
    """Helpers that realize candidates beside the tuning process: one per other core, at most three (each holds TVM)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(0, min(usable - 1, 3))


def _measure(
    batch: list[Candidate],
    builder: Any,
    runner: Any,
    reference: Any,
    spec: TargetSpec,
    workdir: str,
    best_latency: float | None,
) -> Any:
    """Build the batch, then time what built; yield each candidate's outcome as soon as it is known.

    A candidate whose first timing is far slower than the best so far is not timed again.
    """
    built, runnable = _build([c.program for c in batch], builder, spec, workdir)
    for index in range(len(batch)):
        if built[index].artifact is None:
            yield batch[index], "build_error", (), built[index].error, built[index].seconds, None
    artifacts = [built[i].artifact for i in runnable]
    stop_above = best_latency * _CLEARLY_SLOWER if best_latency is not None else None
    for position, result in runner.run(reference, artifacts, spec.tvm_target, stop_above=stop_above):
        index = runnable[position]
        yield batch[index], result.status, result.latencies, result.error, built[index].seconds, result.seconds
        Path(artifacts[position]).unlink(missing_ok=True)


def _build(
    programs: list[tvm.IRModule | str], builder: Any, spec: TargetSpec, workdir: str
) -> tuple[dict[int, Any], list[int]]:
    """Build ``programs``: each one's build result by index, and the indices of those that gave an artifact."""
    built = dict(builder.build(programs, spec.tvm_target, workdir, stack_buffer_bytes=spec.stack_buffer_bytes))
    return built, [i for i in range(len(programs)) if built[i].artifact is not None]


def _confirm_best(
    db: Database,
    workload_id: int,
    spec: TargetSpec,
    space: DesignSpace,
    builder: Any,
    runner: Any,
    reference: Any,
    workdir: str,
    top: int,
) -> None:
    """Time the ``top`` best records again, in passes over all of them; the timings join their records.

    Once their means have moved, a record ranked below them (one lucky pass)
    may lead; then the new ``top`` are timed in the same way, until the best
    record is one timed again (at most ``_CONFIRM_ROUNDS`` rounds). A record
    whose program no longer replays (a trace from an older space) is not timed,
    with a warning, and stays as it is.
    """

    def time_again(records: list[Record]) -> None:
        replayed = _replayable(records, space, db.path)
        if not replayed:
            return
        records, programs = [r.record for r in replayed], [r.program for r in replayed]
        built, runnable = _build(programs, builder, spec, workdir)
        for index in sorted(set(range(len(programs))) - set(runnable)):
            warn_caller(
                f"record {records[index].id} measured ok before, but does not build now: {built[index].error}; "
                "it is not timed again"
            )
        artifacts = [built[i].artifact for i in runnable]
        timings: dict[int, list[float]] = {i: [] for i in runnable}
        for _ in range(_CONFIRM_PASSES):
            for position, result in runner.run(reference, artifacts, spec.tvm_target):
                index = runnable[position]
                if result.status == "ok":
                    timings[index].extend(result.latencies)
                else:
                    warn_caller(
                        f"record {records[index].id} measured ok before, but {result.status} when timed again: "
                        f"{result.error}; this timing of it is left out"
                    )
        for path in artifacts:
            Path(path).unlink(missing_ok=True)
        for index, latencies in timings.items():
            if latencies:
                db.add_latencies(records[index].id, latencies)

    tried: set[int] = set()
    for _ in range(_CONFIRM_ROUNDS):
        best = db.best(workload_id, spec.name, k=top)
        if not best or best[0].id in tried:
            return
        records = [record for record in best if record.id not in tried]
        tried.update(record.id for record in records)
        time_again(records)


def compile_best(
    workload: str | Workload | tvm.IRModule | tvm.tirx.PrimFunc,
    target: str | TargetSpec,
    database: str | Path,
    *,
    shape: Sequence[int] | str | None = None,
    dtype: str = "float32",
) -> Any:
    """Compile ``workload`` with the best schedule recorded for ``target`` in ``database``."""
    spec = resolve_target(target)
    work = resolve_workload(workload, shape, dtype, get_registry().workloads)
    space = generate_space(work, spec)
    with Database(database) as db:
        row = db.find_workload(work.mod)
        best = _best_replayable(db, row.id, spec, space) if row else None
    if best is None:
        raise LookupError(f"{database} holds no correct record of {work.key} on {spec.name} that replays")
    return compile_for(best.program, spec)
