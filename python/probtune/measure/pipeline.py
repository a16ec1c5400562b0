"""The measurement pipeline every task of a run shares: build, time, record, learn, report.

One builder and one runner (their worker processes), one database, one cost
model. :meth:`MeasurePipeline.round` takes a batch from a task's session,
measures it and records each result as it arrives (a run killed at any
moment loses no measured record), then lets the session learn and saves the
cost model's state.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import tvm

from probtune.database.database import Database, Record
from probtune.database.measure_key import COLD_CACHE, MeasureKey
from probtune.defaults import LOCAL
from probtune.errors import PluginError, TuningConfigError, warn_caller
from probtune.interfaces import Builder, CostModel, Runner, TargetSpec
from probtune.measure import MeasureReference, MeasureStatus
from probtune.measure.constant_layouts import MeasuredForm
from probtune.plugins import get_registry
from probtune.space.design_space import Candidate, DesignSpace
from probtune.targets import check_runs_here
from probtune.task.session import TaskSession, replayable

__all__ = [
    "COLD_CACHE",
    "MeasurePipeline",
    "Pipeline",
    "Progress",
    "TrialOutcome",
    "build",
    "lent_workers",
    "load_cost_model_state",
    "make_builder",
    "open_pipeline",
    "resolve_cost_model",
]


@dataclass(frozen=True)
class TrialOutcome:
    """One measured candidate, as reported to a progress callback."""

    trial: int  # 1-based within this run
    trials: int
    status: str
    latency: float | None
    best_latency: float | None  # the task's
    error: str | None
    flops: float | None
    task: str = ""  # the workload's key


Progress = Callable[[TrialOutcome], None]

CLEARLY_SLOWER = 2.0  # a first timing this many times the best so far ends a candidate's timing
CONFIRM_PASSES = 2
CONFIRM_ROUNDS = 3


class Pipeline(Protocol):
    """What the driver (:func:`probtune.task.driver.drive`) rounds its tasks through.

    :class:`MeasurePipeline` measures each round here; a bundle pipeline
    (:class:`probtune.measure.bundle.BundlePipeline`) writes it for a device
    that no runner reaches, whose results are imported later.
    """

    db: Database
    target: TargetSpec
    key: MeasureKey
    workdir: str

    @property
    def realize_helpers(self) -> Any: ...

    def round(self, session: TaskSession, size: int) -> int:
        """One round of ``session``'s candidates, up to ``size``; how many it took (0: the task has no more)."""
        ...

    def confirm(self, session: TaskSession, top: int) -> None:
        """Time the session's ``top`` best records again."""
        ...


class MeasurePipeline:
    """Builds and times candidates of any task, records every result, trains and saves the cost model.

    Records and the cost model's state are kept under ``key``: where ``target`` is measured, and how.
    """

    def __init__(
        self,
        db: Database,
        target: TargetSpec,
        key: MeasureKey,
        builder: Any,
        runner: Any,
        model: CostModel | None,
        workdir: str,
        *,
        trials: int,
        progress: Progress | None = None,
    ) -> None:
        self.db = db
        self.target = target
        self.key = key
        self.builder = builder
        self.runner = runner
        self.model = model
        self.workdir = workdir
        self.trials = trials  # of the whole run, for progress
        self.progress = progress
        self.measured = 0
        self.measure_seconds = 0.0

    @property
    def realize_helpers(self) -> Any:
        return lent_workers(self.builder)

    def round(self, session: TaskSession, size: int) -> int:
        """One round of ``session``: up to ``size`` candidates measured, recorded and learned from; how many."""
        batch = session.next_batch(size)
        if not batch:
            return 0
        started = time.perf_counter()
        observed = list(self._measure(session, batch))
        self.measure_seconds += time.perf_counter() - started
        session.observe(observed)
        if self.model is not None:
            search_started = time.perf_counter()
            self.db.save_cost_model(self.model.name, self.key, self.model.save())
            session.search_seconds += time.perf_counter() - search_started
        return len(observed)

    def confirm(self, session: TaskSession, top: int) -> None:
        """Time the session's best records again (:func:`confirm_best`)."""
        started = time.perf_counter()
        confirm_best(
            self.db, session.workload_id, self.target, self.key, session.space, self.builder, self.runner,
            session.form, self.workdir, top,
        )
        self.measure_seconds += time.perf_counter() - started

    def _measure(self, session: TaskSession, batch: list[Candidate]) -> Iterator[tuple[Candidate, float | None]]:
        """Measure ``batch``, recording each outcome as soon as it is known."""
        for candidate, status, latencies, error, build_s, run_s in measure(
            batch, self.builder, self.runner, session.form, self.target, self.workdir, session.best_latency
        ):
            self.db.add_record(
                session.workload_id,
                self.key,
                candidate.trace.to_json(),
                candidate.decision_hash,
                status,
                latencies,
                error,
                program_hash=candidate.program_hash,
                build_seconds=build_s,
                run_seconds=run_s,
            )
            latency = sum(latencies) / len(latencies) if status == "ok" and latencies else None
            session.record(status, latency)
            self.measured += 1
            if self.progress is not None:
                self.progress(
                    TrialOutcome(
                        self.measured, self.trials, status, latency, session.best_latency, error,
                        session.workload.flops, session.name,
                    )
                )
            yield candidate, latency


