"""Search strategies as the tuning loop starts them: what a task's search starts from, and the registered kinds.

A strategy kind is registered by name (``probtune_register_search_strategies``),
the kernel's own too: "evolutionary" (guided by a cost model) and "random".
The loop makes a cost model, and reads the task's fastest measured programs
from the database, only for a kind that ``uses_cost_model``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from probtune.errors import TuningConfigError
from probtune.search.search_strategy import EvolutionarySearch, RandomSearch, SearchStrategy

if TYPE_CHECKING:
    from probtune._core import Rng, Trace
    from probtune.interfaces import CostModel, Mutator
    from probtune.space.design_space import DesignSpace

__all__ = ["BUILTIN_STRATEGIES", "EVOLUTIONARY", "RANDOM", "SearchStart", "StrategyKind"]


@dataclass(frozen=True)
class SearchStart:
    """What a task's search starts from: its space and random stream, and what the database already holds of it.

    ``seen_decisions`` and ``seen_programs`` are the hashes measured before
    (never to be offered again); ``measured`` the fastest measured traces
    with their latencies, and ``cost_model`` the model, for a kind that
    ``uses_cost_model`` (else empty and None). ``mutators`` are the target's,
    ``mutator_weights`` its probabilities by name; ``group`` names the task's
    samples in the cost model; ``options`` are the user's ``search_options``.
    """

    space: DesignSpace
    rng: Rng
    group: str
    seen_decisions: set[int]
    seen_programs: set[int]
    cost_model: CostModel | None = None
    measured: Sequence[tuple[Trace, float]] = ()
    mutators: Sequence[Mutator] = ()
    mutator_weights: Mapping[str, float] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StrategyKind:
    """A registered search strategy: its name, whether a cost model guides it, and how to start one for a task."""

    name: str
    uses_cost_model: bool
    start: Callable[[SearchStart], SearchStrategy]


def _start_random(start: SearchStart) -> SearchStrategy:
    return RandomSearch(start.space, start.rng, seen_decisions=start.seen_decisions, seen_programs=start.seen_programs)


def _start_evolutionary(start: SearchStart) -> SearchStrategy:
    if start.cost_model is None:
        raise TuningConfigError("the evolutionary search needs a cost model")
    options = {"realize_workers": _spare_cores(), **start.options}
    return EvolutionarySearch(
        start.space, start.rng, start.cost_model, start.mutators, group=start.group, weights=start.mutator_weights,
        measured=start.measured, seen_decisions=start.seen_decisions, seen_programs=start.seen_programs, **options,
    )


def _spare_cores() -> int:
    """Helpers that realize candidates beside the tuning process: one per other core, at most three (each holds TVM)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(0, min(usable - 1, 3))


EVOLUTIONARY = StrategyKind("evolutionary", True, _start_evolutionary)
RANDOM = StrategyKind("random", False, _start_random)
BUILTIN_STRATEGIES = (EVOLUTIONARY, RANDOM)
"""The kernel's strategies, registered by its own plugin."""
