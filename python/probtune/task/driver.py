"""The one tuning loop: any number of tasks, one measurement pipeline, a task scheduler giving out the trials.

MetaSchedule's task scheduler over its tune contexts: each task's search
session is opened when the scheduler first gives it a round; every round
draws candidates, builds and times them, records them and trains the cost
model (:meth:`~probtune.measure.pipeline.MeasurePipeline.round`). :func:`probtune.tune`
drives one task, :func:`probtune.tune_model` a model's tasks; a bundle round
(:mod:`probtune.measure.bundle`) drives them through a pipeline that writes
each round for a device reached only by files. Schedulers and strategies are
looked up here by their registered names.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from probtune.defaults import CONFIRM_SHARE, FIRST_ROUNDS_SHARE
from probtune.errors import TuningConfigError, warn_caller
from probtune.interfaces import CostModel, SpaceModule
from probtune.measure.pipeline import Pipeline
from probtune.plugins import get_registry
from probtune.search.strategies import StrategyKind
from probtune.space.design_space import DesignSpace
from probtune.space.space_generator import generate_space
from probtune.task.session import Replayed, TaskSession, best_replayable
from probtune.task.task import Task
from probtune.task.task_scheduler import TaskProgress, TaskScheduler, spend

__all__ = ["Driven", "TaskOutcome", "drive", "make_scheduler", "strategy_kind"]

log = logging.getLogger("probtune.tuning")
"""The stages of a run outside its trials (timing the best programs again), at INFO; the CLI shows them."""


@dataclass(frozen=True)
class TaskOutcome:
    """What a run did for one task: its search space, trials this run and in all, its best record that replays."""

    task: Task
    space: DesignSpace | None  # None: the task got no round and has no records
    trials: int
    total_trials: int
    best: Replayed | None
    search_seconds: float
    statuses: Counter[str]


@dataclass(frozen=True)
class Driven:
    """What :func:`drive` did: trials spent, and an outcome per task in the order given."""

    spent: int
    outcomes: list[TaskOutcome]


def drive(
    pipeline: Pipeline,
    tasks: Sequence[Task],
    trials: int,
    scheduler: TaskScheduler,
    *,
    strategy: StrategyKind,
    cost_model: CostModel | None,
    batch_size: int,
    confirm: int,
    seed: int = 0,
    modules: Sequence[str | SpaceModule] | None = None,
    search_options: dict[str, Any] | None = None,
    first_rounds_share: float = FIRST_ROUNDS_SHARE,
) -> Driven:
    """Spend ``trials`` new measurements over ``tasks`` as ``scheduler`` picks, then time the best programs again.

    Each task's search is ``strategy``'s, guided by ``cost_model`` where the
    strategy uses one. Each task first gets a round when ``trials`` allows (the first rounds together
    ``first_rounds_share`` of them at most, :func:`spend`); a task tuned before
    (in the database, from any run) starts where it was. The best ``confirm``
    records of each task that carries at least ``CONFIRM_SHARE`` of the
    weighted estimate are timed again at the end.
    """
    sessions = _Sessions(pipeline, list(tasks), strategy, cost_model, seed, modules, search_options or {})
    with contextlib.closing(sessions):
        rows = [sessions.progress(i) for i in range(len(tasks))]
        _warn_unreached(list(tasks), rows, trials)
        spent = spend(trials, rows, scheduler, sessions.run_round, batch_size, first_rounds_share)
        confirmed = sessions.worth_confirming() if confirm else []
        for index, session in enumerate(confirmed):
            log.info("timing the best %d programs of task %d of %d again: %s", confirm, index + 1,
                     len(confirmed), session.workload.name)
            pipeline.confirm(session, confirm)
        return Driven(spent, [sessions.outcome(i) for i in range(len(tasks))])


class _Sessions:
    """The tasks' search sessions, each opened when its task first gets a round."""

    def __init__(
        self, pipeline: Pipeline, tasks: list[Task], strategy: StrategyKind, model: CostModel | None,
        seed: int, modules: Sequence[str | SpaceModule] | None, options: dict[str, Any],
    ) -> None:
        self.pipeline = pipeline
        self.tasks = tasks
        self.strategy = strategy
        self.model = model
        self.seed = seed
        self.modules = modules
        self.options = {"realize_helpers": pipeline.realize_helpers, **options}
        self.workload_ids = [pipeline.db.commit_workload(task.workload.key, task.workload.mod) for task in tasks]
        self._open: dict[int, TaskSession] = {}

    def progress(self, index: int) -> TaskProgress:
        """The task's progress so far, from the database: a task tuned before (in any model) starts where it was."""
        db, key, task = self.pipeline.db, self.pipeline.key, self.tasks[index]
        count = db.count(self.workload_ids[index], key)
        best = db.best(self.workload_ids[index], key)
        rounds = [(count, best[0].mean_latency if best else None)] if count else []
        return TaskProgress(task.name, float(task.weight), trials=count, rounds=rounds)

    def session(self, index: int) -> TaskSession:
        if index not in self._open:
            task = self.tasks[index]
            self._open[index] = TaskSession.open(
                task.workload, self.pipeline.target, self.pipeline.key, self.pipeline.db, self.model,
                workdir=self.pipeline.workdir, seed=self.seed, modules=self.modules, search_options=self.options,
                strategy=self.strategy,
            )
        return self._open[index]

    def run_round(self, index: int, size: int) -> tuple[int, float | None]:
        session = self.session(index)
        measured = self.pipeline.round(session, size)
        return measured, session.best_latency

    def worth_confirming(self) -> list[TaskSession]:
        """The measured tasks whose weighted best latency is at least ``CONFIRM_SHARE`` of the whole's estimate.

        Timing a task's best records again costs a build and a timing each; a
        task that is a sliver of the whole cannot move its latency by much.
        """
        weighted = {
            index: self.tasks[index].weight * session.best_latency
            for index, session in self._open.items() if session.measured and session.best_latency is not None
        }
        total = sum(weighted.values())
        return [self._open[index] for index, value in weighted.items() if value >= CONFIRM_SHARE * total]

    def outcome(self, index: int) -> TaskOutcome:
        """The task's outcome: its best record that replays, looked up in a space made here if it got no round."""
        db, key, task = self.pipeline.db, self.pipeline.key, self.tasks[index]
        opened = self._open.get(index)
        total = db.count(self.workload_ids[index], key)
        space = opened.space if opened else None
        if space is None and total:
            space = generate_space(task.workload, self.pipeline.target, modules=self.modules, seed=self.seed)
        best = best_replayable(db, self.workload_ids[index], key, space) if space is not None else None
        if opened is None:
            return TaskOutcome(task, space, 0, total, best, 0.0, Counter())
        return TaskOutcome(task, space, opened.measured, total, best, opened.search_seconds, Counter(opened.statuses))

    def close(self) -> None:
        for session in self._open.values():
            session.close()


def _warn_unreached(tasks: list[Task], rows: list[TaskProgress], trials: int) -> None:
    untuned = [task.name for task, row in zip(tasks, rows) if not row.rounds]
    if len(untuned) > trials > 0:
        warn_caller(
            f"{trials} trials cannot reach all {len(untuned)} untuned tasks of the model: the lightest "
            f"{len(untuned) - trials} get none and are compiled with a default program (see the task table)"
        )


def make_scheduler(name: str | TaskScheduler) -> TaskScheduler:
    """A new scheduler of the registered ``name`` (a scheduler object is used as it is)."""
    if not isinstance(name, str):
        return name
    registered = get_registry().task_schedulers
    if name not in registered:
        raise TuningConfigError(f"unknown task scheduler {name!r}; choose one of {', '.join(registered)}")
    return registered[name]()


def strategy_kind(name: str) -> StrategyKind:
    """The registered strategy ``name``; an unknown name is a :class:`~probtune.errors.TuningConfigError`."""
    registered = get_registry().search_strategies
    if name not in registered:
        raise TuningConfigError(f"unknown search strategy {name!r}; choose one of {', '.join(registered)}")
    kind: StrategyKind = registered[name]
    return kind
