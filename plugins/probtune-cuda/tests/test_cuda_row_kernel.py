"""One kernel per row: a block whose producers reduce its rows is computed with them, a row per thread block."""

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
from probtune_cuda.codegen import NVRTCCompiler

pytestmark = pytest.mark.filterwarnings("ignore")

SM90 = resolve_target("cuda-sm90")


def _first_draw(workload: Workload, seed: int = 0):
    space = generate_space(workload, SM90, seed=seed)
    draws = (space.sample(Rng(n)) for n in range(seed, seed + 30))
    return space, next(c for c in draws if c is not None)


def _sketch_draw(space, trace):
    """The first valid program drawn from one sketch of the space."""
    draws = (space.draw(Rng(n), trace.with_decisions({})) for n in range(30))
    return next(sch for sch, rejected in draws if rejected is None)


def _kernels(mod) -> str:
    """The CUDA source of a program's kernels, after NVRTC compiled and linted it for sm_90."""
    source = compile_for(mod, SM90).mod.imports[0].inspect_source()
    NVRTCCompiler().check(source, SM90.tvm_target)
    return source


def _kernel_count(source: str) -> int:
    return len(set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", source)))


def _extents(mod, axis: str = "threadIdx.x") -> set[int]:
    """The extents of the loops bound to ``axis``."""
    pattern = r'T.thread_binding\((?:T.int64\()?(\d+)\)?, thread="' + re.escape(axis) + '"'
    return {int(n) for n in re.findall(pattern, mod.script())}


@pytest.mark.parametrize(("op", "shape"), [("softmax", "64,1024"), ("layer_norm", "128,768"), ("softmax", "48,1500"),
                                         ("softmax", "128,16")])
def test_a_softmax_or_a_layer_norm_is_one_kernel_of_row_blocks(op, shape):
    """Its reductions, summed across the threads with warp shuffles, and the values between them are computed in
    shared memory inside the kernel that writes the output (a row of 1500 takes a thread count dividing none; a row
    of 16, an attention's over 16 keys, half a warp)."""
    workload = resolve_workload(op, shape)
    _, candidate = _first_draw(workload)
    source = _kernels(candidate.mod)
    assert _kernel_count(source) == 1
    assert "__shfl" in source and "__shared__" in source
    rows = int(shape.split(",")[0])
    assert _extents(candidate.mod, "blockIdx.x") == {rows}
    assert len(_extents(candidate.mod)) == 1  # one thread count for every block of the kernel


def test_the_thread_count_is_one_decision_that_a_mutation_changes_everywhere():
    space = generate_space(resolve_workload("softmax", "64,1024"), SM90, seed=0)
    sch = Schedule.replay(space.workload.mod, space.trace.with_decisions({}), rng=Rng(3))
    trace = sch.trace
    sites = [i for i, inst in enumerate(trace.instructions)
             if inst.kind == "sample_categorical" and min(inst.attrs["candidates"]) >= 32]
    assert len(sites) == 1
    index, taken = sites[0], trace.decisions[sites[0]]
    choices = list(trace.instructions[index].attrs["candidates"])
    other = (taken + 1) % len(choices)
    mutated = Schedule.replay(space.workload.mod, trace.with_decisions({**trace.decisions, index: other}))
    assert _extents(sch.mod) == {choices[taken]} and _extents(mutated.mod) == {choices[other]}


def _softmax_over_axis(shape: tuple[int, ...], axis: int) -> Workload:
    x = te.placeholder(shape, "float32", name="X")
    return Workload.from_module(te.create_prim_func([x, topi.nn.softmax(x, axis=axis)]), name="softmax_axis")


def test_a_softmax_over_a_middle_axis_is_left_to_the_other_bindings():
    """Its maxima and sums index (batch, column) while the output's leading loops are (batch, channel): computed per
    output row they would be recomputed once per channel, so the row kernel stays out and each block is bound alone."""
    space, candidate = _first_draw(_softmax_over_axis((2, 64, 48), axis=1))
    assert not any(inst.kind == "compute_at" for inst in space.trace.instructions)
    assert _kernel_count(_kernels(candidate.mod)) > 1


def test_a_reduction_without_a_consumer_is_left_to_the_cross_thread_reduction():
    x = te.placeholder((256, 512), "float32", name="X")
    k = te.reduce_axis((0, 512), name="k")
    total = te.compute((256,), lambda i: te.sum(x[i, k], axis=k), name="row_sum")
    space, candidate = _first_draw(Workload.from_module(te.create_prim_func([x, total]), name="row_sum"))
    assert not any(inst.kind == "compute_at" for inst in space.trace.instructions)
    assert "__shfl" in _kernels(candidate.mod)


def test_a_row_too_wide_for_shared_memory_is_left_to_the_other_bindings():
    """A softmax row of 65536 float32 exponentials takes 256 KB, past the 227 KB a Hopper block may have."""
    space = generate_space(resolve_workload("softmax", "4,65536"), SM90, seed=0)
    assert not any(inst.kind == "compute_at" for inst in space.trace.instructions)
    assert any(inst.kind == "compute_at" for inst in generate_space(resolve_workload("softmax", "4,32768"), SM90).trace.instructions)


def _layer_norm_and_cast(rows: int, columns: int) -> Workload:
    """A layer norm that returns its values and their float16 cast (:mod:`probtune.model.cast_outputs`)."""
    x = te.placeholder((rows, columns), "float32", name="X")
    gamma, beta = (te.placeholder((columns,), "float32", name=n) for n in ("gamma", "beta"))
    values = topi.nn.layer_norm(x, gamma, beta, axis=[1])
    cast = te.compute(values.shape, lambda i, j: values[i, j].astype("float16"), name="cast")
    return Workload.from_module(te.create_prim_func([x, gamma, beta, values, cast]), name="layer_norm_cast")


@pytest.mark.parametrize("shape", [(128, 768), (48, 1500)])
def test_a_layer_norm_that_also_returns_its_cast_is_one_kernel(shape):
    """TVM cannot compute the values' block at the cast's rows (it writes an output): the values' rows are bound
    instead, and each value is cast where it is computed, by the thread that computed it."""
    _, candidate = _first_draw(_layer_norm_and_cast(*shape))
    assert _kernel_count(_kernels(candidate.mod)) == 1
    assert _extents(candidate.mod, "blockIdx.x") == {shape[0]}
    script = candidate.mod.script()
    values_loop = script.index('T.sblock("T_layer_norm")')
    cast_block = script.index('T.sblock("cast")')
    assert values_loop < cast_block and "thread_binding" not in script[values_loop:cast_block]


def _mean_over_map_and_cast(shape: tuple[int, ...]) -> Workload:
    """A float16 map's mean over its height and width, summed in float32 and cast back (a squeeze-excite's pooling)."""
    x = te.placeholder(shape, "float16", name="X")
    total = topi.sum(topi.cast(x, "float32"), axis=(2, 3), keepdims=True)
    mean = topi.cast(topi.divide(total, float(shape[2] * shape[3])), "float16")
    return Workload.from_module(te.create_prim_func([x, mean]), name="mean_cast")


@pytest.mark.parametrize("shape", [(1, 32, 112, 112), (4, 64, 28, 28)])
def test_a_mean_over_a_feature_map_is_cast_in_the_kernel_that_sums_it(shape):
    """One value per row: the sum across a row's threads, and the quotient cast by one of them (the others idle
    behind a predicate), is one kernel, not a sum kernel and a cast kernel."""
    space = generate_space(_mean_over_map_and_cast(shape), SM90)
    candidate = _sketch_draw(space, space.trace)
    source = _kernels(candidate.mod)
    assert _kernel_count(source) == 1 and "__shfl" in source
    assert _extents(candidate.mod, "blockIdx.x") == {shape[0] * shape[1]}
    assert min(_extents(candidate.mod)) > 1
    (other,) = space.alternatives  # the sums per thread, for the measurements to weigh
    assert not any(inst.kind == "compute_at" for inst in other.trace.instructions)


def test_a_channels_last_mean_is_cast_in_the_kernel_that_sums_it():
    """Its rows are every loop of the cast (batch, 1, 1, channels): each row's value is one column of its own."""
    x = te.placeholder((1, 56, 56, 96), "float16", name="X")
    total = topi.sum(topi.cast(x, "float32"), axis=(1, 2), keepdims=True)
    mean = topi.cast(topi.divide(total, 56.0 * 56.0), "float16")
    space = generate_space(Workload.from_module(te.create_prim_func([x, mean]), name="mean_nhwc_cast"), SM90)
    candidate = _sketch_draw(space, space.trace)
    source = _kernels(candidate.mod)
    assert _kernel_count(source) == 1 and "__shfl" in source
    assert _extents(candidate.mod, "blockIdx.x") == {96}


def test_a_mean_of_many_short_rows_is_summed_a_row_per_thread_first():
    """1280 channels of 49 values each: the first sketch sums each channel's 49 in a thread of its own (the threads
    read adjacent channels) and casts the mean where it has it, one kernel too; the row kernel is the other sketch."""
    x = te.placeholder((1, 7, 7, 1280), "float16", name="X")
    total = topi.sum(topi.cast(x, "float32"), axis=(1, 2), keepdims=True)
    mean = topi.cast(topi.divide(total, 49.0), "float16")
    space = generate_space(Workload.from_module(te.create_prim_func([x, mean]), name="mean_nhwc_cast"), SM90)
    candidate = _sketch_draw(space, space.trace)
    assert not any(inst.kind == "compute_at" for inst in space.trace.instructions)
    assert _kernel_count(_kernels(candidate.mod)) == 1 and "__shfl" not in _kernels(candidate.mod)
    (other,) = space.alternatives
    assert any(inst.kind == "compute_at" for inst in other.trace.instructions)
