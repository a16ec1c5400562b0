"""CUDA candidates compiled to cubins here with NVRTC, and linted: spills, local memory, registers."""

from __future__ import annotations

import pytest
import tvm

from probtune import Rng, Schedule
from probtune.measure.codegen import compile_for
from probtune.space.space_generator import generate_space
from probtune.targets import resolve_target
from probtune.workloads.catalog import resolve_workload
from probtune_cuda import nvrtc
from probtune_cuda.codegen import CUDALintError, lint
from probtune_cuda.nvrtc import CUDAToolchainError, KernelResources, compile_cubin, kernel_resources

pytestmark = pytest.mark.filterwarnings("ignore")

PTXAS_LOG = """ptxas info    : 45 bytes gmem
ptxas info    : Compiling entry function 'main_kernel' for 'sm_80'
ptxas info    : Function properties for main_kernel
ptxas         .     624 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 624 bytes cumulative stack size, 12288 bytes smem, 376 bytes cmem[0]
ptxas info    : Compiling entry function 'tail_kernel' for 'sm_80'
ptxas info    : Function properties for tail_kernel
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 16 registers, used 0 barriers, 376 bytes cmem[0]
"""


def test_ptxas_report_is_read_per_kernel():
    assert kernel_resources(PTXAS_LOG) == [
        KernelResources("main_kernel", 255, 624, 8, 4, 12288),
        KernelResources("tail_kernel", 16, 0, 0, 0, 0),
    ]


def test_lint_names_spills_local_memory_and_registers_beyond_the_block():
    target = {"registers_per_block": 65536}
    problems = lint(kernel_resources(PTXAS_LOG), target, {"main_kernel": 512, "tail_kernel": 1024})
    assert problems == [
        "main_kernel spills registers (8 bytes stored, 4 loaded)",
        "main_kernel keeps 624 bytes in local memory (a stack frame)",
        "main_kernel needs 255 registers x 512 threads, more than the 65536 of a block",
    ]
    clean = [KernelResources("k", 64, 0, 0, 0, 1024)]
    assert lint(clean, target, {"k": 1024}) == []


def valid_program(workload: str, shape: str, modules=None):
    space = generate_space(resolve_workload(workload, shape), resolve_target("cuda-sm80"), modules=modules, seed=0)
    rng = Rng(2)
    for _ in range(200):
        candidate = space.sample(rng)
        if candidate is not None:
            return candidate.mod
    raise AssertionError("no valid sample")


def test_a_kernel_compiles_to_a_cubin_with_its_resources():
    target = resolve_target("cuda-sm80")
    executable = tvm.compile(valid_program("softmax", "64,256"), target=tvm.target.Target(dict(target.tvm_target)))
    cubin, log = compile_cubin(executable.mod.imports[0].inspect_source(), "sm_80")
    assert cubin[:4] == b"\x7fELF"
    resources = kernel_resources(log)
    assert resources and all(kernel.registers > 0 for kernel in resources)


def test_a_source_compiled_again_reuses_its_cubin(monkeypatch):
    """A bundle compiles each default program its check compiled before: NVRTC runs once per source."""
    target = resolve_target("cuda-sm80")
    source = tvm.compile(valid_program("softmax", "32,128"), target=tvm.target.Target(dict(target.tvm_target)))
    source = source.mod.imports[0].inspect_source()
    calls = []
    real = nvrtc._nvrtc.__wrapped__

    def counted():
        calls.append(1)
        return real()

    compile_cubin.cache_clear()
    monkeypatch.setattr(nvrtc, "_nvrtc", counted)
    first, again = compile_cubin(source, "sm_80"), compile_cubin(source, "sm_80")
    assert first == again and len(calls) == 1
    compile_cubin(source, "sm_86")  # another architecture is another cubin
    assert len(calls) == 2
    compile_cubin.cache_clear()


def forced_tiling(size: int, split: list[int]) -> tuple[Schedule, object]:
    """A ``size``^3 matmul tiled by hand: i and j split as ``split``, the outer pair bound to blocks, the next to threads."""
    sch = Schedule(resolve_workload("matmul", f"{size},{size},{size}").mod)
    block = sch.get_sblock("C")
    i, j, k = sch.get_loops(block)
    i0, i1, i2 = sch.split(i, split)
    j0, j1, j2 = sch.split(j, split)
    sch.reorder(i0, j0, i1, j1, k, i2, j2)
    sch.bind(sch.fuse(i0, j0), "blockIdx.x")
    sch.bind(sch.fuse(i1, j1), "threadIdx.x")
    return sch, block


def test_the_targets_compiler_refuses_a_kernel_with_its_accumulators_in_local_memory():
    """A tiling the space's checks would refuse, forced: 64x64 accumulators per thread go to local memory."""
    target = resolve_target("cuda-sm80")
    sch, block = forced_tiling(256, [2, 2, 64])
    sch.reverse_compute_at(sch.cache_write(block, 0, "local"), sch.get_loops(block)[1])
    with pytest.raises(CUDALintError, match="in local memory"):
        compile_for(sch.mod, target)


def test_compiled_candidates_pass_the_lint():
    target = resolve_target("cuda-sm80")
    executable = compile_for(valid_program("conv2d_nhwc", "1,32,14,14,32,3,3,1,1"), target)
    assert "__global__" in executable.mod.imports[0].inspect_source()


def test_missing_nvrtc_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_PATH", str(tmp_path))
    with pytest.raises(CUDAToolchainError, match=r"no libnvrtc\.so in"):
        nvrtc._nvrtc.__wrapped__()


def test_a_program_gives_its_cubin_and_the_table_that_launches_it_without_tvm():
    """A forced tiling with a known launch: 2x2 blocks of 8x8 threads, fused into 4 blocks of 64 threads."""
    target = resolve_target("cuda-sm80")
    sch, _ = forced_tiling(64, [2, 8, 4])
    code = target.compiler.device_code(sch.mod, dict(target.tvm_target))
    cubin, table = code.code, code.table
    assert cubin[:4] == b"\x7fELF" and target.compiler.device_code_kind == "cubin"
    assert table == {
        "launches": [{"kernel": "main_kernel", "args": [{"param": 0}, {"param": 1}, {"param": 2}],
                      "grid": [4, 1, 1], "block": [64, 1, 1], "shared": 0}],
        "scratch": [],
    }


def test_kernels_that_pass_values_through_host_buffers_share_them_as_scratch():
    """A softmax bound block by block (without gpu-row-kernel): four kernels, the row statistics between them."""
    target = resolve_target("cuda-sm80")
    modules = [name for name in target.modules if name != "gpu-row-kernel"]
    table = target.compiler.device_code(valid_program("softmax", "64,256", modules), dict(target.tvm_target)).table
    used = {arg.get("scratch") for launch in table["launches"] for arg in launch["args"]} - {None}
    assert used == {buffer["name"] for buffer in table["scratch"]} and used
    params = {arg.get("param") for launch in table["launches"] for arg in launch["args"]} - {None}
    assert params == {0, 1}  # the input read, the output written
    assert all(buffer["elements"] > 0 and buffer["dtype"] == "float32" for buffer in table["scratch"])
