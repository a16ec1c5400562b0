"""Design spaces and random search: every sample compiles and computes the right result."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
import tvm_ffi

from conftest import AnnotatedOrNot, annotated, assert_samples_correct, matmul_module
from probtune import Rng, generate_space
from probtune.errors import PluginError
from probtune.search.search_strategy import RandomSearch
from probtune.space.design_space import MAX_DRAWS
from probtune.workloads.catalog import BUILTIN_WORKLOADS
from probtune.workloads.workload import Workload
from probtune_cpu.multi_level_tiling import MultiLevelTiling
from probtune_cpu.vector_unit import vector_width

SAMPLES_PER_WORKLOAD = 3


@pytest.mark.parametrize("spec", BUILTIN_WORKLOADS, ids=lambda s: s.name)
def test_every_sample_compiles_and_is_correct(spec, host):
    workload = spec.instantiate(spec.small_shape, "float32")
    assert_samples_correct(workload, generate_space(workload, host, seed=0), host, SAMPLES_PER_WORKLOAD)


def test_matmul_space_is_tiled_parallel_and_vectorized(host):
    workload = Workload.from_module(matmul_module(64, 64, 64))
    space = generate_space(workload, host, seed=0)
    kinds = [inst.kind for inst in space.trace.instructions]
    # i, j, k tiled; j first cut into whole vectors, which the innermost j tile is fused with
    assert kinds.count("sample_perfect_tile") == 3 and kinds.count("split") == 4 and kinds.count("fuse") == 1
    for candidate in RandomSearch(space, Rng(0)).next_batch(4):
        text = candidate.mod.script()
        assert "T.parallel" in text
        lanes = [int(n) for n in re.findall(r"T\.vectorized\((\d+)\)", text)]
        assert lanes and all(n % vector_width(host) == 0 for n in lanes)


def test_strided_vector_loop_is_not_forced_to_whole_vectors_unless_packed(host):
    # dense reads W[j, k]: whole vectors along j would be gathers, so unpacked j is tiled freely (no lanes split)
    registry_spec = next(s for s in BUILTIN_WORKLOADS if s.name == "dense_bias_relu")
    workload = registry_spec.instantiate(registry_spec.small_shape, "float32")
    unpacked = generate_space(workload, host, modules=[MultiLevelTiling(pack_strided_inputs=False)])
    kinds = [inst.kind for inst in unpacked.trace.instructions]
    assert kinds.count("sample_perfect_tile") == 3 and kinds.count("split") == 3 and "fuse" not in kinds
    kinds = [inst.kind for inst in generate_space(workload, host, modules=[MultiLevelTiling()]).trace.instructions]
    assert kinds.count("sample_perfect_tile") == 3 and kinds.count("split") == 4 and kinds.count("fuse") == 1
    assert kinds.count("cache_read") == 1


def test_random_search_never_repeats_and_is_deterministic(host):
    workload = Workload.from_module(matmul_module(32, 32, 32))
    space = generate_space(workload, host, seed=0)

    def draw(seed: int) -> list[int]:
        search = RandomSearch(space, Rng(seed))
        return [c.decision_hash for c in search.next_batch(12)]

    first = draw(5)
    assert len(set(first)) == len(first) == 12
    assert first == draw(5)
    assert first != draw(6)


def test_seen_programs_are_skipped(host):
    workload = Workload.from_module(matmul_module(16, 16, 16))
    space = generate_space(workload, host, seed=0)
    first = RandomSearch(space, Rng(1)).next_batch(8)
    search = RandomSearch(space, Rng(1), seen_decisions={c.decision_hash for c in first})
    second = search.next_batch(8)
    assert not {c.decision_hash for c in second} & {c.decision_hash for c in first}


def test_small_space_runs_out(host):
    workload = Workload.from_module(matmul_module(2, 2, 2))
    space = generate_space(workload, host, seed=0)
    search = RandomSearch(space, Rng(0), max_failed_draws=64)
    drawn = search.next_batch(1000)
    assert 0 < len(drawn) < 1000  # a 2x2x2 matmul has only a handful of distinct programs


def test_unknown_module_is_named(host):
    workload = Workload.from_module(matmul_module(16, 16, 16))
    with pytest.raises(PluginError, match=r"unknown design-space module 'warp-drive'.*multi-level-tiling"):
        generate_space(workload, host, modules=["warp-drive"])


@dataclass
class ConstantPrior:
    """A module that transforms nothing and keeps each draw with probability ``weight``, counting the draws it weighs."""

    weight: float
    name: str = "constant-prior"
    calls: int = 0

    def apply(self, sch, block, ctx) -> None:
        return None

    def prior(self, sch, ctx) -> float:
        self.calls += 1
        return self.weight


@pytest.mark.parametrize(("weight", "weighed"), [(1.0, 1), (0.0, MAX_DRAWS - 1)])
def test_a_draw_the_prior_refuses_is_drawn_again_up_to_max_draws(host, weight, weighed):
    workload = Workload.from_module(matmul_module(64, 64, 64))
    prior = ConstantPrior(weight)
    space = generate_space(workload, host, modules=[MultiLevelTiling(off_register_tile_weight=1.0), prior])
    sch, rejected = space.draw(Rng(4))
    assert prior.calls == weighed  # the last draw is kept unweighed
    assert rejected is None and sch.trace.structure_hash() == space.trace.structure_hash()
    assert set(sch.trace.decisions) == set(space.trace.sampling_indices())
    assert tvm_ffi.structural_equal(space.program(sch.trace), sch.mod)  # a kept draw replays to itself
    assert space.draw(Rng(4))[0].trace == sch.trace  # deterministic


def test_priors_weigh_a_draw_once_the_modules_that_have_one_are_applied(host):
    spec = next(s for s in BUILTIN_WORKLOADS if s.name == "conv2d_nchw")
    space = generate_space(spec.instantiate(spec.small_shape, "float32"), host)
    kinds = [inst.kind for inst in space.trace.instructions]
    assert "sample_perfect_tile" not in kinds[space.prior_end :]  # multi-level tiling has a prior, and is done
    assert "sample_compute_location" in kinds[space.prior_end :]  # the padding's location is drawn only for kept draws
    assert generate_space(spec.instantiate(spec.small_shape, "float32"), host, modules=["auto-inline"]).prior_end == 0



def test_a_module_that_forks_gives_sketches_that_the_later_modules_and_draws_both_go_through(host):
    workload = Workload.from_module(matmul_module(64, 64, 64))
    space = generate_space(workload, host, modules=[AnnotatedOrNot(), MultiLevelTiling()])
    assert [annotated(sketch.trace) for sketch in space.sketches] == [False, True]
    for sketch in space.sketches:  # each sketch tiled, its own prior end after its last tile
        kinds = [inst.kind for inst in sketch.trace.instructions]
        assert kinds.count("sample_perfect_tile") == 3 and "sample_perfect_tile" not in kinds[sketch.prior_end :]
        assert sketch.prior_end > max(i for i, kind in enumerate(kinds) if kind == "sample_perfect_tile")
    drawn = [space.draw(Rng(seed)) for seed in range(12)]
    assert {annotated(sch.trace) for sch, _ in drawn} == {False, True}
    for sch, rejected in drawn:
        assert rejected is None and tvm_ffi.structural_equal(space.program(sch.trace), sch.mod)
    assert [space.draw(Rng(seed))[0].trace for seed in range(12)] == [sch.trace for sch, _ in drawn]  # deterministic


def test_a_space_without_forks_has_one_sketch(host):
    space = generate_space(Workload.from_module(matmul_module(32, 32, 32)), host)
    assert not space.alternatives and [s.trace for s in space.sketches] == [space.trace]
