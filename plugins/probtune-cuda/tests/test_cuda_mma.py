"""mma.sync with ldmatrix: sampled against WMMA per tensorized block, rewritten by a validator, compiled to cubins here."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import categorical_sites
from probtune import Rng, Schedule
from probtune.measure.codegen import compile_for
from probtune.space.space_generator import generate_space
from probtune.targets import resolve_target
from probtune.workloads.catalog import resolve_workload
from probtune_cuda.codegen import CUDALintError
from probtune_cuda.mma import (
    INSTRUCTION_KEY,
    INT8_MMA_K,
    MMA_SYNC,
    TILE_K_KEY,
    WMMA,
    RewriteMMASync,
    instruction_choices,
    mma_names,
    tile_k_choices,
)
from probtune_cuda.software_pipeline import NO_PIPELINE, pipeline_choices
from probtune_cuda.unroll import GPU_AUTO_UNROLL

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def sm90():
    return resolve_target("cuda-sm90")


def site(trace, candidates) -> int:
    """The index of the categorical choice among ``candidates`` in a trace."""
    return categorical_sites(trace, candidates)[0]


def forced(space, trace, instruction: int):
    """``trace`` with the instruction ``instruction`` and no software pipeline, finished; None if a validator refuses it."""
    decisions = {**trace.decisions, site(trace, (WMMA, MMA_SYNC)): instruction, site(trace, pipeline_choices(90)): 0}
    assert pipeline_choices(90)[0] == NO_PIPELINE
    sch, rejected = space.realize(trace.with_decisions(decisions))
    return None if rejected else sch


def mma_source(space, target, tries: int = 30) -> tuple[str, str]:
    """The finished script and the CUDA source of a sampled program moved to mma.sync whose cubin passes the lint."""
    rng = Rng(4)
    for _ in range(tries):
        candidate = space.sample(rng)
        sch = forced(space, candidate.trace, MMA_SYNC) if candidate is not None else None
        if sch is None:
            continue
        try:
            return sch.mod.script(), compile_for(sch.mod, target).mod.imports[0].inspect_source()
        except CUDALintError:
            continue
    raise AssertionError("no mma.sync program passed the lint")


def test_float16_blocks_on_ampere_and_later_choose_between_wmma_and_mma_sync(sm90):
    assert instruction_choices("float16", 90) == instruction_choices("float16", 80) == (WMMA, MMA_SYNC)
    assert instruction_choices("float16", 75) == instruction_choices("int8", 90) == (WMMA,)  # int8: by its tiles' depth
    space = generate_space(resolve_workload("matmul", "256,256,256", "float16"), sm90, seed=0)
    choice = site(space.trace, (WMMA, MMA_SYNC))
    assert space.trace.instructions[choice + 1].attrs["ann_key"] == INSTRUCTION_KEY
    assert all(name.startswith("wmma_") and mma.startswith("mma_") for name, mma in mma_names().items())


@pytest.mark.parametrize("name,shape", [("matmul", "256,256,256"), ("dense_bias_gelu", "64,256,128")])
def test_mma_sync_programs_load_with_ldmatrix_and_keep_fragments_in_warp_registers(sm90, name, shape):
    """B laid out [K, N] (matmul) or [N, K] (dense) alike; the epilogue still runs on the way out."""
    space = generate_space(resolve_workload(name, shape, "float16"), sm90, seed=0)
    script, source = mma_source(space, sm90)
    assert 'scope="warp"' in script and "wmma" not in source.replace("_wmma_", "")  # buffer names keep their origin
    assert "ldmatrix.sync.aligned" in source and "mma.sync.aligned.m16n8k16" in source


def test_mma_sync_tiles_are_not_unrolled(sm90):
    """TVM's unrolling would leave ldmatrix's and mma's operands in local memory: the tile's sampled limit is dropped."""
    space = generate_space(resolve_workload("matmul", "256,256,256", "float16"), sm90, seed=0)
    candidate = next(c for c in (space.sample(Rng(seed)) for seed in range(1, 20)) if c is not None)
    steps = list(GPU_AUTO_UNROLL.max_steps)
    unroll = {i: steps.index(512) for i in categorical_sites(candidate.trace, steps)}
    assert unroll
    sch = forced(space, candidate.trace.with_decisions({**candidate.trace.decisions, **unroll}), MMA_SYNC)
    assert sch is not None and 'scope="warp"' in sch.mod.script() and "pragma_auto_unroll_max_step" not in sch.mod.script()


def test_the_rewrite_names_what_cannot_run_mma_sync(sm90):
    space = generate_space(resolve_workload("matmul", "256,256,256", "float16"), sm90, seed=0)
    candidate = next(c for c in (space.sample(Rng(seed)) for seed in range(1, 20)) if c is not None)
    trace = candidate.trace.with_decisions({**candidate.trace.decisions, site(candidate.trace, (WMMA, MMA_SYNC)): 1})
    raw = Schedule.replay(space.workload.mod, trace).tvm
    sm75 = dataclasses.replace(sm90, tvm_target={**sm90.tvm_target, "arch": "sm_75"})
    assert "sm_80 or later" in RewriteMMASync().check(raw.copy(), dataclasses.replace(space.context, target=sm75))
    compute = raw.get_sblock("C_o")
    raw.unannotate(compute, INSTRUCTION_KEY)
    raw.annotate(compute, INSTRUCTION_KEY, 7)
    assert "neither WMMA" in RewriteMMASync().check(raw, space.context)


def test_int8_tiles_sample_their_depth_and_32_deep_ones_run_on_mma_sync(sm90):
    """A dense layer's int8 weights W[N, K]: 16-deep tiles run on WMMA, 32-deep ones on mma.sync's m16n8k32, int32 sums."""
    assert tile_k_choices("int8", 90, trans_b=True) == (16, INT8_MMA_K)
    assert tile_k_choices("int8", 75, trans_b=True) == tile_k_choices("int8", 90, trans_b=False) == (16,)
    assert tile_k_choices("float16", 90, trans_b=True) == (16,)
    space = generate_space(resolve_workload("dense", "128,256,256", "int8"), sm90, seed=0)
    depth = site(space.trace, (16, INT8_MMA_K))
    sources = {}
    for seed in range(40):
        candidate = space.sample(Rng(seed))
        if candidate is None or (chosen := candidate.trace.decisions[depth]) in sources:
            continue
        try:
            sources[chosen] = compile_for(candidate.mod, sm90).mod.imports[0].inspect_source()
        except CUDALintError:
            continue
        if len(sources) == 2:
            break
    assert "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32" in sources[1] and "wmma" not in sources[1].replace("_wmma_", "")
    assert "wmma::mma_sync" in sources[0] and "signed char" in sources[0]


def test_int8_matmul_with_b_laid_out_k_by_n_stays_on_wmma(sm90):
    """TVM loads an int8 B[k, j] for mma.sync byte by byte into local memory: such blocks are not offered mma.sync."""
    space = generate_space(resolve_workload("matmul", "128,128,128", "int8"), sm90, seed=0)
    assert not categorical_sites(space.trace, (16, INT8_MMA_K))
    assert all(inst.attrs.get("ann_key") != TILE_K_KEY for inst in space.trace.instructions)


def test_the_rewrite_names_an_int8_tile_depth_no_instruction_runs(sm90):
    space = generate_space(resolve_workload("dense", "128,256,256", "int8"), sm90, seed=0)
    candidate = next(c for c in (space.sample(Rng(seed)) for seed in range(20)) if c is not None)
    raw = Schedule.replay(space.workload.mod, candidate.trace).tvm
    compute = raw.get_sblock("T_dense_o")
    raw.unannotate(compute, TILE_K_KEY)
    raw.annotate(compute, TILE_K_KEY, 64)
    assert "int8 tile 64 deep runs on neither" in RewriteMMASync().check(raw, space.context)
