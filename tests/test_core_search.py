"""The search half of probtune._core: decision mutators, DecisionSet and the evolve loop."""

from __future__ import annotations

import math

import pytest

from probtune._core import (
    DecisionSet,
    Rng,
    Trace,
    check_perfect_tile,
    evolve,
    mutate_categorical,
    mutate_tile_size,
    sample_categorical,
    sample_perfect_tile,
)

I_TILE, J_TILE, UNROLL, LOCATION = 2, 4, 6, 7


def matmul_like_trace() -> Trace:
    """Two tiled loops (512 into 4 levels, 256 into 2), an unroll choice and a compute location."""
    trace = Trace()
    trace.append("get_sblock", [], {"name": "C", "func_name": "main"}, [0])
    trace.append("get_loops", [{"rv": 0}], {}, [1, 2, 3])
    trace.append("sample_perfect_tile", [{"rv": 1}], {"n": 4, "max_innermost_factor": 16}, [4, 5, 6, 7], [8, 8, 8, 1])
    trace.append("split", [{"rv": 1}, [{"rv": i} for i in (4, 5, 6, 7)]], {}, [8, 9, 10, 11])
    trace.append("sample_perfect_tile", [{"rv": 2}], {"n": 2, "max_innermost_factor": 64}, [12, 13], [256, 1])
    trace.append("split", [{"rv": 2}, [{"rv": 12}, {"rv": 13}]], {}, [14, 15])
    trace.append("sample_categorical", [], {"candidates": [0, 16, 64, 512], "probs": [0.25] * 4}, [16], 0)
    trace.append("sample_compute_location", [{"rv": 0}], {}, [17], 0)
    return trace


def fresh_samples(count: int, seed: int) -> list[Trace]:
    """Random points of the space, like the fresh samples a search starts from."""
    base, rng = matmul_like_trace(), Rng(seed)
    return [
        base.with_decisions(
            {
                I_TILE: sample_perfect_tile(rng, 512, 4, 16),
                J_TILE: sample_perfect_tile(rng, 256, 2, 64),
                UNROLL: sample_categorical(rng, [0.25] * 4),
                LOCATION: 0,
            }
        )
        for _ in range(count)
    ]


def inner_product_score(trace: Trace) -> float:
    """Best (0) when the two inner levels of the i tiling multiply to 32."""
    tiles = trace.decision(I_TILE)
    return -abs(tiles[-1] * tiles[-2] - 32)


class Scorer:
    """Scores a batch with a per-trace function and records each batch."""

    def __init__(self, per_trace=inner_product_score):
        self.per_trace = per_trace
        self.batches: list[list[Trace]] = []

    def __call__(self, batch: list[Trace]) -> list[float | None]:
        assert isinstance(batch, list) and all(isinstance(t, Trace) for t in batch)
        self.batches.append(batch)
        return [self.per_trace(trace) for trace in batch]


def run(seed: int = 0, *, score=None, seen: DecisionSet | None = None, initial=None, **options) -> list[Trace]:
    options = {"population_size": 64, "generations": 4, "num_select": 16, **options}
    return evolve(
        fresh_samples(32, 100) if initial is None else initial,
        score or Scorer(),
        Rng(seed),
        seen=DecisionSet() if seen is None else seen,
        **options,
    )


# ---- mutators ---------------------------------------------------------------------------


def changed(before: Trace, after: Trace) -> list[int]:
    return [i for i, d in before.decisions.items() if after.decisions[i] != d]


def test_mutate_tile_size_keeps_the_product_and_the_innermost_limit():
    trace = matmul_like_trace()
    for seed in range(300):
        mutated = mutate_tile_size(trace, Rng(seed))
        assert mutated is not None
        (index,) = changed(trace, mutated)
        attrs = trace.instruction(index).attrs
        old, new = trace.decision(index), mutated.decision(index)
        check_perfect_tile(new, math.prod(old), attrs["n"], attrs["max_innermost_factor"])


def test_mutate_tile_size_is_none_without_a_legal_move():
    trace = Trace()
    trace.append("get_sblock", [], {"name": "C"}, [0])
    trace.append("get_loops", [{"rv": 0}], {}, [1])
    trace.append("sample_perfect_tile", [{"rv": 1}], {"n": 2, "max_innermost_factor": 1}, [2, 3], [8, 1])
    assert mutate_tile_size(trace, Rng(0)) is None
    assert mutate_tile_size(Trace(), Rng(0)) is None


