"""VNNI: which blocks map onto ``vpdpbusd``, and programs that run it and compute the exact integer sums."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te, topi

from conftest import run_module
from probtune import Rng, generate_space
from probtune.measure.codegen import compile_for
from probtune.measure.constant_layouts import layout_copies, read_constants_packed
from probtune.plugins import get_registry
from probtune.search.search_strategy import RandomSearch
from probtune.targets import resolve_target
from probtune.workloads.workload import Workload
from probtune_cpu.host_cpu import cpu_features
from probtune_x86 import VNNI_FEATURE
from probtune_x86.features import x86_features
from probtune_x86.vnni import VNNIDotProduct, vnni_plan

HAS_VNNI = VNNI_FEATURE in cpu_features()


def _matmul(m: int, n: int, k: int, a_dtype: str = "uint8", b_dtype: str = "int8") -> Workload:
    """``int32(A @ B)`` then a float32 requantization-like epilogue (the form a quantized model's task has)."""
    a = te.placeholder((m, k), a_dtype, name="A")
    b = te.placeholder((k, n), b_dtype, name="B")
    r = te.reduce_axis((0, k), "r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r].astype("int32") * b[r, j].astype("int32"), axis=r), name="C")
    d = te.compute((m, n), lambda i, j: (c[i, j].astype("float32") * 0.01).astype("int32"), name="D")
    return Workload.from_module(te.create_prim_func([a, b, d]), name="qmatmul")


def _conv_nhwc(channels: int, filters: int, kernel: int, groups: int = 1) -> Workload:
    x = te.placeholder((1, 8, 8, channels), "uint8", name="X")
    w = te.placeholder((kernel, kernel, channels // groups, filters), "int8", name="W")
    if groups == 1:
        y = topi.nn.conv2d_nhwc(x, w, 1, kernel // 2, 1, out_dtype="int32")
    else:
        y = topi.nn.group_conv2d_nhwc(x, w, 1, kernel // 2, 1, groups, out_dtype="int32")
    return Workload.from_module(te.create_prim_func([x, w, y]), name="qconv")


def _plan(workload: Workload, name: str):
    sch = tvm.s_tir.Schedule(workload.mod)
    return vnni_plan(sch, sch.get_sblock(name))


def test_the_plan_finds_the_16_lanes_and_the_4_deep_sum():
    plan = _plan(_matmul(32, 64, 128), "C")
    assert plan is not None and plan.b_dims == (0, 1)  # B[k, j]
    conv = _conv_nhwc(32, 64, 3)
    assert _plan(conv, "conv2d_nhwc").b_dims == (2, 3)  # HWIO: input channels, then output channels


@pytest.mark.parametrize(
    "workload, block",
    [
        (lambda: _matmul(32, 64, 128, "int8", "int8"), "C"),  # vpdpbusd multiplies unsigned by signed bytes
        (lambda: _matmul(32, 24, 128), "C"),  # 24 output channels are not whole 16-lane vectors
        (lambda: _matmul(32, 64, 6), "C"),  # a 6-deep sum is not whole groups of 4
        (lambda: _conv_nhwc(32, 32, 3, groups=32), "group_conv2d_nhwc"),  # depthwise: no sum over channels
    ],
)
def test_blocks_the_instruction_does_not_fit_are_left_to_multi_level_tiling(workload, block):
    assert _plan(workload(), block) is None


def test_the_host_target_offers_vnni_where_the_cpu_has_it():
    host = resolve_target("host")
    assert (VNNIDotProduct.name in host.modules) == HAS_VNNI
    assert (VNNIDotProduct.name in resolve_target("x86-avx2").modules) is False


@pytest.mark.skipif(not HAS_VNNI, reason="this CPU has no AVX-512 VNNI")
@pytest.mark.parametrize("workload", [lambda: _matmul(28, 64, 64), lambda: _conv_nhwc(32, 32, 1)])
def test_vnni_programs_compute_the_exact_sums_with_vpdpbusd(workload):
    work = workload()
    host = resolve_target("host")
    space = generate_space(work, host)
    assert VNNIDotProduct.name in [m.name for m in space.modules]
    batch = RandomSearch(space, Rng(3)).next_batch(3)
    assert batch
    rng = np.random.default_rng(0)
    (a_shape, a_dtype), (b_shape, b_dtype), (out_shape, out_dtype) = work.param_specs()
    a = rng.integers(0, 256, a_shape).astype(a_dtype)
    b = rng.integers(-128, 128, b_shape).astype(b_dtype)
    want = run_module(compile_for(work.mod, host), [a, b, np.zeros(out_shape, out_dtype)])[2]
    for candidate in batch:
        lib = compile_for(candidate.mod, host)
        assert "vpdpbusd" in lib.mod.inspect_source("asm")
        got = run_module(lib, [a, b, np.zeros(out_shape, out_dtype)])[2]
        np.testing.assert_array_equal(got, want)


@pytest.mark.skipif(not HAS_VNNI, reason="this CPU has no AVX-512 VNNI")
def test_a_constant_weight_is_read_in_the_blocked_layout_not_copied_per_call():
    """The tensorized block matches the weight's blocked copy, so the copy is made the parameter, not inlined."""
    work = _matmul(28, 64, 64)
    host = resolve_target("host")
    rng = np.random.default_rng(1)
    (a_shape, a_dtype), (b_shape, b_dtype), (out_shape, out_dtype) = work.param_specs()
    a = rng.integers(0, 256, a_shape).astype(a_dtype)
    b = rng.integers(-128, 128, b_shape).astype(b_dtype)
    want = run_module(compile_for(work.mod, host), [a, b, np.zeros(out_shape, out_dtype)])[2]
    for candidate in RandomSearch(generate_space(work, host), Rng(5)).next_batch(2):
        program, layouts = read_constants_packed(candidate.mod, {1})
        assert list(layouts) == [1] and not layout_copies(program["main"])
        packed = layouts[1].map_tensor(tvm.runtime.tensor(b)).numpy()
        assert packed.shape == (4, 16, 16, 4)  # [j // 16, k // 4, j % 16, k % 4]
        got = run_module(compile_for(program, host), [a, packed, np.zeros(out_shape, out_dtype)])[2]
        np.testing.assert_array_equal(got, want)


@pytest.mark.skipif(not HAS_VNNI, reason="this CPU has no AVX-512 VNNI")
def test_the_cost_model_counts_the_vnni_instructions_a_program_executes():
    work = _matmul(28, 64, 64)
    host = resolve_target("host")
    vnni = RandomSearch(generate_space(work, host), Rng(3)).next_batch(1)[0]
    plain_space = generate_space(work, host, modules=[m for m in host.modules if m != VNNIDotProduct.name])
    plain = RandomSearch(plain_space, Rng(3)).next_batch(1)[0]
    assert x86_features(vnni.mod["main"])[0] == 28 * (64 // 16) * (64 // 4)  # one per 16 lanes x 4 terms
    assert x86_features(plain.mod["main"])[0] == 0
    assert get_registry().feature_extractors["x86"].columns == ("vnni_calls", "bf16_calls")
