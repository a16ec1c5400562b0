"""Search strategies: which candidates of a design space to measure next.

``RandomSearch`` replays the space with fresh decisions. ``EvolutionarySearch``
mutates the best programs found so far under a cost model, in the Rust loop of
``probtune._core.evolve``, and learns from every measurement. Both never offer
a program twice: not the same decisions, not the same program.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from probtune._core import DecisionSet, Rng, Trace, evolve
from probtune.defaults import BATCH_SIZE
from probtune.errors import NOT_REPLAYABLE
from probtune.interfaces import CostModel, Mutator
from probtune.search.mutators import compute_location_sites
from probtune.search.realize import Lend, Realized, Realizer
from probtune.space.design_space import Candidate, DesignSpace, program_hash

__all__ = ["BATCH_SIZE", "INIT_MEASURED", "EvolutionarySearch", "RandomSearch", "SearchStrategy"]

INIT_MEASURED = 32
"""How many of the fastest measured traces seed each evolutionary round."""

LOCATION_SWEEP = 4
"""A batch's share of compute-location moves of the fastest measured program (``_location_neighbours``)."""

MAX_LOCATION = 12
"""Decisions a move tries: inline (-2), the root (-1), then the consumer's first loops (replay rejects the illegal)."""


class SearchStrategy(Protocol):
    """What the tuning loop drives: ask for a batch, then report how it measured."""

    def next_batch(self, size: int) -> list[Candidate]: ...

    def observe(self, results: Sequence[tuple[Candidate, float | None]]) -> None:
        """The measured latency of each candidate of a batch (None: it failed)."""
        ...

    def close(self) -> None:
        """Stop whatever the search started (helper processes); it is not used afterwards."""
        ...


class RandomSearch:
    """Draws batches of distinct, validated candidates from a design space.

    ``seen_decisions`` and ``seen_programs`` start from what the database
    already holds, so a resumed run does not measure anything again.
    """

    def __init__(
        self,
        space: DesignSpace,
        rng: Rng,
        *,
        seen_decisions: set[int] | None = None,
        seen_programs: set[int] | None = None,
        max_failed_draws: int = 256,
    ) -> None:
        self.space = space
        self.rng = rng
        self.seen_decisions = DecisionSet(seen_decisions or ())
        self.seen_programs = set(seen_programs or ())
        self.max_failed_draws = max_failed_draws
        self.duplicates = 0

    def next_batch(self, size: int) -> list[Candidate]:
        """Up to ``size`` new candidates; fewer once ``max_failed_draws`` draws in a row give nothing new."""
        batch: list[Candidate] = []
        failed = 0
        while len(batch) < size and failed < self.max_failed_draws:
            candidate = self.space.sample(self.rng)
            if candidate is None:
                failed += 1
                continue
            if candidate.decision_hash in self.seen_decisions or candidate.program_hash in self.seen_programs:
                self.duplicates += 1
                failed += 1
                continue
            failed = 0
            self.seen_decisions.add(candidate.decision_hash)
            self.seen_programs.add(candidate.program_hash)
            batch.append(candidate)
        return batch

    def observe(self, results: Sequence[tuple[Candidate, float | None]]) -> None:
        """Random search learns nothing."""

    def close(self) -> None:
        """Nothing to stop."""


@dataclass(frozen=True)
class _Scored:
    """What scoring learned about one decision set: its program and features."""

    program_hash: int
    features: np.ndarray


