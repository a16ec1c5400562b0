"""The kernel's mutators: registered through the hooks, each changes one decision legally."""

from __future__ import annotations

import dataclasses

import pytest

from probtune import Rng
from probtune.errors import ReplayError, TuningConfigError
from probtune.plugins import get_registry
from probtune.search.mutators import ComputeLocationMutator, CoreMutator
from probtune.space.space_generator import generate_space
from probtune.task.session import target_mutators
from probtune.workloads.catalog import resolve_workload


def _space(name: str, host):
    registry = get_registry()
    spec = registry.workloads[name]
    return generate_space(resolve_workload(name, spec.small_shape, "float32", registry.workloads), host)


def _sample(space, seed: int = 0):
    rng = Rng(seed)
    for _ in range(50):
        candidate = space.sample(rng)
        if candidate is not None:
            return candidate
    raise AssertionError("no valid sample")


def test_builtin_mutators_are_registered_with_weights():
    mutators = get_registry().mutators
    assert {"tile_size", "categorical", "compute_location"} <= set(mutators)
    assert mutators["tile_size"].core_mutator == "tile_size"
    assert not hasattr(mutators["compute_location"], "core_mutator")
    assert sum(m.probability for m in mutators.values()) == pytest.approx(1.0)


def test_a_target_sets_which_mutators_the_search_uses_and_their_weights(host):
    assert host.mutators == {"tile_size": 0.9, "categorical": 0.05, "compute_location": 0.05}  # the CPU plugin's
    assert [m.name for m in target_mutators(host)] == ["tile_size", "categorical", "compute_location"]
    tiles_only = dataclasses.replace(host, mutators={"tile_size": 1.0})
    assert [m.name for m in target_mutators(tiles_only)] == ["tile_size"]
    everything = dataclasses.replace(host, mutators={})
    assert [m.name for m in target_mutators(everything)] == list(get_registry().mutators)
    with pytest.raises(TuningConfigError, match=r"target 'host' names unknown mutator\(s\) warp"):
        target_mutators(dataclasses.replace(host, mutators={"warp": 1.0}))


@pytest.mark.parametrize("name", ["tile_size", "categorical"])
def test_core_mutators_change_one_decision_and_replay(name, host):
    space = _space("matmul", host)
    trace = _sample(space).trace
    mutator = get_registry().mutators[name]
    assert isinstance(mutator, CoreMutator)
    mutated = mutator.mutate(trace, Rng(3), space.context)
    assert mutated is not None
    changed = [i for i, d in trace.decisions.items() if mutated.decisions[i] != d]
    assert len(changed) == 1
    space.realize(mutated)  # a legal decision: replays without error


def test_compute_location_mutator_moves_a_block_to_another_legal_loop(host):
    space = _space("conv2d_nchw", host)
    trace = _sample(space).trace
    (site,) = [i for i in trace.sampling_indices() if trace.instruction(i).kind == "sample_compute_location"]
    mutator = ComputeLocationMutator()
    moved = set()
    for seed in range(6):
        mutated = mutator.mutate(trace, Rng(seed), space.context)
        if mutated is None:
            continue
        assert [i for i, d in trace.decisions.items() if mutated.decisions[i] != d] == [site]
        moved.add(mutated.decision(site))
        try:
            space.realize(mutated)
        except ReplayError:
            pass  # a later instruction may no longer apply; the search drops such children
    assert moved and trace.decision(site) not in moved


def test_compute_location_mutator_finds_nothing_without_such_a_decision(host):
    space = _space("matmul", host)
    assert ComputeLocationMutator().mutate(_sample(space).trace, Rng(0), space.context) is None
