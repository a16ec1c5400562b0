"""Search strategies: random batches, and the cost-model-guided evolutionary search."""

from __future__ import annotations

import numpy as np
import pytest

import probtune.search.search_strategy as search_module
from probtune import Rng
from probtune.plugins import get_registry
from probtune.search.mutators import compute_location_sites
from probtune.search.search_strategy import EvolutionarySearch, RandomSearch
from probtune.space.space_generator import generate_space
from probtune.workloads.catalog import resolve_workload


class LoopCountModel:
    """A transparent model for tests: predicts that programs with more loops are faster."""

    name = "loop-count"

    def __init__(self) -> None:
        self.updates: list[tuple[int, list]] = []
        self.samples = 0

    def featurize(self, programs):
        return [np.array([float(p.script().count("for "))], dtype=np.float32) for p in programs]

    def update(self, features, latencies, groups):
        assert len(features) == len(latencies) == len(groups)
        self.updates.append((len(features), list(latencies)))
        self.samples += len(features)

    def predict(self, features):
        return np.array([f[0] for f in features])

    @property
    def num_samples(self) -> int:
        return self.samples

    def save(self) -> bytes:
        return b""

    def load(self, data: bytes) -> None:
        pass


def _search(host, seed=0, model=None, **options):
    registry = get_registry()
    workload = resolve_workload("matmul", (64, 64, 64), "float32", registry.workloads)
    space = generate_space(workload, host)
    # whole random batches while untrained, unless a test asks otherwise: the tests count on their sizes
    options = {"population_size": 24, "init_samples": 12, "generations": 2, "untrained_share": 1.0, **options}
    model = model or LoopCountModel()
    search = EvolutionarySearch(
        space, Rng(seed), model, list(registry.mutators.values()), group=workload.key, **options
    )
    return search, model


def test_weights_by_name_override_the_mutators_own_probabilities(host):
    search, _ = _search(host, weights={"tile_size": 0.7})
    weights = dict(search._mutator_weights)
    assert weights["tile_size"] == 0.7
    assert weights["categorical"] == get_registry().mutators["categorical"].probability
    search.close()


def _loops(candidate) -> int:
    return candidate.mod.script().count("for ")


def test_untrained_model_gives_random_samples_then_evolution_follows_the_model(host):
    search, model = _search(host)
    first = search.next_batch(6)
    assert len(first) == 6 and len({c.decision_hash for c in first}) == 6
    search.observe([(c, 1e-3 * (i + 1)) for i, c in enumerate(first)])
    assert model.updates == [(6, [1e-3 * (i + 1) for i in range(6)])]

    second = search.next_batch(6)
    assert 0 < len(second) <= 6
    hashes = {c.decision_hash for c in first} | {c.program_hash for c in first}
    assert not any(c.decision_hash in hashes or c.program_hash in hashes for c in second)
    for candidate in second:
        search.space.program(candidate.trace)  # every chosen trace replays and passes the validators
    # The model's favourites were chosen: more loops than random samples have on average.
    random_batch = RandomSearch(search.space, Rng(99)).next_batch(12)
    exploit = second[: len(second) - 1]  # the last one may be the eps-greedy random pick
    assert np.mean([_loops(c) for c in exploit]) >= np.mean([_loops(c) for c in random_batch])


def test_an_untrained_model_gets_part_of_a_batch_at_random_then_whole_batches(host):
    search, _ = _search(host, untrained_share=0.5)
    first = search.next_batch(8)
    assert len(first) == 4
    search.observe([(c, 1e-3 * (i + 1)) for i, c in enumerate(first)])
    assert len(search.next_batch(8)) == 8
    fresh, _ = _search(host, untrained_share=0.5)
    assert len(fresh.next_batch(1)) == 1  # never nothing


@pytest.mark.parametrize("share", [0.0, 1.5])
def test_untrained_share_must_be_a_share(host, share):
    with pytest.raises(ValueError, match="untrained_share must be in"):
        _search(host, untrained_share=share)


def test_random_samples_are_a_pool_that_rotates(host):
    """The first evolutionary batch draws ``init_samples`` random samples; later ones ``fresh_per_batch``, or what refills the pool."""
    search, _ = _search(host, init_samples=12, fresh_per_batch=3)
    drawn: list[int] = []
    realize = search._realizer.realize

    def counting(jobs):
        drawn.append(sum(rng is not None for _, rng in jobs))  # a random sample comes with its generator
        return realize(jobs)

    search._realizer.realize = counting
    batch = search.next_batch(4)  # untrained: a random batch, drawn by the random search
    assert drawn == []
    expected = []
    for _ in range(3):
        search.observe([(c, 1e-3 * (i + 1)) for i, c in enumerate(batch)])
        kept = sum(search._unmeasured_and_valid(trace.decision_hash()) for trace in search._samples)
        expected.append(max(3, 12 - kept))
        batch = search.next_batch(4)
        assert batch
    assert [count for count in drawn if count] == expected
    assert expected[0] == 12 and 3 in expected[1:]