class EvolutionarySearch:
    """Cost-model-guided evolutionary search (MetaSchedule's strategy, with the loop in Rust).

    Each batch: an initial population of the best measured traces of this
    workload, the previous batch's ``carry`` best-scored unmeasured
    candidates and ``init_samples`` unmeasured random samples is evolved by
    ``mutators`` (at their probability, or at ``weights`` by name: a
    target's own) for ``generations`` generations (one: see
    ``BATCH_SIZE``), scored by ``model`` in one batched call per generation
    (replay, validators and features here, in Python; mutation, dedup and
    selection in Rust). The batch is the model's
    best unmeasured candidates plus an ``eps_greedy`` share of random ones.
    A batch starts with up to ``location_sweep`` programs that move one block
    of the fastest measured program to another compute location, until all
    of its moves have been measured (:meth:`_location_neighbours`).
    Until the model has samples to learn from, batches are random samples of
    the space, and only an ``untrained_share`` of the size asked for: the
    model then guides more of a small budget, which found faster conv2d
    programs than a whole random batch did (bench/results/NOTES.md).

    Features of every scored decision set are kept (not the programs), so a
    trace met again is scored without replaying it, and a measured one is
    learned from without featurizing it again. The random samples are a
    pool that rotates: each batch draws ``fresh_per_batch`` new ones and
    drops the oldest (a fresh sample costs more to realize than a mutant and
    is itself almost never chosen; it gives the mutations new material).
    Candidates are realized by a :class:`~probtune.search.realize.Realizer` that
    shares the work with ``realize_workers`` helper processes, lent by
    ``realize_helpers`` (the builder's ``lend_workers``) or else its own,
    which :meth:`close` stops.
    """

    def __init__(
        self,
        space: DesignSpace,
        rng: Rng,
        model: CostModel,
        mutators: Sequence[Mutator],
        *,
        group: str,
        weights: Mapping[str, float] | None = None,
        seen_decisions: set[int] | None = None,
        seen_programs: set[int] | None = None,
        measured: Sequence[tuple[Trace, float]] = (),
        population_size: int = 96,
        init_samples: int = 64,
        fresh_per_batch: int = 16,
        init_measured: int = INIT_MEASURED,
        generations: int = 1,
        carry: int = 32,
        mutate_prob: float = 0.85,
        eps_greedy: float = 0.05,
        untrained_share: float = 0.5,
        max_cached: int = 16384,
        realize_workers: int = 0,
        realize_helpers: Lend | None = None,
        location_sweep: int = LOCATION_SWEEP,
    ) -> None:
        if not 0 < untrained_share <= 1:
            raise ValueError(f"untrained_share must be in (0, 1], got {untrained_share}")
        self.space = space
        self.rng = rng
        self.model = model
        self.group = group
        self.population_size = population_size
        self.init_samples = init_samples
        self.fresh_per_batch = fresh_per_batch
        self.init_measured = init_measured
        self.generations = generations
        self.carry = carry
        self.mutate_prob = mutate_prob
        self.eps_greedy = eps_greedy
        self.untrained_share = untrained_share
        self.max_cached = max_cached
        self.location_sweep = location_sweep
        self._swept: set[int] = set()  # best programs whose compute locations were all offered
        # One record of what was offered, shared with the random rounds.
        self._random = RandomSearch(space, rng, seen_decisions=seen_decisions, seen_programs=seen_programs)
        self.seen = self._random.seen_decisions
        self.seen_programs = self._random.seen_programs
        self._measured = sorted(measured, key=lambda item: item[1])[:init_measured]  # fastest first
        weights = weights or {}
        self._mutator_weights = [(m.name, float(weights.get(m.name, m.probability))) for m in mutators]
        context = space.context
        self._python_mutators = {
            m.name: (lambda trace, r, m=m: m.mutate(trace, r, context))
            for m in mutators
            if getattr(m, "core_mutator", None) is None
        }
        self._scored: OrderedDict[int, _Scored | None] = OrderedDict()  # decision hash -> None: invalid
        self._realized: dict[int, Realized] = {}  # this batch's valid candidates, and the carried ones realized here
        self._samples: deque[Trace] = deque(maxlen=init_samples)  # the pool of random samples, newest last
        self._carried: list[Trace] = []  # the last batch's best unmeasured candidates, best first
        self._batch_scores: dict[int, tuple[float, Trace]] = {}  # this batch's valid candidates by decision hash
        self._realizer = Realizer(space, model, realize_workers, realize_helpers)

    def next_batch(self, size: int) -> list[Candidate]:
        if self.model.num_samples == 0:
            return self._random.next_batch(max(1, round(size * self.untrained_share)))
        kept = [trace for trace in self._samples if self._unmeasured_and_valid(trace.decision_hash())]
        self._samples = deque(kept, maxlen=self.init_samples)
        self._samples.extend(self._fresh_samples(max(self.fresh_per_batch, self.init_samples - len(kept))))
        carried = [trace for trace in self._carried if self._unmeasured_and_valid(trace.decision_hash())]
        initial = [trace for trace, _ in self._measured] + carried + list(self._samples)
        neighbours = self._location_neighbours(min(self.location_sweep, size - 1))
        chosen = neighbours + evolve(
            initial,
            self._score,
            self.rng,
            seen=self.seen,
            population_size=self.population_size,
            generations=self.generations,
            mutate_prob=self.mutate_prob,
            mutators=self._mutator_weights,
            python_mutators=self._python_mutators or None,
            num_select=size - len(neighbours),
            eps_greedy=self.eps_greedy,
        )
        self._carry_best_unmeasured()
        keys = [trace.decision_hash() for trace in chosen]
        elsewhere = [key for key in keys if key not in self._realized or self._realized[key].mod is None]
        carried_keys = {trace.decision_hash() for trace in self._carried}
        texts = self._realizer.programs(elsewhere, keep=carried_keys)
        batch = []
        for trace in chosen:
            candidate = self._candidate(trace, texts)
            if candidate is None or candidate.program_hash in self.seen_programs:
                continue
            self.seen_programs.add(candidate.program_hash)
            batch.append(candidate)
        # the programs of the carried candidates realized here are kept: the next batch may choose them
        self._realized = {key: r for key, r in self._realized.items() if key in carried_keys and r.mod is not None}
        return batch

    def observe(self, results: Sequence[tuple[Candidate, float | None]]) -> None:
        """Train the model on the batch; the fast ones become parents of the next populations."""
        if not results:
            return
        missing = [c for c, _ in results if self._scored.get(c.decision_hash) is None]
        if missing:
            for candidate, feature in zip(missing, self.model.featurize([c.mod for c in missing])):
                self._remember(candidate.decision_hash, _Scored(candidate.program_hash, feature))
        features = [self._scored[c.decision_hash].features for c, _ in results]  # type: ignore[union-attr]
        latencies = [latency for _, latency in results]
        self.model.update(features, latencies, [self.group] * len(results))
        self._measured.extend((c.trace, latency) for c, latency in results if latency is not None)
        self._measured.sort(key=lambda item: item[1])
        del self._measured[self.init_measured :]

    def close(self) -> None:
        self._realizer.close()

    # ---- scoring ---------------------------------------------------------------
    def _carry_best_unmeasured(self) -> None:
        """Keep the batch's ``carry`` best-scored unmeasured candidates to start the next population.

        The evolution then goes on where it stopped instead of starting over
        from the measured programs: a batch needs fewer generations. Their
        features are kept, so the next batch scores them again (with the
        model retrained) without realizing them.
        """
        unmeasured = [(score, trace) for key, (score, trace) in self._batch_scores.items() if key not in self.seen]
        unmeasured.sort(key=lambda item: -item[0])  # stable: ties keep the order they were scored in
        self._carried = [trace for _, trace in unmeasured[: self.carry]]
        self._batch_scores.clear()

    def _location_neighbours(self, limit: int) -> list[Trace]:
        """Up to ``limit`` unmeasured programs that move one block of the fastest measured program elsewhere.

        A compute location changes a program's memory traffic more than the
        cost model sees (a padded copy of the input, written whole at the root
        or tile by tile inside the consumer), and mutation reaches each of the
        other locations rarely; they are measured directly instead, until each
        best program's have all been offered.
        """
        if limit <= 0 or not self._measured:
            return []
        best = self._measured[0][0]
        if best.decision_hash() in self._swept:
            return []
        decisions = best.decisions
        moved = [best.with_decisions({**decisions, site: location})
                 for site in compute_location_sites(best) for location in range(-2, MAX_LOCATION)
                 if location != decisions.get(site)]
        moved = [trace for trace in moved if trace.decision_hash() not in self.seen]
        self._score(moved)  # replays them: an illegal location is remembered as invalid
        valid = [trace for trace in moved if self._unmeasured_and_valid(trace.decision_hash())][:limit + 1]
        if len(valid) <= limit:
            self._swept.add(best.decision_hash())
        for trace in valid[:limit]:
            self.seen.add(trace.decision_hash())
        return valid[:limit]

    def _unmeasured_and_valid(self, key: int) -> bool:
        """Whether a pooled sample or carried candidate is worth evolving: unmeasured, valid, features kept."""
        return key not in self.seen and self._scored.get(key) is not None

    def _fresh_samples(self, count: int) -> list[Trace]:
        """Traces of ``count`` random points of the space (fewer: some are rejected), each from its own generator."""
        samples = []
        jobs = [(self.space.undecided(self.rng), self.rng.fork()) for _ in range(count)]
        for outcome in self._realizer.realize(jobs):
            if isinstance(outcome, Realized):
                key = outcome.trace.decision_hash()
                if key not in self._scored:
                    self._realized[key] = outcome
                    samples.append(outcome.trace)
        return samples

    def _candidate(self, trace: Trace, texts: dict[int, str]) -> Candidate | None:
        """A chosen trace's program: kept from scoring here or by a helper (``texts``), else realized again."""
        key = trace.decision_hash()
        realized = self._realized.get(key)
        if realized is not None and realized.mod is not None:
            return Candidate(trace, realized.mod, key, realized.program_hash)
        scored = self._scored.get(key)
        if key in texts and scored is not None:
            return Candidate(trace, texts[key], key, scored.program_hash)
        try:  # scored in an earlier batch, or its helper is gone
            sch, rejected = self.space.realize(trace)
        except NOT_REPLAYABLE:  # a mutation upstream made a later decision illegal
            return None
        if rejected:
            return None
        return Candidate(trace, sch.mod, key, program_hash(sch.mod))

    def _score(self, traces: list[Trace]) -> list[float | None]:
        """One batched call from the Rust loop: realize what is new (replay, validators, features), predict everything."""
        keys = [trace.decision_hash() for trace in traces]
        new: dict[int, Trace] = {}
        for trace, key in zip(traces, keys):
            if key not in self._scored and key not in self._realized:
                new.setdefault(key, trace)
        for key, outcome in zip(new, self._realizer.realize([(trace, None) for trace in new.values()])):
            if isinstance(outcome, Realized):
                self._realized[key] = outcome
            else:
                self._remember(key, None)
        programs_in_call: set[int] = set()
        for key in keys:
            if key in self._scored:
                continue
            program_hash = self._realized[key].program_hash
            measured_elsewhere = key not in self.seen and program_hash in self.seen_programs
            if measured_elsewhere or program_hash in programs_in_call:
                self._remember(key, None)  # a program already measured or scored under other decisions
                continue
            programs_in_call.add(program_hash)
            self._remember(key, _Scored(program_hash, self._realized[key].features))
        valid = [i for i, key in enumerate(keys) if self._scored.get(key) is not None]
        scores: list[float | None] = [None] * len(traces)
        if valid:
            predicted = self.model.predict([self._scored[keys[i]].features for i in valid])  # type: ignore[union-attr]
            for i, value in zip(valid, np.asarray(predicted, dtype=np.float64)):
                if np.isfinite(value):
                    scores[i] = float(value)
                    self._batch_scores[keys[i]] = (float(value), traces[i])
        return scores

    def _remember(self, key: int, scored: _Scored | None) -> None:
        self._scored[key] = scored
        self._scored.move_to_end(key)
        while len(self._scored) > self.max_cached:
            self._scored.popitem(last=False)
