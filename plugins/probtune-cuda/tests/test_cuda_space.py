"""The CUDA targets and their GPU space: sampled programs are bound to threads, fit the limits, and build without a GPU."""

from __future__ import annotations

import dataclasses
import re

import pytest
import tvm

from conftest import valid_samples
from probtune import Rng, Schedule, UnsupportedTargetError
from probtune.space.space_generator import generate_space
from probtune.targets import resolve_target
from probtune.workloads.catalog import resolve_workload
from probtune_cuda.postprocs import VerifyGPUCode

pytestmark = pytest.mark.filterwarnings("ignore")


def cuda_source(mod: tvm.IRModule, target) -> str:
    executable = tvm.compile(mod, target=tvm.target.Target(dict(target.tvm_target)))
    return executable.mod.imports[0].inspect_source()


@pytest.mark.parametrize("name,arch,shared_kb", [("cuda-sm80", "sm_80", 163), ("cuda-sm90", "sm_90", 227)])
def test_targets_name_their_architecture_and_limits(name, arch, shared_kb):
    """The shared memory limit is the block's opt-in maximum, which launch-time allocations may use."""
    target = resolve_target(name)
    tvm_target = tvm.target.Target(dict(target.tvm_target))
    assert tvm_target.kind.name == "cuda" and tvm_target.attrs["arch"] == arch
    assert int(tvm_target.attrs["max_threads_per_block"]) == 1024
    assert int(tvm_target.attrs["max_shared_memory_per_block"]) == shared_kb * 1024


def test_matmul_samples_are_tiled_over_blocks_and_threads_and_build_to_cuda():
    target = resolve_target("cuda-sm80")
    space = generate_space(resolve_workload("matmul", "256,256,256"), target, seed=0)
    samples = valid_samples(space, 3)
    assert len(samples) == 3
    for candidate in samples:
        script = candidate.mod.script()
        for axis in ("blockIdx.x", "vthread.x", "threadIdx.x"):
            assert f'thread="{axis}"' in script
        assert 'scope="shared.dyn"' in script and 'scope="local"' in script
        assert script.count('thread="threadIdx.x"') == 3  # the tile's threads, and both inputs' copies spread over them
        assert "probtune." not in script  # the sampled fetch widths and unroll limits were turned into what TVM lowers
        source = cuda_source(candidate.mod, target)
        assert "__global__" in source and "__shared__" in source and "threadIdx.x" in source
        again = Schedule.replay(space.workload.mod, candidate.trace)
        assert again.trace.decision_hash() == candidate.decision_hash


def test_an_elementwise_epilogue_finishes_the_tiles_in_registers():
    """dense + bias + ReLU: the product stays in local memory and the epilogue writes the result, in one kernel."""
    target = resolve_target("cuda-sm80")
    without_check = [v for v in target.validators if v != "verify-gpu-code"]
    space = generate_space(resolve_workload("dense_bias_relu", "64,256,128"), target, seed=0, validators=without_check)
    kinds = [inst.kind for inst in space.trace.instructions]
    assert "set_scope" in kinds and "cache_write" not in kinds
    candidate = valid_samples(space, 1)[0]
    assert re.search(r"T_dense\w* = T.sblock_alloc_buffer\([^)]*\), scope=\"local\"\)", candidate.mod.script())
    source = cuda_source(candidate.mod, target)
    kernels = set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", source))
    assert len(kernels) == 1


def test_blocks_no_module_tiles_are_bound_to_threads():
    target = resolve_target("cuda-sm90")
    space = generate_space(resolve_workload("softmax", "64,256"), target, seed=0)
    candidate = valid_samples(space, 1)[0]
    assert "threadIdx.x" in cuda_source(candidate.mod, target)


def test_programs_over_the_shared_memory_limit_are_rejected_before_building():
    small = dataclasses.replace(
        resolve_target("cuda-sm80"), tvm_target={**resolve_target("cuda-sm80").tvm_target, "max_shared_memory_per_block": 256}
    )
    space = generate_space(resolve_workload("matmul", "256,256,256"), small, seed=0)
    assert valid_samples(space, 1, tries=20) == []
    assert space.rejections["verify-gpu-code"] > 0
    sch = Schedule.replay(space.workload.mod, space.trace.with_decisions({}), rng=Rng(3))
    for validator in space.validators[:-1]:
        validator.check(sch.tvm, space.context)
    reason = VerifyGPUCode().check(sch.tvm, space.context)
    assert reason is not None and "256 bytes of shared memory" in reason


@pytest.mark.skipif(tvm.cuda(0).exist, reason="this machine has a CUDA device")
def test_tuning_a_cuda_target_without_a_gpu_says_why():
    from probtune import tune

    with pytest.raises(UnsupportedTargetError, match=r"cuda-sm80.*no CUDA device 0 is visible"):
        tune("matmul", shape="64,64,64", target="cuda-sm80", trials=4)


def test_a_product_whose_input_its_epilogue_also_reads_is_bound_without_tiling_and_builds():
    """``C = A @ B; D = C * A`` (RoBERTa's position count times its mask): TVM copies ``A`` into shared memory for
    both readers, which no tiling of the product can hold under its loops; the product is bound as a row reduction."""
    from tvm import te

    from probtune.measure.codegen import compile_for
    from probtune.workloads.workload import Workload

    a, b = te.placeholder((64, 64), "float32", name="A"), te.placeholder((64, 64), "float32", name="B")
    k = te.reduce_axis((0, 64), "k")
    c = te.compute((64, 64), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    d = te.compute((64, 64), lambda i, j: c[i, j] * a[i, j], name="D")
    target = resolve_target("cuda-sm90")
    space = generate_space(Workload.from_module(te.create_prim_func([a, b, d]), name="masked"), target, seed=0)
    assert not any(inst.kind == "cache_read" for inst in space.trace.instructions)
    candidate = next(c for c in (space.sample(Rng(n)) for n in range(20)) if c is not None)
    assert "__global__" in compile_for(candidate.mod, target).mod.imports[0].inspect_source()


def test_every_task_of_an_fp16_encoder_builds_to_cuda(encoder_onnx):
    """Products with their bias, residual and GELU in the tensor cores' epilogues, row kernels, casts: each task's
    space draws a program that builds."""
    import dataclasses

    from probtune.measure.codegen import compile_for
    from probtune.model import extract_tasks, fuse, load_model
    from probtune.model.precision import convert_precision

    model = load_model(encoder_onnx)
    target = resolve_target("cuda-sm90")
    tasks = extract_tasks(fuse(dataclasses.replace(model, mod=convert_precision(model.mod, "fp16")), target))
    for task in tasks:
        candidate = valid_samples(generate_space(task.workload, target, seed=0), 1, tries=40)[0]
        assert "__global__" in compile_for(candidate.mod, target).mod.imports[0].inspect_source(), task.name