def test_mutate_categorical_picks_another_candidate():
    trace = matmul_like_trace()
    picked = set()
    for seed in range(100):
        mutated = mutate_categorical(trace, Rng(seed))
        assert changed(trace, mutated) == [UNROLL]
        picked.add(mutated.decision(UNROLL))
    assert picked == {1, 2, 3}


def test_mutate_categorical_is_none_without_an_alternative():
    trace = Trace()
    trace.append("sample_categorical", [], {"candidates": [0, 16], "probs": [1.0, 0.0]}, [0], 0)
    assert mutate_categorical(trace, Rng(0)) is None


# ---- DecisionSet ------------------------------------------------------------------------


def test_decision_set_behaves_like_a_set_of_hashes():
    seen = DecisionSet([1, 2, 2])
    assert len(seen) == 2
    assert seen.add(3) is True
    assert seen.add(3) is False
    assert seen.extend(iter([3, 4, 2**64 - 1])) == 2
    assert 2**64 - 1 in seen and 5 not in seen
    assert -1 not in seen and "1" not in seen
    with pytest.raises(OverflowError):
        seen.add(-1)
    assert repr(seen) == "DecisionSet(5 hashes)"


# ---- evolve -----------------------------------------------------------------------------


def test_evolve_improves_over_generations():
    rng = Rng(7)

    def with_inner_ones(trace):
        """The worst start: both inner levels 1, so the target 32 is 5 moves away."""
        return trace.with_decisions({**trace.decisions, I_TILE: [*sample_perfect_tile(rng, 512, 2, 0), 1, 1]})

    poor = [with_inner_ones(t) for t in fresh_samples(32, 100)]
    scorer = Scorer()
    selected = run(score=scorer, initial=poor, generations=6)
    best_per_batch = [max(inner_product_score(t) for t in batch) for batch in scorer.batches]
    mean_per_batch = [sum(map(inner_product_score, b)) / len(b) for b in scorer.batches]
    assert best_per_batch[-1] == 0 > best_per_batch[0]
    assert mean_per_batch[-1] > mean_per_batch[0]
    assert inner_product_score(selected[0]) == 0


def test_score_is_called_once_per_generation_with_the_whole_batch():
    scorer = Scorer()
    run(score=scorer, generations=3)
    assert len(scorer.batches) == 1 + 3
    assert len(scorer.batches[0]) == len({t.decision_hash() for t in fresh_samples(32, 100)}), "duplicates scored once"
    assert all(len(batch) > 20 for batch in scorer.batches[1:])
    hashes = [t.decision_hash() for batch in scorer.batches for t in batch]
    assert len(hashes) == len(set(hashes)), "nothing is scored twice"


def test_none_scores_are_dropped():
    def reject_unroll_zero(trace):
        return None if trace.decision(UNROLL) == 0 else inner_product_score(trace)

    scorer = Scorer(reject_unroll_zero)
    selected = run(score=scorer, num_select=64, eps_greedy=0.5)
    assert len(selected) == 64
    assert all(t.decision(UNROLL) != 0 for t in selected)
    assert any(t.decision(UNROLL) == 0 for batch in scorer.batches for t in batch)


def test_python_mutators_are_called_in_a_batch_per_generation():
    events: list[str] = []

    def score(batch):
        events.append("score")
        return [inner_product_score(t) for t in batch]

    def compute_location(trace, rng):
        assert isinstance(trace, Trace) and isinstance(rng, Rng)
        events.append("mutate")
        return trace.with_decisions({**trace.decisions, LOCATION: rng.randint(0, 4)})

    selected = run(
        score=score,
        mutators=[("tile_size", 0.5), ("compute_location", 0.5)],
        python_mutators={"compute_location": compute_location},
        generations=3,
        num_select=64,
    )
    runs = "".join("s" if e == "score" else "m" for e in events)
    assert runs.replace("m", "") == "ssss"
    blocks = runs.split("s")
    assert blocks[0] == "" and all(len(block) > 10 for block in blocks[1:-1]), "one run of mutations per generation"
    assert blocks[-1] == ""
    assert {t.decision(LOCATION) for t in selected} > {0}


def test_python_mutator_may_find_nothing():
    def nothing(trace, rng):
        return None

    scorer = Scorer()
    run(score=scorer, mutators=[("nothing", 1.0)], python_mutators={"nothing": nothing})
    assert len(scorer.batches) == 1, "no new children, no further scoring"


class Boom(Exception):
    pass


