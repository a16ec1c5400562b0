"""wgmma: the accumulator's fragment map, and the float16 matmul kernel that TVM emits and NVRTC assembles for sm_90a
only (its results are checked on a Hopper GPU by bench/gpu_wgmma.py)."""

from __future__ import annotations

import pytest
import tvm

from probtune_cuda.codegen import lint
from probtune_cuda.nvrtc import CUDAToolchainError, compile_cubin, kernel_resources
from probtune_cuda.wgmma import TILE, WARPGROUP, WGMMA_ARCH, accumulator_element, wgmma_matmul, wgmma_tvm_target

TARGET = wgmma_tvm_target()


@pytest.fixture(scope="module")
def source() -> str:
    executable = tvm.compile(wgmma_matmul(128, 128, 64), target=tvm.target.Target(TARGET))
    return executable.mod.imports[0].inspect_source()


def test_the_warpgroups_registers_hold_each_output_of_the_tile_once():
    rows, columns, _ = TILE
    held = [accumulator_element(t, r) for t in range(WARPGROUP) for r in range(rows * columns // WARPGROUP)]
    assert sorted(held) == [(i, j) for i in range(rows) for j in range(columns)]
    assert accumulator_element(37, 6) == (16 + 1 + 8, 8 + 2)  # warp 1, lane 5: rows 17 + 8h, columns 8j + 2 + c


def test_the_kernel_runs_wgmma_from_a_descriptor_after_the_async_proxy_fence(source):
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16" in source
    assert "fence.proxy.async.shared::cta" in source and "wgmma.wait_group.sync.aligned 0" in source
    assert "ptx_wgmma_encode_matrix_descriptor" in source


def test_nvrtc_assembles_it_for_sm90a_in_registers(source):
    _, log = compile_cubin(source, WGMMA_ARCH)
    resources = kernel_resources(log)
    assert resources and not lint(resources, TARGET, {kernel.kernel: WARPGROUP for kernel in resources})
    assert all(kernel.stack_bytes == 0 for kernel in resources)  # the 32 sums of each thread stay in registers


def test_plain_sm90_refuses_it(source):
    with pytest.raises(CUDAToolchainError, match="wgmma"):
        compile_cubin(source, "sm_90")


def test_shapes_of_partial_tiles_are_refused():
    with pytest.raises(ValueError, match="multiples of 64"):
        wgmma_matmul(96, 64, 16)