@contextlib.contextmanager
def open_pipeline(
    target: TargetSpec,
    database: str | Path | None,
    model: CostModel | None,
    *,
    trials: int,
    build_timeout: float,
    run_timeout: float,
    progress: Progress | None = None,
    cache_flush: bool | None = None,
    builder: str | Builder | None = None,
    runner: str | Runner | None = None,
) -> Iterator[MeasurePipeline]:
    """A pipeline for ``target`` recording into ``database`` (None: a temporary file).

    ``builder`` and ``runner`` are objects (used as they are, with their own
    settings, and left open for their owner), registered names, or None for
    the target's own; the pipeline makes a named one with ``build_timeout`` or
    ``run_timeout`` and closes it at the end. The cost model's saved state,
    if the database holds one, is loaded into ``model``.

    Records (and the cost model's state) are kept under the target and the
    device the runner measures on (:meth:`Database.measured_on`), the
    pipeline's ``key``. With ``cache_flush`` the runner times every call with
    cold caches, and the key says so (``COLD_CACHE``), apart from warm timings
    of the same programs. None takes a runner object's own ``cache_flush``,
    and warm timings from a named one.
    """
    with contextlib.ExitStack() as stack:
        built_by = make_builder(builder, target, build_timeout, stack)
        runs_on, cold = _runner(runner, target, run_timeout, cache_flush, stack)
        scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="probtune-"))
        db_path = Path(database) if database is not None else Path(scratch) / "tuning.db"
        db = stack.enter_context(Database(db_path))
        key = db.measured_on(MeasureKey(target.name, _device(runs_on, target), cold), target.tvm_target)
        if model is not None:
            load_cost_model_state(model, db, key)
        yield MeasurePipeline(db, target, key, built_by, runs_on, model, scratch, trials=trials, progress=progress)


def lent_workers(builder: Any) -> Any:
    """The builder's workers, idle while a search runs, lent to realize its candidates (or None: it lends none)."""
    return getattr(builder, "lend_workers", None)


def make_builder(builder: str | Builder | None, target: TargetSpec, timeout: float, stack: contextlib.ExitStack) -> Builder:
    """The builder object to use; one made here is closed with ``stack``."""
    if builder is not None and not isinstance(builder, str):
        return builder
    factory = _factory("builder", get_registry().builders, builder or target.builder, target.name)
    made: Builder = factory(timeout=timeout)
    stack.callback(made.close)  # the Builder and Runner protocols ask for close(), not a context manager
    return made


def _runner(
    runner: str | Runner | None, target: TargetSpec, timeout: float, cache_flush: bool | None, stack: contextlib.ExitStack
) -> tuple[Runner, bool]:
    """The runner object to use and whether it times with cold caches; one made here is closed with ``stack``."""
    if runner is not None and not isinstance(runner, str):
        flushes = bool(getattr(runner, "cache_flush", False))
        if cache_flush is not None and cache_flush != flushes:
            raise TuningConfigError(
                f"cache_flush={cache_flush} but the runner given {'flushes' if flushes else 'does not flush'} the caches: "
                f"make the runner with cache_flush={cache_flush}, or leave cache_flush out"
            )
        _check_runs_here(runner.name, target)
        return runner, flushes
    name = runner or target.runner
    factory = _factory("runner", get_registry().runners, name, target.name)
    _check_runs_here(name, target)
    options: dict[str, Any] = {"timeout": timeout}
    if cache_flush:  # only then: a runner factory need not know the option
        options["cache_flush"] = True
    made: Runner = factory(**options)
    stack.callback(made.close)
    return made, bool(cache_flush)


def _device(runner: Runner, target: TargetSpec) -> str:
    """Where ``runner`` measures ``target``: its ``device_name``, or its own name."""
    name = getattr(runner, "device_name", None)
    return str(name(target)) if callable(name) else runner.name


def _check_runs_here(runner: str, target: TargetSpec) -> None:
    if runner == LOCAL:
        check_runs_here(target)


def resolve_cost_model(model: str | CostModel, seed: int) -> CostModel:
    """A cost model object: ``model`` itself, or a new one from the plugin that registers that name."""
    if not isinstance(model, str):
        return model
    factories = get_registry().cost_models
    if model not in factories:
        raise PluginError(
            f"unknown cost model {model!r}; registered: {', '.join(sorted(factories)) or 'none'} "
            f"(the built-in ones come with the probtune-xgb plugin)"
        )
    return factories[model](seed=seed)


