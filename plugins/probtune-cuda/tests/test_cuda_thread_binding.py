"""Thread binding of the blocks no tiling takes: row reductions across threads, the rest spread with sampled threads."""

from __future__ import annotations

import re

import pytest
from tvm import te, topi

from probtune import Rng, Schedule
from probtune.measure.codegen import compile_for
from probtune.space.space_generator import generate_space
from probtune.targets import resolve_target
from probtune.workloads.catalog import resolve_workload
from probtune.workloads.workload import Workload

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def softmax_space():
    """A softmax over the middle axis, which gpu-row-kernel leaves alone (its statistics index other loops than the
    output's rows): each block is bound by itself."""
    x = te.placeholder((4, 256, 64), "float32", name="X")
    workload = Workload.from_module(te.create_prim_func([x, topi.nn.softmax(x, axis=1)]), name="softmax_axis1")
    return generate_space(workload, resolve_target("cuda-sm90"), seed=0)


def thread_count_sites(trace) -> list[int]:
    """Indices of the categorical choices of a thread count (a warp or more; unroll limits start at 0)."""
    return [i for i, inst in enumerate(trace.instructions)
            if inst.kind == "sample_categorical" and min(inst.attrs["candidates"]) >= 32]


def test_row_reductions_are_summed_across_a_blocks_threads(softmax_space):
    """softmax: each output's maximum and sum are reduced by one thread block's threads, with warp shuffles."""
    binds = [inst.attrs["thread_axis"] for inst in softmax_space.trace.instructions if inst.kind == "bind"]
    assert binds.count("threadIdx.x") >= 3  # the two reductions and the normalisation
    candidate = next(c for c in (softmax_space.sample(Rng(seed)) for seed in range(1, 20)) if c is not None)
    source = compile_for(candidate.mod, softmax_space.context.target).mod.imports[0].inspect_source()
    assert "__shfl" in source
    assert len(thread_count_sites(softmax_space.trace)) >= 3


def test_the_thread_counts_are_sampled_and_a_mutation_changes_them(softmax_space):
    """Each binding's thread count is a categorical decision: changing it (what the categorical mutator does) rebinds."""
    sch = Schedule.replay(softmax_space.workload.mod, softmax_space.trace.with_decisions({}), rng=Rng(3))
    trace = sch.trace
    index = thread_count_sites(trace)[0]
    choices = list(trace.instructions[index].attrs["candidates"])
    taken = trace.decisions[index]
    other = (taken + 1) % len(choices)
    mutated = Schedule.replay(softmax_space.workload.mod, trace.with_decisions({**trace.decisions, index: other}))

    def extents(mod) -> set[int]:
        return {int(n) for n in re.findall(r'T.thread_binding\((\d+), thread="threadIdx.x"\)', mod.script())}

    assert choices[taken] in extents(sch.mod) and choices[other] in extents(mutated.mod)


def test_blocks_the_tilings_take_are_left_to_them():
    space = generate_space(resolve_workload("matmul", "256,256,256"), resolve_target("cuda-sm90"), seed=0)
    binds = [inst.attrs["thread_axis"] for inst in space.trace.instructions if inst.kind == "bind"]
    assert binds == ["blockIdx.x", "vthread.x", "threadIdx.x"]  # the tiling's own, nothing added


def _kernels(source: str) -> set[str]:
    return set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", source))


def test_a_pooling_and_its_cast_are_one_kernel_with_the_window_maximum_in_a_register():
    """A max pool reduces a 3x3 window in each thread: the float16 cast after it is computed by the same thread (a
    ResNet stem's pool was a padding, a pooling and a cast kernel), and the padding is read through its condition."""
    x = te.placeholder((1, 16, 16, 8), "float32", name="x")
    pooled = topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "max", layout="NHWC")
    cast = te.compute(pooled.shape, lambda *i: pooled(*i).astype("float16"), name="cast")
    target = resolve_target("cuda-sm90")
    space = generate_space(Workload.from_module(te.create_prim_func([x, cast]), name="pool_cast"), target, seed=0)
    assert any(inst.kind == "reverse_compute_at" for inst in space.trace.instructions)
    for seed in range(6):
        candidate = space.sample(Rng(seed))
        assert candidate is not None
        source = compile_for(candidate.mod, target).mod.imports[0].inspect_source()
        assert len(_kernels(source)) == 1 and "pool_max_local" in source


def test_a_small_mean_its_division_and_cast_are_one_kernel():
    """A squeeze-excite's mean over a 7x7 map (too short a row to sum across threads): the sum, the division by 49
    and the cast run in the thread that sums each channel."""
    x = te.placeholder((1, 7, 7, 64), "float32", name="x")
    h, w = te.reduce_axis((0, 7), "h"), te.reduce_axis((0, 7), "w")
    total = te.compute((1, 1, 1, 64), lambda n, i, j, c: te.sum(x[n, h, w, c], axis=[h, w]), name="total")
    mean = te.compute(total.shape, lambda *i: total(*i) / 49.0, name="mean")
    cast = te.compute(mean.shape, lambda *i: mean(*i).astype("float16"), name="cast")
    target = resolve_target("cuda-sm90")
    space = generate_space(Workload.from_module(te.create_prim_func([x, cast]), name="mean_cast"), target, seed=0)
    candidate = next(c for c in (space.sample(Rng(seed)) for seed in range(10)) if c is not None)
    assert len(_kernels(compile_for(candidate.mod, target).mod.imports[0].inspect_source())) == 1
