"""Rust core of probtune: traces, decisions, deterministic sampling, stable hashing, decision
mutators, deduplication and the evolutionary search loop.

Argument values are JSON-like: ``None``, ``bool``, ``int`` (64-bit), ``float`` (finite),
``str``, ``list`` and ``dict`` with ``str`` keys. A reference to a random variable (the
output of an earlier instruction) is the dict ``{"rv": id}``; a dict whose only key is
``"rv"`` is always such a reference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, final

_Arg = Any
"""A JSON-like argument value, with ``{"rv": id}`` dicts for random-variable references."""

_Decision = list[int] | int
"""Outcome of a sampling instruction: tile factors (outermost first) or a candidate index."""

_PythonMutator = Callable[["Trace", "Rng"], "Trace | None"]
"""A mutator written in Python: returns a trace with one decision changed, or None if it finds nothing to change."""

__all__ = [
    "DecisionSet",
    "Instruction",
    "InvalidDecisionError",
    "Rng",
    "Trace",
    "TraceFormatError",
    "check_categorical",
    "check_perfect_tile",
    "evolve",
    "mutate_categorical",
    "mutate_tile_size",
    "sample_categorical",
    "sample_perfect_tile",
]

class TraceFormatError(ValueError):
    """Serialized trace text that does not describe a valid trace; the message says what and where."""

class InvalidDecisionError(ValueError):
    """A decision that does not fit its instruction (non-sampling kind, wrong tile product...)."""

@final
class Instruction:
    """One recorded step of a schedule program: ``outputs = kind(inputs, attrs)``. Read-only."""

    @property
    def kind(self) -> str:
        """Instruction kind, e.g. ``"split"``; kinds starting with ``sample_`` are sampling instructions."""

    @property
    def inputs(self) -> list[_Arg]:
        """Positional arguments (a fresh list on each access)."""

    @property
    def attrs(self) -> dict[str, _Arg]:
        """Named arguments (a fresh dict on each access)."""

    @property
    def outputs(self) -> list[int]:
        """Ids of the random variables this instruction defines."""

    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

@final
class Trace:
    """An ordered list of instructions plus the decisions of its sampling instructions.

    Copies share the instruction list (copy-on-write), so ``copy`` and ``with_decisions``
    are cheap. Traces pickle through their JSON form.
    """

    def __init__(self) -> None:
        """An empty trace."""

    def append(
        self,
        kind: str,
        inputs: list[_Arg],
        attrs: dict[str, _Arg],
        outputs: list[int],
        decision: _Decision | None = None,
    ) -> int:
        """Append an instruction and return its index.

        Raises ``InvalidDecisionError`` for a decision on a non-sampling kind, ``ValueError``
        when an output id is already defined or an ``{"rv": id}`` input refers to an id no
        earlier instruction output, and ``TypeError`` for values that are not JSON-like.
        """

    def __len__(self) -> int: ...
    @property
    def instructions(self) -> list[Instruction]:
        """All instructions, in order."""

    def instruction(self, index: int) -> Instruction:
        """Instruction ``index``; ``IndexError`` if out of range."""

    @property
    def decisions(self) -> dict[int, _Decision]:
        """Decisions by instruction index."""

    def decision(self, index: int) -> _Decision | None:
        """_Decision of instruction ``index``, ``None`` if it has none; ``IndexError`` if out of range."""

    def with_decisions(self, decisions: dict[int, _Decision]) -> Trace:
        """A trace sharing these instructions with exactly ``decisions``.

        ``with_decisions({})`` drops all decisions, so that replay samples fresh ones.
        Raises ``InvalidDecisionError`` for a key that is not a sampling instruction's index.
        """

    def sampling_indices(self) -> list[int]:
        """Indices of the sampling instructions, in order."""

    def decision_hash(self) -> int:
        """Stable 64-bit hash of the decisions (same in every process and on every platform)."""

    def structure_hash(self) -> int:
        """Stable 64-bit hash of the instructions (kinds, inputs, attrs, outputs), not the decisions."""

    def to_json(self) -> str:
        """Canonical JSON: ``{"version": 1, "insts": [...], "decisions": [[index, decision], ...]}``."""

    @staticmethod
    def from_json(text: str) -> Trace:
        """Parse and validate ``to_json`` output; any problem raises ``TraceFormatError``."""

    def copy(self) -> Trace:
        """A cheap copy (shares the instruction list until one of them appends)."""

    def __copy__(self) -> Trace: ...
    def __deepcopy__(self, memo: dict[int, Any]) -> Trace: ...
    def __getstate__(self) -> str: ...
    def __setstate__(self, state: str) -> None: ...
    def __eq__(self, other: object, /) -> bool:
        """Equal instructions and equal decisions."""
    __hash__: ClassVar[None]  # type: ignore[assignment]

@final
class Rng:
    """Deterministic xoshiro256** generator: equal seeds give equal streams on every platform."""

    def __new__(cls, seed: int) -> Rng:
        """Seed the generator; ``seed`` must be in ``[0, 2**64)``."""

    def next_u64(self) -> int:
        """A uniform integer in ``[0, 2**64)``."""

    def randint(self, low: int, high: int) -> int:
        """A uniform integer in ``[low, high)``; ``ValueError`` if the range is empty."""

    def random(self) -> float:
        """A uniform float in ``[0, 1)``."""

    def fork(self) -> Rng:
        """A child generator with its own deterministic stream (advances this one by one step)."""

    @property
    def state(self) -> list[int]:
        """The four 64-bit state words, to resume the stream with ``from_state``."""

    @staticmethod
    def from_state(state: list[int]) -> Rng:
        """Resume a stream from ``state``; ``ValueError`` unless it is 4 words, not all zero."""

    def __getnewargs__(self) -> tuple[int]: ...
    def __getstate__(self) -> list[int]: ...
    def __setstate__(self, state: list[int]) -> None: ...
    def __eq__(self, other: object, /) -> bool:
        """Same state, i.e. the same stream from here on."""
    __hash__: ClassVar[None]  # type: ignore[assignment]

def sample_perfect_tile(
    rng: Rng, extent: int, n: int, max_innermost_factor: int, max_inner_product: int = 0
) -> list[int]:
    """Sample ``n`` factors whose product is ``extent``, the last at most ``max_innermost_factor``.

    Each prime factor of ``extent`` goes to a uniformly random position (as in MetaSchedule).
    ``max_inner_product`` bounds the product of every factor but the first. A limit ``<= 0``
    means none. ``ValueError`` if ``extent < 1``, ``n < 1``, or ``n == 1`` and ``extent``
    exceeds the innermost limit.
    """

def check_perfect_tile(
    decision: list[int], extent: int, n: int, max_innermost_factor: int, max_inner_product: int = 0
) -> None:
    """Raise ``InvalidDecisionError`` unless ``decision`` is a valid ``sample_perfect_tile`` outcome."""

def sample_categorical(rng: Rng, probs: list[float]) -> int:
    """Sample an index with probability proportional to ``probs`` (need not sum to 1).

    ``ValueError`` if ``probs`` is empty, has a negative or non-finite entry, or sums to 0.
    """

def check_categorical(decision: int, num_candidates: int) -> None:
    """Raise ``InvalidDecisionError`` unless ``0 <= decision < num_candidates``."""

@final
class DecisionSet:
    """A set of decision hashes (``Trace.decision_hash()``): what was measured, or chosen to be.

    ``evolve`` never returns a trace whose hash is in the set, and adds what it returns, so
    filling it from the database first means the same decisions are never measured twice.
    """

    def __new__(cls, hashes: Iterable[int] | None = None) -> DecisionSet: ...
    def add(self, decision_hash: int) -> bool:
        """Add a hash; True when it was new. ``OverflowError`` outside ``[0, 2**64)``."""

    def extend(self, hashes: Iterable[int]) -> int:
        """Add every hash; returns how many were new."""

    def __contains__(self, decision_hash: object, /) -> bool:
        """Whether the hash is in the set (False for anything that is not a possible hash)."""

    def __len__(self) -> int: ...

def mutate_tile_size(trace: Trace, rng: Rng) -> Trace | None:
    """Move a divisor of one level of a random ``sample_perfect_tile`` decision to another level, or trade it for one of that level's.

    The product, the number of levels (attr ``n``) and attr ``max_innermost_factor`` are
    respected; the result shares instructions with ``trace`` and differs in that one
    decision. None when no tile decision has a legal move (after a bounded number of tries).
    """

def mutate_categorical(trace: Trace, rng: Rng) -> Trace | None:
    """Change a random ``sample_categorical`` decision to another index, drawn by attr ``probs``.

    Only decisions with another candidate of positive probability qualify; None if there is none.
    """

def evolve(
    initial: Sequence[Trace],
    score: Callable[[list[Trace]], Sequence[float | None]],
    rng: Rng,
    *,
    seen: DecisionSet,
    population_size: int = 512,
    generations: int = 4,
    mutate_prob: float = 0.85,
    mutators: Sequence[tuple[str, float]] = ...,
    python_mutators: Mapping[str, _PythonMutator] | None = None,
    num_select: int = 64,
    eps_greedy: float = 0.05,
) -> list[Trace]:
    """Evolve ``initial`` by mutation under ``score`` and return up to ``num_select`` traces to measure.

    ``initial`` (e.g. the best measured traces plus fresh samples) is scored first. Each of
    ``generations`` then fills ``population_size`` slots: with probability ``mutate_prob`` a
    slot mutates a parent drawn in proportion to its score (shifted to be non-negative when
    any is negative; uniform when all are equal), using a mutator drawn by its weight in
    ``mutators``; otherwise the slot copies its parent, which adds nothing new. Children whose
    decisions were already produced in this call are dropped; the new ones are scored, and
    the best ``population_size`` of parents and children form the next population.

    ``score`` gets all new candidates of a step in one list (one call for ``initial``, then
    one per generation that produced any) and returns one score per candidate, higher is
    better, ``None`` for an invalid one (it is discarded). Python mutators (``mutators`` names
    the built-ins ``"tile_size"`` and ``"categorical"`` or keys of ``python_mutators``;
    by default ``(("tile_size", 0.9), ("categorical", 0.1))``) are
    called once per generation, one after another, each with a parent and its own ``Rng``.
    The GIL is held only for these calls.

    Of all candidates scored, those whose hash is not in ``seen`` are chosen: the best by
    score, then ``num_select * eps_greedy`` of them (rounded down, or up with the probability
    of its fraction, so the share is ``eps_greedy`` on average) uniformly at random from the
    others, all with distinct decision hashes. They are added to ``seen`` and
    returned best first, then the random ones. Equal inputs, ``rng`` state and ``score``
    give equal results; ``rng`` advances.

    Exceptions raised by ``score`` or a Python mutator propagate unchanged. ``ValueError``
    when ``score`` returns the wrong number of scores or a non-finite one, for an unknown,
    repeated or unweighted mutator name, a Python mutator named like a built-in, weights that
    are negative or sum to zero, ``population_size < 1``, or a probability outside [0, 1];
    ``TypeError`` when ``score`` or a Python mutator is not callable or returns the wrong type.
    """
