"""GPU unrolling: a sampled limit becomes the pragmas TVM's lowering reads, tensor-core tiles included."""

from __future__ import annotations

import pytest

from conftest import categorical_sites
from probtune import Rng
from probtune.space.space_generator import generate_space
from probtune.targets import resolve_target
from probtune.workloads.catalog import resolve_workload
from probtune_cuda.mma import MMA_SYNC, WMMA
from probtune_cuda.unroll import GPU_AUTO_UNROLL

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.mark.parametrize("dtype", ["float32", "float16"])  # thread tiling; tensor cores, whose tile keeps the limit
def test_a_sampled_unroll_limit_reaches_the_kernel_s_outer_loop(dtype):
    space = generate_space(resolve_workload("matmul", "256,256,256", dtype), resolve_target("cuda-sm90"), seed=0)
    steps = list(GPU_AUTO_UNROLL.max_steps)
    sites = categorical_sites(space.trace, steps)
    wmma = dict.fromkeys(categorical_sites(space.trace, (WMMA, MMA_SYNC)), WMMA)  # mma.sync tiles stay rolled
    candidate = next(c for c in (space.sample(Rng(seed)) for seed in range(1, 20)) if c is not None)
    for step in (0, 512):
        decisions = {**candidate.trace.decisions, **wmma, **{i: steps.index(step) for i in sites}}
        trace = candidate.trace.with_decisions(decisions)
        sch, rejected = space.realize(trace)
        assert rejected is None
        script = sch.mod.script()
        assert ('"pragma_auto_unroll_max_step": 512' in script) == (step == 512), script[:2000]