def test_exceptions_from_score_propagate_unchanged():
    error = Boom("from score")

    def score(batch):
        raise error

    with pytest.raises(Boom) as raised:
        run(score=score)
    assert raised.value is error


def test_exceptions_from_python_mutators_propagate_unchanged():
    def broken(trace, rng):
        raise Boom("from mutator")

    with pytest.raises(Boom, match="from mutator"):
        run(mutators=[("broken", 1.0)], python_mutators={"broken": broken})


def test_score_of_the_wrong_length_is_a_value_error_naming_the_lengths():
    with pytest.raises(ValueError, match="score returned 3 scores for 8 candidates"):
        run(score=lambda batch: [0.0, 0.0, 0.0], initial=fresh_samples(8, 1))
    with pytest.raises(ValueError, match="NaN for candidate 0"):
        run(score=lambda batch: [math.nan] * len(batch))
    with pytest.raises(TypeError, match="sequence of float or None"):
        run(score=lambda batch: ["fast"] * len(batch))


def test_seen_decisions_are_never_returned_and_returned_ones_are_recorded():
    initial = fresh_samples(32, 100)
    seen = DecisionSet(t.decision_hash() for t in initial[:8])
    before = len(seen)
    first = run(seen=seen, initial=initial)
    first_hashes = {t.decision_hash() for t in first}
    assert len(first_hashes) == len(first) == 16
    assert not first_hashes & {t.decision_hash() for t in initial[:8]}
    assert len(seen) == before + 16 and all(h in seen for h in first_hashes)
    second = run(seen=seen, initial=initial)
    assert not {t.decision_hash() for t in second} & first_hashes


def test_returns_at_most_num_select_with_the_eps_greedy_split():
    scorer = Scorer()
    selected = run(score=scorer, num_select=20, eps_greedy=0.25)
    assert len(selected) == 20
    every_score = sorted((inner_product_score(t) for b in scorer.batches for t in b), reverse=True)
    assert [inner_product_score(t) for t in selected[:15]] == every_score[:15]
    tiny_space = Trace()
    tiny_space.append("get_sblock", [], {"name": "C"}, [0])
    tiny_space.append("get_loops", [{"rv": 0}], {}, [1])
    tiny_space.append("sample_perfect_tile", [{"rv": 1}], {"n": 2, "max_innermost_factor": 0}, [2, 3], [2, 2])
    assert len(run(initial=[tiny_space], score=lambda b: [0.0] * len(b))) == 3


def test_evolve_is_deterministic_per_seed():
    def once(seed):
        rng = Rng(seed)
        selected = evolve(fresh_samples(32, 100), Scorer(), rng, seen=DecisionSet(), population_size=64, num_select=16)
        return [t.to_json() for t in selected], rng.state

    assert once(1) == once(1)
    assert once(1)[0] != once(2)[0]
    assert once(1)[1] != Rng(1).state, "the generator advances"


def test_empty_initial_population_returns_nothing():
    scorer = Scorer()
    assert run(initial=[], score=scorer) == []
    assert scorer.batches == []


@pytest.mark.parametrize(
    ("options", "error", "fragment"),
    [
        ({"mutators": [("shuffle", 1.0)]}, ValueError, "unknown mutator 'shuffle'"),
        ({"mutators": [("tile_size", 1.0), ("tile_size", 2.0)]}, ValueError, "two weights"),
        ({"python_mutators": {"extra": lambda t, r: None}}, ValueError, "'extra' has no weight"),
        ({"python_mutators": {"tile_size": lambda t, r: None}}, ValueError, "name of a built-in"),
        ({"mutators": [("x", 1.0)], "python_mutators": {"x": 3}}, TypeError, "not callable"),
        ({"mutators": [("tile_size", 0.0)]}, ValueError, "positive sum"),
        ({"mutators": [("tile_size", -1.0)]}, ValueError, "finite and >= 0"),
        ({"mutate_prob": 2.0}, ValueError, "mutate_prob must be in"),
        ({"population_size": 0}, ValueError, "population_size"),
        ({"score": "not callable"}, TypeError, "score must be callable"),
    ],
)
def test_bad_arguments_are_rejected(options, error, fragment):
    with pytest.raises(error, match=fragment):
        run(**options)


def test_python_mutator_returning_the_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match="'bad' returned int, expected Trace or None"):
        run(mutators=[("bad", 1.0)], python_mutators={"bad": lambda trace, rng: 1})