def test_the_best_unmeasured_candidates_start_the_next_population(host, monkeypatch):
    """A batch's best-scored candidates that were not chosen come right after the measured ones next time."""
    search, _ = _search(host, carry=5)
    calls: list[tuple[list, dict[int, float]]] = []

    def recording_evolve(initial, score, *args, **kwargs):
        scores: dict[int, float] = {}

        def recording_score(traces):
            result = score(traces)
            scores.update({t.decision_hash(): s for t, s in zip(traces, result) if s is not None})
            return result

        calls.append((list(initial), scores))
        return real_evolve(initial, recording_score, *args, **kwargs)

    real_evolve = search_module.evolve
    monkeypatch.setattr(search_module, "evolve", recording_evolve)
    batch = search.next_batch(4)  # random: the model is untrained
    search.observe([(c, 1e-3 * (i + 1)) for i, c in enumerate(batch)])
    batch = search.next_batch(4)
    ((_, scores),) = calls
    best_unmeasured = sorted((key for key in scores if key not in search.seen), key=lambda key: -scores[key])[:5]
    search.observe([(c, 1e-3 * (i + 1)) for i, c in enumerate(batch)])
    search.next_batch(4)
    second_initial = calls[1][0]
    measured = len(search._measured)  # the measured traces come first
    assert [t.decision_hash() for t in second_initial[measured : measured + 5]] == best_unmeasured


def test_failed_candidates_are_learned_from_as_failures(host):
    search, model = _search(host)
    batch = search.next_batch(3)
    search.observe([(batch[0], None), (batch[1], 2e-3), (batch[2], None)])
    assert model.updates == [(3, [None, 2e-3, None])]


def test_same_seed_same_batches(host):
    runs = []
    for _ in range(2):
        search, _ = _search(host, seed=7)
        first = search.next_batch(4)
        search.observe([(c, float(i + 1)) for i, c in enumerate(first)])
        runs.append([c.decision_hash for c in first + search.next_batch(4)])
    assert runs[0] == runs[1]


def test_measured_programs_are_never_offered_again(host):
    search, _ = _search(host)
    first = search.next_batch(4)
    measured = [(c.trace, float(i + 1)) for i, c in enumerate(first)]
    resumed, model = _search(
        host,
        seed=1,
        seen_decisions={c.decision_hash for c in first},
        seen_programs={c.program_hash for c in first},
        measured=measured,
    )
    model.samples = 4  # as if loaded from the database: evolve from the measured traces
    batch = resumed.next_batch(8)
    assert batch
    assert not {c.program_hash for c in batch} & {c.program_hash for c in first}


def _moved_location(trace, best) -> bool:
    """Whether ``trace`` is ``best`` with exactly one compute location changed."""
    mine, theirs = trace.decisions, best.decisions
    changed = [i for i in set(mine) | set(theirs) if mine.get(i) != theirs.get(i)]
    return len(changed) == 1 and best.instruction(changed[0]).kind == "sample_compute_location"


def _conv_search(host, sweep):
    registry = get_registry()
    workload = resolve_workload("conv2d_nhwc", "1,8,14,14,16,3,3,1,1", "float32", registry.workloads)
    space = generate_space(workload, host)
    return EvolutionarySearch(space, Rng(0), LoopCountModel(), list(registry.mutators.values()), group=workload.key,
                              population_size=24, init_samples=12, generations=2, untrained_share=1.0,
                              location_sweep=sweep)


def test_the_fastest_programs_other_compute_locations_are_measured_next(host):
    search = _conv_search(host, sweep=3)
    first = search.next_batch(8)
    placed = [c for c in first if compute_location_sites(c.trace)]
    assert placed, "the padded convolution's programs place their padding"
    best = placed[0]
    search.observe([(c, 1e-4 if c is best else 1e-3) for c in first])
    second = search.next_batch(8)
    moved = [c for c in second if _moved_location(c.trace, best.trace)]
    assert 1 <= len(moved) <= 3 and second[: len(moved)] == moved  # first in the batch, at most the sweep's share
    for candidate in moved:
        search.space.program(candidate.trace)  # a legal location: it replays and passes the validators
    search.observe([(c, 1e-3) for c in second])
    offered = list(moved)
    for _ in range(6):  # the rest of the moves follow, each offered once, until none is left
        batch = search.next_batch(8)
        offered += [c for c in batch if _moved_location(c.trace, best.trace)]
        search.observe([(c, 1e-3) for c in batch])
    assert len({c.decision_hash for c in offered}) == len(offered)
    assert best.trace.decision_hash() in search._swept
    search.close()
