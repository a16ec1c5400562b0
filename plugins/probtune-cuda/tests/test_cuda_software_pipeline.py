"""Software pipelining of tensor-core reductions: sampled per block, written as TVM's annotations, built to cubins here."""

from __future__ import annotations

import dataclasses
import re

import pytest
import tvm

from conftest import categorical_sites, multiplies_on_tensor_cores, valid_samples
from probtune import Rng, Schedule
from probtune.measure.codegen import compile_for
from probtune.space.space_generator import generate_space
from probtune.targets import resolve_target
from probtune.workloads.catalog import resolve_workload
from probtune_cuda.codegen import CUDALintError
from probtune_cuda.lowering import build_options
from probtune_cuda.software_pipeline import (
    ASYNC_COPY,
    NO_PIPELINE,
    PIPELINE_KEY,
    REGISTER_STAGED,
    RewriteSoftwarePipeline,
    pipeline_choices,
    uses_async_copies,
)
from probtune_cuda.tensor_core import shared_memory_bytes

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def sm90():
    return resolve_target("cuda-sm90")


@pytest.fixture(scope="module")
def matmul_space(sm90):
    return generate_space(resolve_workload("matmul", "512,512,512", "float16"), sm90, seed=0)


def pipeline_site(trace) -> int:
    """The index of the tensor-core tiling's pipeline choice in a trace."""
    return categorical_sites(trace, pipeline_choices(90))[0]


def with_buffers(space, buffers: int, target=None, tries: int = 40):
    """A finished candidate of ``space`` whose pipeline decision is ``buffers`` and whose loops let it pipeline.

    With ``target``, one whose build passes the cubin lint, and its CUDA source.
    """
    rng = Rng(3)
    for _ in range(tries):
        candidate = space.sample(rng)
        if candidate is None:
            continue
        trace = candidate.trace
        site = pipeline_site(trace)
        forced = trace.with_decisions({**trace.decisions, site: pipeline_choices(90).index(buffers)})
        sch, rejected = space.realize(forced)
        if rejected is not None or (buffers != NO_PIPELINE and "software_pipeline_stage" not in sch.mod.script()):
            continue
        source = linted_source(sch.mod, target) if target is not None else ""
        if source is not None:
            return sch, source
    raise AssertionError(f"no candidate pipelines with {buffers} buffers")


def linted_source(mod, target) -> str | None:
    try:
        return compile_for(mod, target).mod.imports[0].inspect_source()
    except CUDALintError:
        return None


def test_the_tiling_samples_the_pipeline_on_its_outer_reduction_loop(matmul_space):
    site = pipeline_site(matmul_space.trace)
    annotate = next(inst for inst in matmul_space.trace.instructions[site:] if inst.kind == "annotate")
    assert annotate.attrs["ann_key"] == PIPELINE_KEY
    assert pipeline_choices(80) == pipeline_choices(90) == (NO_PIPELINE, REGISTER_STAGED, ASYNC_COPY)
    assert pipeline_choices(75) == (NO_PIPELINE, REGISTER_STAGED)  # no cp.async before Ampere


def test_asynchronous_copies_become_cp_async_three_tiles_deep(matmul_space, sm90):
    sch, source = with_buffers(matmul_space, ASYNC_COPY, sm90)
    assert PIPELINE_KEY not in sch.mod.script() and uses_async_copies(sch.mod)
    with build_options(sch.mod):
        assert tvm.transform.PassContext.current().config["tirx.use_async_copy"]
    assert re.search(r"cp\.async\.c[ag]\.shared\.global", source)  # .ca below 16 bytes a copy
    assert "cp.async.commit_group" in source and "cp.async.wait_group" in source
    assert multiplies_on_tensor_cores(source)


def test_register_staged_copies_double_buffer_through_registers(matmul_space, sm90):
    sch, source = with_buffers(matmul_space, REGISTER_STAGED, sm90)
    script = sch.mod.script()
    assert "tirx.manifest_shared_memory_local_stage" in script and not uses_async_copies(sch.mod)
    assert "_local" in source and "cp.async" not in source


def test_pipelined_operands_take_a_shared_buffer_per_stage(matmul_space):
    """The prior's shared-memory count multiplies the operand tiles by the sampled buffers (the output is staged after)."""
    sch, _ = with_buffers(matmul_space, NO_PIPELINE)
    site = pipeline_site(sch.trace)
    sizes = {}
    for buffers in (NO_PIPELINE, REGISTER_STAGED, ASYNC_COPY):
        trace = sch.trace.with_decisions({**sch.trace.decisions, site: pipeline_choices(90).index(buffers)})
        raw = Schedule.replay(matmul_space.workload.mod, trace, until=matmul_space.prior_end).tvm
        sizes[buffers] = shared_memory_bytes(raw)
    operands = sizes[ASYNC_COPY] - sizes[REGISTER_STAGED]
    assert sizes[ASYNC_COPY] == 3 * operands and sizes[REGISTER_STAGED] == 2 * operands
    output = 4 * int(raw.get(raw.get_loops(raw.get_sblock("C_shared.dyn"))[-1]).extent)  # float32, staged once
    assert sizes[NO_PIPELINE] == max(operands, output)


def test_a_reduction_of_one_tile_is_not_pipelined(sm90):
    space = generate_space(resolve_workload("matmul", "64,64,16", "float16"), sm90, seed=0)
    found = valid_samples(space, 6, tries=60)
    assert len(found) == 6
    assert any(found_trace_buffers(c.trace) != NO_PIPELINE for c in found)  # pipelines were sampled ...
    assert not any("software_pipeline" in c.mod.script() for c in found)  # ... and nothing was there to overlap


def found_trace_buffers(trace) -> int:
    return pipeline_choices(90)[trace.decisions[pipeline_site(trace)]]


def test_the_rewrite_names_what_it_cannot_pipeline(matmul_space, sm90):
    sm75 = dataclasses.replace(sm90, tvm_target={**sm90.tvm_target, "arch": "sm_75"})
    ctx = dataclasses.replace(matmul_space.context, target=sm75)
    candidate = valid_samples(matmul_space, 1)[0]
    site = pipeline_site(candidate.trace)
    trace = candidate.trace.with_decisions({**candidate.trace.decisions, site: pipeline_choices(90).index(ASYNC_COPY)})
    raw = Schedule.replay(matmul_space.workload.mod, trace).tvm
    assert "sm_80 or later" in RewriteSoftwarePipeline().check(raw.copy(), ctx)
    grid = raw.get_loops(raw.get_sblock("C_shared.dyn"))[0]  # not a reduction loop
    raw.annotate(grid, PIPELINE_KEY, REGISTER_STAGED)
    assert "does not hold two operand copies" in RewriteSoftwarePipeline().check(raw, matmul_space.context)
