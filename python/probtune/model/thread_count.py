"""The thread count a compiled model runs fastest on, measured once it is compiled.

Its tasks were tuned on all the target's cores, each timed alone, back to
back. A model of many small calls (a recurrent network stepping through its
sequence) can lose more at every call to starting and joining the workers of
its parallel loops than the workers save it, and then runs faster on fewer
threads; the compiled model is timed at each count in turns and keeps the
fastest, unless all cores are within :data:`~probtune.defaults.THREAD_CHOICE_MARGIN` of it. A count
that runs far slower than another in a round (:data:`~probtune.defaults.THREAD_CHOICE_DROP`) is timed no
further: a large model's single thread would otherwise take most of the time after tuning.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from probtune.defaults import THREAD_CHOICE_DROP, THREAD_CHOICE_MARGIN, THREAD_CHOICE_ROUNDS

__all__ = ["ThreadChoice", "candidate_counts", "choose_threads", "fastest_count"]

_ROUND_MS = 20  # TVM's timer runs the model at least this long per figure


@dataclass(frozen=True)
class ThreadChoice:
    """The thread count chosen, and the model's median seconds per inference at each count tried, over ``rounds``."""

    count: int
    medians: dict[int, float]
    rounds: int

    def __str__(self) -> str:
        others = "".join(f"; {self.medians[n] * 1e3:.3f} ms on {n}" for n in sorted(self.medians) if n != self.count)
        threads = "thread" if self.count == 1 else "threads"
        return (f"runs on {self.count} {threads}: {self.medians[self.count] * 1e3:.3f} ms per inference "
                f"(median of {self.rounds} rounds{others})")


class _Runnable(Protocol):
    """What a compiled model offers the choice (:class:`~probtune.model.compile.CompiledModel`)."""

    thread_choice: ThreadChoice | None

    def use_threads(self, count: int) -> None: ...

    def time(self, inputs: Sequence[np.ndarray], repeat: int = ..., min_repeat_ms: int = ...) -> list[float]: ...


def candidate_counts(cores: int) -> list[int]:
    """The counts tried on ``cores`` cores (as many as this machine has, at most): 1, 2, 4, ... below it, and it."""
    top = max(1, min(cores, os.cpu_count() or 1))
    counts = []
    count = 1
    while count < top:
        counts.append(count)
        count *= 2
    return [*counts, top]


def fastest_count(
    seconds_at: Callable[[int], float], counts: Sequence[int], rounds: int = THREAD_CHOICE_ROUNDS,
    margin: float = THREAD_CHOICE_MARGIN, drop: float = THREAD_CHOICE_DROP,
) -> ThreadChoice:
    """The count of ``counts`` (the last: all cores) whose median of ``rounds`` timings ``seconds_at(count)``, taken in
    turns, is lowest; all cores unless that count is more than ``margin`` faster.

    After each round, a count more than ``drop`` times slower than that round's fastest is timed no more; the rounds
    end early when one count is left.
    """
    timings: dict[int, list[float]] = {count: [] for count in counts}
    timed = list(counts)
    for _ in range(rounds):
        figures = {count: seconds_at(count) for count in timed}
        for count, seconds in figures.items():
            timings[count].append(seconds)
        fastest = min(figures.values())
        timed = [count for count in timed if figures[count] <= fastest * drop]
        if len(timed) == 1:
            break
    medians = {count: float(np.median(times)) for count, times in timings.items()}
    everything = counts[-1]
    best = min(timed, key=lambda count: medians[count])
    if everything in timed and medians[best] > medians[everything] * (1.0 - margin):
        best = everything
    return ThreadChoice(best, medians, len(timings[best]))


def choose_threads(compiled: _Runnable, inputs: Sequence[np.ndarray], cores: int) -> ThreadChoice:
    """Time ``compiled`` on ``inputs`` at each of :func:`candidate_counts` and leave it running on the fastest."""

    def seconds_at(count: int) -> float:
        compiled.use_threads(count)
        return float(np.median(compiled.time(inputs, repeat=3, min_repeat_ms=_ROUND_MS)))

    choice = fastest_count(seconds_at, candidate_counts(cores))
    compiled.use_threads(choice.count)
    compiled.thread_choice = choice
    return choice
