"""Task schedulers: spend one trial budget over many tasks where it cuts the model's latency most.

A model's latency is the sum over its tasks of weight x best latency. Every
task first gets one round, so that none is left untuned (the first rounds
take at most a share of the budget, so that the rest goes where their
measurements say the time is); then the gradient
scheduler (MetaSchedule's and Ansor's) gives the next round to the task with
the largest expected gain, weight x (alpha x its recent improvement per trial
+ (1 - alpha) x best latency / trials spent), and round-robin takes turns. A
task whose search is exhausted stops drawing budget. Schedulers are
registered by name (``probtune_register_task_schedulers``), built-ins too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from probtune.defaults import FIRST_ROUNDS_SHARE

__all__ = [
    "BUILTIN_SCHEDULERS",
    "GradientScheduler",
    "RoundRobinScheduler",
    "TaskProgress",
    "TaskScheduler",
    "spend",
]


@dataclass
class TaskProgress:
    """What a scheduler knows of one task: its weight, trials spent and best latency after each of its rounds."""

    name: str
    weight: float
    trials: int = 0
    rounds: list[tuple[int, float | None]] = field(default_factory=list)  # (trials so far, best latency) per round
    done: bool = False  # exhausted: it has nothing new to measure

    @property
    def best(self) -> float | None:
        return self.rounds[-1][1] if self.rounds else None


class TaskScheduler(Protocol):
    """Picks the task that gets the next round, or None when none can use one."""

    name: str

    def next_task(self, tasks: Sequence[TaskProgress]) -> int | None: ...


def _first_unvisited(tasks: Sequence[TaskProgress]) -> int | None:
    return next((i for i, task in enumerate(tasks) if not task.done and not task.rounds), None)


class RoundRobinScheduler:
    """Each task in turn, one round at a time."""

    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def next_task(self, tasks: Sequence[TaskProgress]) -> int | None:
        for offset in range(len(tasks)):
            index = (self._next + offset) % len(tasks)
            if not tasks[index].done:
                self._next = index + 1
                return index
        return None


class GradientScheduler:
    """The task whose next round is expected to cut the weighted latency most (after one round for each).

    ``window`` rounds back give the recent improvement per trial; ``alpha``
    weighs it against the optimistic estimate best / trials. A task with no
    correct program after ``max_failed_rounds`` rounds gets no more (its
    candidates keep failing: the model uses a default program for it).
    """

    name = "gradient"

    def __init__(self, alpha: float = 0.2, window: int = 3, max_failed_rounds: int = 2) -> None:
        if not 0 <= alpha <= 1:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self.alpha = alpha
        self.window = window
        self.max_failed_rounds = max_failed_rounds

    def next_task(self, tasks: Sequence[TaskProgress]) -> int | None:
        first = _first_unvisited(tasks)
        if first is not None:
            return first
        gains = [(self.gain(task), -index) for index, task in enumerate(tasks) if not task.done]
        gains = [(gain, neg) for gain, neg in gains if gain > 0]
        return -max(gains)[1] if gains else None

    def gain(self, task: TaskProgress) -> float:
        """Expected cut of the weighted latency per trial spent on ``task`` next (0: none expected)."""
        if task.best is None:
            return float("inf") if len(task.rounds) < self.max_failed_rounds else 0.0
        recent = 0.0
        if len(task.rounds) > self.window:
            trials_then, best_then = task.rounds[-1 - self.window]
            if best_then is not None and task.trials > trials_then:
                recent = (best_then - task.best) / (task.trials - trials_then)
        optimistic = task.best / max(task.trials, 1)
        return task.weight * (self.alpha * recent + (1 - self.alpha) * optimistic)


BUILTIN_SCHEDULERS: tuple[type[GradientScheduler] | type[RoundRobinScheduler], ...] = (GradientScheduler, RoundRobinScheduler)
"""The kernel's schedulers, registered by its own plugin (``probtune_register_task_schedulers``)."""


RoundFn = Callable[[int, int], tuple[int, "float | None"]]
"""``round(task index, trials)`` measures up to that many candidates of the task: (how many, its best latency now)."""


def spend(
    budget: int,
    tasks: Sequence[TaskProgress],
    scheduler: TaskScheduler,
    run_round: RoundFn,
    batch_size: int,
    first_rounds_share: float = FIRST_ROUNDS_SHARE,
) -> int:
    """Give rounds to the tasks the scheduler picks until ``budget`` trials are spent or no task can use more.

    A task's first round is at most ``batch_size`` trials, and the first
    rounds together take at most ``first_rounds_share`` of the budget (one
    trial each at least, as far as the budget goes): a model of many tasks
    keeps the rest for the tasks its first rounds found slow. A round that
    measures nothing marks its task done. Returns the trials spent.
    """
    spent = 0
    unvisited = sum(1 for task in tasks if not task.rounds and not task.done)
    first_round = max(1, min(batch_size, int(budget * first_rounds_share) // max(unvisited, 1)))
    while spent < budget:
        index = scheduler.next_task(tasks)
        if index is None:
            break
        task = tasks[index]
        size = min(first_round if not task.rounds else batch_size, budget - spent)
        measured, best = run_round(index, size)
        if measured == 0:
            task.done = True
            continue
        spent += measured
        task.trials += measured
        task.rounds.append((task.trials, best))
    return spent
