"""AVX512-BF16: which blocks map onto ``vdpbf16ps``, and programs that run it and compute float32 sums of bf16 products."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import te, topi

import probtune
from conftest import run_module
from probtune import Rng, generate_space
from probtune.measure.codegen import compile_for
from probtune.measure.constant_layouts import layout_copies, read_constants_packed
from probtune.search.search_strategy import RandomSearch
from probtune.targets import resolve_target
from probtune.workloads.workload import Workload
from probtune_cpu.host_cpu import cpu_features
from probtune_x86 import BF16_FEATURE
from probtune_x86.bf16 import BF16, BF16DotProduct
from probtune_x86.dot_product import dot_plan
from probtune_x86.features import x86_features

HAS_BF16 = BF16_FEATURE in cpu_features()


def _matmul(m: int, n: int, k: int, dtype: str = "bfloat16", transposed: bool = False) -> Workload:
    """``float32(A) @ float32(B)`` plus a bias (the form a bf16 model's task has); B as [n, k] when ``transposed``."""
    a = te.placeholder((m, k), dtype, name="A")
    b = te.placeholder((n, k) if transposed else (k, n), dtype, name="B")
    r = te.reduce_axis((0, k), "r")

    def product(i, j):
        w = b[j, r] if transposed else b[r, j]
        return te.sum(a[i, r].astype("float32") * w.astype("float32"), axis=r)

    c = te.compute((m, n), product, name="C")
    d = te.compute((m, n), lambda i, j: c[i, j] + 0.5, name="D")
    return Workload.from_module(te.create_prim_func([a, b, d]), name="bf16_matmul")


def _conv_nhwc(channels: int, filters: int, kernel: int, groups: int = 1) -> Workload:
    x = te.placeholder((1, 8, 8, channels), "bfloat16", name="X")
    w = te.placeholder((kernel, kernel, channels // groups, filters), "bfloat16", name="W")
    if groups == 1:
        y = topi.nn.conv2d_nhwc(x, w, 1, kernel // 2, 1, out_dtype="float32")
    else:
        y = topi.nn.group_conv2d_nhwc(x, w, 1, kernel // 2, 1, groups, out_dtype="float32")
    return Workload.from_module(te.create_prim_func([x, w, y]), name="bf16_conv")


def _plan(workload: Workload, name: str):
    sch = tvm.s_tir.Schedule(workload.mod)
    return dot_plan(sch, sch.get_sblock(name), BF16)


def _bf16(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)


def test_the_plan_finds_the_16_lanes_and_the_2_deep_sum():
    assert _plan(_matmul(32, 64, 128), "C").b_dims == (0, 1)  # B[k, j]
    assert _plan(_matmul(32, 64, 128, transposed=True), "C").b_dims == (1, 0)  # B[j, k], as ONNX Gemm's transB
    assert _plan(_conv_nhwc(32, 64, 3), "conv2d_nhwc").b_dims == (2, 3)  # HWIO: input channels, then output channels


@pytest.mark.parametrize(
    "workload, block",
    [
        (lambda: _matmul(32, 64, 128, "float32"), "C"),  # float32 operands: the instruction reads bf16
        (lambda: _matmul(32, 24, 128), "C"),  # 24 output channels are not whole 16-lane vectors
        (lambda: _matmul(32, 64, 7), "C"),  # a 7-deep sum is not whole pairs
        (lambda: _conv_nhwc(32, 32, 3, groups=32), "group_conv2d_nhwc"),  # depthwise: no sum over channels
    ],
)
def test_blocks_the_instruction_does_not_fit_are_left_to_multi_level_tiling(workload, block):
    assert _plan(workload(), block) is None


def test_the_host_target_offers_bf16_where_the_cpu_has_it():
    host = resolve_target("host")
    assert (BF16DotProduct.name in host.modules) == HAS_BF16
    assert ("bf16" in host.precisions) == HAS_BF16
    avx2 = resolve_target("x86-avx2")
    assert BF16DotProduct.name not in avx2.modules and "bf16" not in avx2.precisions


@pytest.mark.skipif(not HAS_BF16, reason="this CPU has no AVX512-BF16")
@pytest.mark.parametrize(
    "workload", [lambda: _matmul(28, 64, 64), lambda: _matmul(28, 32, 64, transposed=True), lambda: _conv_nhwc(32, 32, 3)]
)
def test_bf16_programs_sum_the_products_in_float32_with_vdpbf16ps(workload):
    work = workload()
    host = resolve_target("host")
    space = generate_space(work, host)
    assert BF16DotProduct.name in [m.name for m in space.modules]
    batch = RandomSearch(space, Rng(3)).next_batch(3)
    assert batch
    rng = np.random.default_rng(0)
    (a_shape, _), (b_shape, _), (out_shape, out_dtype) = work.param_specs()
    a, b = _bf16(rng, a_shape), _bf16(rng, b_shape)
    want = run_module(compile_for(work.mod, host), [a, b, np.zeros(out_shape, out_dtype)])[2]
    for candidate in batch:
        lib = compile_for(candidate.mod, host)
        asm = lib.mod.inspect_source("asm")
        assert "vdpbf16ps" in asm and "probtune_x86_dpbf16ps" not in asm  # the linked function is inlined
        got = run_module(lib, [a, b, np.zeros(out_shape, out_dtype)])[2]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)  # the same products, summed in another order


@pytest.mark.skipif(not HAS_BF16, reason="this CPU has no AVX512-BF16")
def test_a_constant_weight_is_read_in_the_blocked_layout_not_copied_per_call():
    work = _matmul(28, 64, 64)
    host = resolve_target("host")
    rng = np.random.default_rng(1)
    (a_shape, _), (b_shape, _), (out_shape, out_dtype) = work.param_specs()
    a, b = _bf16(rng, a_shape), _bf16(rng, b_shape)
    want = run_module(compile_for(work.mod, host), [a, b, np.zeros(out_shape, out_dtype)])[2]
    for candidate in RandomSearch(generate_space(work, host), Rng(5)).next_batch(2):
        program, layouts = read_constants_packed(candidate.mod, {1})
        assert list(layouts) == [1] and not layout_copies(program["main"])
        packed = layouts[1].map_tensor(tvm.runtime.tensor(b)).numpy()
        assert packed.shape == (4, 32, 16, 2)  # [j // 16, k // 2, j % 16, k % 2]
        got = run_module(compile_for(program, host), [a, packed, np.zeros(out_shape, out_dtype)])[2]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(not HAS_BF16, reason="this CPU has no AVX512-BF16")
def test_the_cost_model_counts_the_bf16_instructions_a_program_executes():
    work = _matmul(28, 64, 64)
    host = resolve_target("host")
    tiled = RandomSearch(generate_space(work, host), Rng(3)).next_batch(1)[0]
    plain_space = generate_space(work, host, modules=[m for m in host.modules if m != BF16DotProduct.name])
    plain = RandomSearch(plain_space, Rng(3)).next_batch(1)[0]
    assert list(x86_features(tiled.mod["main"])) == [0, 28 * (64 // 16) * (64 // 2)]  # one per 16 lanes x 2 terms
    assert list(x86_features(plain.mod["main"])) == [0, 0]


@pytest.mark.skipif(not HAS_BF16, reason="this CPU has no AVX512-BF16")
def test_programs_realized_in_helper_processes_are_tensorized_there(tmp_path):
    """The search's helpers replay traces without the tiling that registered the intrinsic: the layout rewrite
    registers it there, so no candidate is dropped for an intrinsic the process does not know."""
    result = probtune.tune(_matmul(64, 64, 64), "host", 16, database=tmp_path / "t.db", batch_size=8)
    assert result.best is not None and "rewrite-cpu-tensorize" not in result.rejections