def load_cost_model_state(model: CostModel, db: Database, key: MeasureKey) -> None:
    """Load into ``model`` the state ``db`` holds for it under ``key``, if any (one that does not load is warned of)."""
    state = db.load_cost_model(model.name, key)
    if state is None:
        return
    try:
        model.load(state)
    except ValueError as exc:
        warn_caller(
            f"{db.path}: the saved state of cost model {model.name!r} for {key} does not load "
            f"({exc}); starting from an untrained model, whose state will replace it"
        )


def _factory(kind: str, table: dict[str, Callable[..., Any]], name: str, target: str) -> Callable[..., Any]:
    if name not in table:
        raise PluginError(
            f"target {target!r} uses the {kind} {name!r}, which no installed plugin registers "
            f"(registered {kind}s: {', '.join(sorted(table)) or 'none'}); install a plugin that provides it, "
            f"or tune for a target this machine can measure, such as 'host'"
        )
    return table[name]


def measure(
    batch: list[Candidate],
    builder: Any,
    runner: Any,
    form: MeasuredForm,
    spec: TargetSpec,
    workdir: str,
    best_latency: float | None,
) -> Iterator[tuple[Candidate, str, tuple[float, ...], str | None, float | None, float | None]]:
    """Build the batch in its measured ``form``, then time what built; yield each candidate's outcome as soon as it is known.

    A candidate whose first timing is far slower than the best so far is not timed again.
    """
    measured = [form(candidate.program) for candidate in batch]
    built, runnable = build([program for program, _ in measured], builder, spec, workdir)
    for index in range(len(batch)):
        if built[index].artifact is None:
            yield batch[index], MeasureStatus.BUILD_ERROR, (), built[index].error, built[index].seconds, None
    stop_above = best_latency * CLEARLY_SLOWER if best_latency is not None else None
    references = [reference for _, reference in measured]
    for index, result in _run(runner, built, runnable, references, spec, stop_above):
        yield batch[index], result.status, result.latencies, result.error, built[index].seconds, result.seconds
        Path(built[index].artifact).unlink(missing_ok=True)


def _run(
    runner: Any,
    built: dict[int, Any],
    runnable: list[int],
    references: list[MeasureReference],
    spec: TargetSpec,
    stop_above: float | None = None,
) -> Iterator[tuple[int, Any]]:
    """Time the built programs at ``runnable``, one runner call per reference they run against; yield (index, result)."""
    groups: dict[str, list[int]] = {}
    for index in runnable:
        groups.setdefault(references[index].path, []).append(index)
    for indices in groups.values():
        artifacts = [built[i].artifact for i in indices]
        for position, result in runner.run(references[indices[0]], artifacts, spec, stop_above=stop_above):
            yield indices[position], result


def build(
    programs: list[tvm.IRModule | str], builder: Any, spec: TargetSpec, workdir: str
) -> tuple[dict[int, Any], list[int]]:
    """Build ``programs``: each one's build result by index, and the indices of those that gave an artifact."""
    built = dict(builder.build(programs, spec, workdir))
    return built, [i for i in range(len(programs)) if built[i].artifact is not None]


def confirm_best(
    db: Database,
    workload_id: int,
    spec: TargetSpec,
    key: MeasureKey,
    space: DesignSpace,
    builder: Any,
    runner: Any,
    form: MeasuredForm,
    workdir: str,
    top: int,
) -> None:
    """Time the ``top`` best records of ``spec`` under ``key`` again, in passes over all of them; the timings join their records.

    Once their means have moved, a record ranked below them (one lucky pass)
    may lead; then the new ``top`` are timed in the same way, until the best
    record is one timed again (at most ``CONFIRM_ROUNDS`` rounds). A record
    whose program no longer replays (a trace from an older space) is not timed,
    with a warning, and stays as it is.
    """

    def time_again(records: list[Record]) -> None:
        replayed = replayable(records, space, db.path)
        if not replayed:
            return
        records, measured = [r.record for r in replayed], [form(r.program) for r in replayed]
        built, runnable = build([program for program, _ in measured], builder, spec, workdir)
        for index in sorted(set(range(len(measured))) - set(runnable)):
            warn_caller(
                f"record {records[index].id} measured ok before, but does not build now: {built[index].error}; "
                "it is not timed again"
            )
        timings: dict[int, list[float]] = {i: [] for i in runnable}
        for _ in range(CONFIRM_PASSES):
            for index, result in _run(runner, built, runnable, [reference for _, reference in measured], spec):
                if result.status == "ok":
                    timings[index].extend(result.latencies)
                else:
                    warn_caller(
                        f"record {records[index].id} measured ok before, but {result.status} when timed again: "
                        f"{result.error}; this timing of it is left out"
                    )
        for index in runnable:
            Path(built[index].artifact).unlink(missing_ok=True)
        for index, latencies in timings.items():
            if latencies:
                db.add_latencies(records[index].id, latencies)

    tried: set[int] = set()
    for _ in range(CONFIRM_ROUNDS):
        best = db.best(workload_id, key, k=top)
        if not best or best[0].id in tried:
            return
        records = [record for record in best if record.id not in tried]
        tried.update(record.id for record in records)
        time_again(records)
