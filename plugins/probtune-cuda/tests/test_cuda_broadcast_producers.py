"""A squeeze-excite's channel scales computed inside the kernel that multiplies the feature map by them."""

from __future__ import annotations

import re

import pytest
from tvm import te, topi

from probtune import Rng
from probtune.measure.codegen import compile_for
from probtune.model.compile import default_program
from probtune.space.space_generator import generate_space
from probtune.targets import resolve_target
from probtune.workloads.catalog import resolve_workload
from probtune.workloads.workload import Workload
from probtune_cuda.codegen import NVRTCCompiler

pytestmark = pytest.mark.filterwarnings("ignore")

SM90 = resolve_target("cuda-sm90")


def _excite(size: int, channels: int, squeezed: int) -> Workload:
    """Channels-last, float16 as a model runs it: the scales sigmoid(squeezed @ W + b) in float32, the map times its
    channel's scale, cast back."""
    s = te.placeholder((1, 1, 1, squeezed), "float16", name="squeezed")
    w = te.placeholder((squeezed, channels), "float16", name="w")
    b = te.placeholder((1, 1, 1, channels), "float32", name="b")
    x = te.placeholder((1, size, size, channels), "float32", name="x")
    k = te.reduce_axis((0, squeezed), name="k")
    conv = te.compute((1, 1, 1, channels), lambda n, i, j, c: te.sum(
        s[n, i, j, k].astype("float32") * w[k, c].astype("float32"), axis=k), name="conv")
    scale = topi.sigmoid(topi.add(conv, b))
    out = te.compute(x.shape, lambda n, h, w_, c: (x[n, h, w_, c] * scale[n, 0, 0, c]).astype("float16"), name="out")
    return Workload.from_module(te.create_prim_func([s, w, b, x, out]), name="excite")


def _draw(space, trace):
    draws = (space.draw(Rng(n), trace.with_decisions({})) for n in range(30))
    return next(sch for sch, rejected in draws if rejected is None)


def _kernel_count(mod) -> int:
    source = compile_for(mod, SM90).mod.imports[0].inspect_source()
    NVRTCCompiler().check(source, SM90.tvm_target)
    return len(set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", source)))


@pytest.mark.parametrize(("size", "channels", "squeezed"), [(112, 32, 8), (28, 240, 10)])
def test_a_small_excite_is_one_kernel_first_and_two_in_its_other_sketch(size, channels, squeezed):
    space = generate_space(_excite(size, channels, squeezed), SM90)
    assert _kernel_count(_draw(space, space.trace).mod) == 1
    (other,) = space.alternatives
    assert _kernel_count(_draw(space, other.trace).mod) == 2


def test_a_wide_excite_keeps_its_scales_a_kernel_of_their_own():
    """1152 channels of 48 terms each, over a 7x7 map: recomputing the scales in every thread block would be as much
    work as the multiplication, so the module leaves the block alone."""
    space = generate_space(_excite(7, 1152, 48), SM90)
    assert not space.alternatives
    assert _kernel_count(_draw(space, space.trace).mod) == 2


def test_a_softmax_row_maximum_is_left_to_the_row_kernel():
    """The exponentials read each row's maximum broadcast, but the maximum is as much work as they are."""
    space = generate_space(resolve_workload("softmax", "64,1024"), SM90)
    assert not space.alternatives and any(inst.kind == "compute_at" for inst in space.trace.instructions)


def test_a_model_compiled_untuned_takes_the_first_sketch():
    """A task with no record runs a default program drawn from the sketch the modules rank first: here one kernel."""
    space = generate_space(_excite(56, 96, 4), SM90)
    assert space.alternatives
    assert _kernel_count(default_program(space, 0, SM90)) == 1
