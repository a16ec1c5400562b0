"""Tensor-core tiling: float16 matmul-like blocks computed by warps with WMMA, built and compiled to cubins here."""

from __future__ import annotations

import dataclasses
import re

import pytest
import tvm_ffi
from tvm import te, topi

from conftest import multiplies_on_tensor_cores, valid_samples
from probtune import Rng, Schedule
from probtune.measure.codegen import compile_for
from probtune.space.space_generator import generate_space
from probtune.targets import resolve_target
from probtune.workloads.catalog import resolve_workload
from probtune.workloads.workload import Workload
from probtune_cuda.codegen import CUDALintError
from probtune_cuda.intrinsics import TENSORIZE_KEY
from probtune_cuda.software_pipeline import loop_buffers
from probtune_cuda.tensor_core import TensorCoreTiling, shared_memory_bytes, wmma_plan

pytestmark = pytest.mark.filterwarnings("ignore")


def source_of(candidate, target) -> str:
    """The candidate built by the target's compiler: TVM, then NVRTC to a cubin and the lint (spills, registers)."""
    return compile_for(candidate.mod, target).mod.imports[0].inspect_source()


def linted_source(candidate, target) -> str | None:
    """``source_of``, or None where the cubin lint refuses the candidate (a spill)."""
    try:
        return source_of(candidate, target)
    except CUDALintError:
        return None


def tensorized(space) -> bool:
    return any(inst.kind == "blockize" for inst in space.trace.instructions)


@pytest.fixture(scope="module")
def sm90():
    return resolve_target("cuda-sm90")


def test_a_half_precision_matmul_runs_on_the_tensor_cores(sm90):
    """Sampled programs multiply 16x16x16 tiles with WMMA (or mma.sync), stage through launch-time shared memory, and compile."""
    space = generate_space(resolve_workload("matmul", "512,256,128", "float16"), sm90, seed=0)
    assert tensorized(space) and "tensorize" not in {inst.kind for inst in space.trace.instructions}
    found = valid_samples(space, 4, tries=60)
    assert len(found) == 4
    for candidate in found:
        script = candidate.mod.script()
        assert 'thread="threadIdx.y"' in script and ('scope="wmma.accumulator"' in script or 'scope="warp"' in script)
        assert TENSORIZE_KEY not in script  # every marked tile was replaced by its intrinsic
        source = source_of(candidate, sm90)
        wmma = ("wmma::fill_fragment", "wmma::load_matrix_sync", "wmma::mma_sync", "wmma::store_matrix_sync")
        assert all(call in source for call in wmma) if 'scope="wmma.accumulator"' in script else "ldmatrix" in source
        assert multiplies_on_tensor_cores(source)
        assert "extern __shared__" in source
        again = Schedule.replay(space.workload.mod, candidate.trace)
        assert again.trace.decision_hash() == candidate.decision_hash


def test_the_epilogue_is_finished_on_the_way_out_in_one_kernel(sm90):
    """dense + bias + GELU in float16: the float32 products never reach global memory; one kernel writes the result."""
    space = generate_space(resolve_workload("dense_bias_gelu", "128,256,64", "float16"), sm90, seed=0)
    assert tensorized(space)
    candidate = valid_samples(space, 1, tries=60)[0]
    assert not re.search(r"T_dense = T.sblock_alloc_buffer\(\([^)]*\)\)", candidate.mod.script())
    source = source_of(candidate, sm90)
    assert len(set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", source))) == 1
    assert "erff(" in source and multiplies_on_tensor_cores(source)


def test_an_operand_cast_from_float32_is_cast_on_its_way_into_shared_memory(sm90):
    """A product that reads a float32 tensor through a cast (probtune.model.copy_reads): the cast is inlined into the
    copy, which reads at most 16 bytes of float32 at once, so every draw is valid, and one kernel runs."""
    a, b = te.placeholder((128, 64), "float32", name="A"), te.placeholder((64, 32), "float16", name="B")
    narrow = te.compute(a.shape, lambda i, j: a[i, j].astype("float16"), name="narrow")
    k = te.reduce_axis((0, 64), "k")
    c = te.compute((128, 32), lambda i, j: te.sum(narrow[i, k].astype("float32") * b[k, j].astype("float32"), axis=k))
    space = generate_space(Workload.from_module(te.create_prim_func([a, b, c]), name="cast_matmul"), sm90, seed=0)
    assert tensorized(space)
    assert all(space.sample(Rng(n)) is not None for n in range(24))
    source = source_of(space.sample(Rng(0)), sm90)
    assert len(set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", source))) == 1
    assert set(re.findall(r"\*\((\w+)\*\)\(A_ptr", source)) <= {"float2", "float4"} and multiplies_on_tensor_cores(source)


def test_batched_and_transposed_operands_map_onto_wmma(sm90):
    for name, shape in [("batch_matmul", "4,64,64,32"), ("dense_bias_relu", "64,128,64")]:
        space = generate_space(resolve_workload(name, shape, "float16"), sm90, seed=0)
        assert tensorized(space), name
        assert multiplies_on_tensor_cores(source_of(valid_samples(space, 1, tries=60)[0], sm90))


def int8_matmul() -> list[te.Tensor]:
    a = te.placeholder((64, 64), "int8", name="A")
    b = te.placeholder((64, 64), "int8", name="B")
    k = te.reduce_axis((0, 64), name="k")
    return [a, b, te.compute((64, 64), lambda i, j: te.sum(a[i, k].astype("int32") * b[k, j].astype("int32"), axis=k))]


def int8_conv2d_nhwc() -> list[te.Tensor]:
    data = te.placeholder((1, 16, 16, 32), "int8", name="data")
    weight = te.placeholder((3, 3, 32, 64), "int8", name="weight")
    ry, rx, rc = te.reduce_axis((0, 3), "ry"), te.reduce_axis((0, 3), "rx"), te.reduce_axis((0, 32), "rc")

    def product(b, y, x, f):
        return data[b, y + ry, x + rx, rc].astype("int32") * weight[ry, rx, rc, f].astype("int32")

    return [data, weight, te.compute((1, 14, 14, 64), lambda *i: te.sum(product(*i), axis=[ry, rx, rc]))]


@pytest.mark.parametrize("tensors", [int8_matmul, int8_conv2d_nhwc])
def test_int8_products_summed_in_int32_run_on_the_tensor_cores(sm90, tensors):
    space = generate_space(Workload.from_module(te.create_prim_func(tensors()), tensors.__name__), sm90, seed=0)
    assert tensorized(space)
    source = source_of(valid_samples(space, 1, tries=60)[0], sm90)
    assert "wmma::mma_sync" in source and "signed char" in source  # int8: WMMA only


@pytest.mark.parametrize(
    "name,shape,dtype,arch",
    [
        ("matmul", "64,64,64", "float32", "sm_90"),  # no float32 WMMA: the thread tiling takes it
        ("matmul", "8,8,8", "float16", "sm_90"),  # padded to whole 16-wide tiles it would do 8 times the work
        ("matmul", "64,64,64", "float16", "sm_61"),  # no tensor cores before Volta
    ],
)
def test_blocks_wmma_cannot_compute_keep_the_thread_tiling(sm90, name, shape, dtype, arch):
    target = dataclasses.replace(sm90, tvm_target={**sm90.tvm_target, "arch": arch})
    space = generate_space(resolve_workload(name, shape, dtype), target, seed=0)
    assert not tensorized(space)
    assert 'thread="threadIdx.x"' in valid_samples(space, 1, tries=60)[0].mod.script()


@pytest.mark.parametrize("name,shape", [("matmul", "200,120,300"), ("dense_bias_gelu", "100,200,72")])
def test_a_matmul_of_any_shape_is_padded_to_whole_tiles(sm90, name, shape):
    """pad_einsum (the plugin's own instruction) pads to whole tiles; the copies make the zeros and trim: one kernel."""
    space = generate_space(resolve_workload(name, shape, "float16"), sm90, seed=0)
    kinds = [inst.kind for inst in space.trace.instructions]
    assert kinds.count("pad_einsum") == 1 and tensorized(space)
    assert "pad_einsum" in space.context.instructions
    found = valid_samples(space, 4, tries=80)
    sources = [source for candidate in found if (source := linted_source(candidate, sm90))]
    assert len(found) == 4 and len(sources) >= 2  # the others spill a few registers: the lint refuses them
    for candidate in found:
        script = candidate.mod.script()
        assert "_pad = T.sblock_alloc_buffer" not in script  # no padded copy in global memory
        assert "T.if_then_else" in script and "T.where" in script  # zeros read in, the padding's rows not written out
        assert tvm_ffi.structural_equal(space.program(candidate.trace), candidate.mod)
    for source in sources:
        assert multiplies_on_tensor_cores(source)
        assert len(set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", source))) == 1


@pytest.mark.parametrize("name,shape", [("conv2d_nhwc", "1,32,16,16,64,3,3,1,1"), ("conv2d_nchw", "2,3,16,16,32,3,3,2,1")])
def test_a_convolution_runs_on_the_tensor_cores_as_one_matmul(sm90, name, shape):
    """Rewritten as a matmul (and padded where its window is not whole tiles: 3x3x3 is 27 deep); one kernel.

    The zero padding, the window gather and the padding to whole tiles all
    happen on the way into shared memory; the rows are scattered back into
    the image, and rounded to float16, on the way out.
    """
    space = generate_space(resolve_workload(name, shape, "float16"), sm90, seed=0)
    kinds = [inst.kind for inst in space.trace.instructions]
    assert kinds.count("transform_to_intrinsic") == 1 and tensorized(space)
    assert kinds.count("pad_einsum") == (name == "conv2d_nchw")
    found = valid_samples(space, 3, tries=60)
    sources = [source for candidate in found if (source := linted_source(candidate, sm90))]
    assert len(found) == 3 and sources
    for candidate in found:
        script = candidate.mod.script()
        assert not re.search(r"(pad_temp|_reindex|_pad) = T.sblock_alloc_buffer", script), script  # nothing in global memory
        assert tvm_ffi.structural_equal(space.program(candidate.trace), candidate.mod)  # the plugin's instruction replays
    for source in sources:
        assert multiplies_on_tensor_cores(source)
        assert len(set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", source))) == 1


def test_a_model_s_convolution_with_bias_and_relu_is_one_tensor_core_kernel(sm90):
    """As a model's conv2d + bias + ReLU is legalized (TOPI, float16 sums): the epilogue follows the scatter out."""
    data = te.placeholder((1, 32, 14, 14), "float16", name="data")
    weight = te.placeholder((32, 32, 3, 3), "float16", name="weight")
    bias = te.placeholder((1, 32, 1, 1), "float16", name="bias")
    conv = topi.nn.conv2d_nchw(data, weight, 1, 1, 1, out_dtype="float16")
    func = te.create_prim_func([data, weight, bias, topi.nn.relu(topi.add(conv, bias))])
    space = generate_space(Workload.from_module(func, "conv_bias_relu"), sm90, seed=0)
    assert [inst.kind for inst in space.trace.instructions].count("transform_to_intrinsic") == 1
    source = source_of(valid_samples(space, 1, tries=60)[0], sm90)
    assert multiplies_on_tensor_cores(source)
    assert re.search(r"wmma::accumulator, 16, 16, 16, half>|mma\.sync\.aligned\.m16n8k16\.row\.col\.f16\.f16\.f16\.f16", source)
    assert len(set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", source))) == 1


def test_tensor_core_programs_avoid_tvm_s_storage_rewrite(sm90):
    """TVM's StorageRewrite would give a float16 fragment load a float32 buffer here, which its CUDA codegen refuses."""
    space = generate_space(resolve_workload("dense_bias_gelu", "112,208,80", "float16"), sm90, seed=0)
    found = valid_samples(space, 2, tries=20)
    assert len(found) == 2 and all(multiplies_on_tensor_cores(source_of(candidate, sm90)) for candidate in found)


def test_wmma_plan_names_the_operands_and_the_intrinsics(sm90):
    work = resolve_workload("dense_bias_relu", "64,128,64", "float16")
    space = generate_space(work, sm90, modules=["auto-inline"], validators=[])
    sch = Schedule.replay(work.mod, space.trace)
    plan = wmma_plan(sch.tvm, sch.tvm.get_sblock("T_dense"), space.context)
    assert plan is not None and (plan.operand_a, plan.operand_b) == (0, 1)
    assert plan.group.compute == "wmma_sync_16x16x16_f16f16f32_trans"  # W is [N, K]: B transposed
    assert plan.group.load_b.endswith("_trans_shared_dyn") and plan.group.store.endswith("_shared_dyn")


def test_fresh_draws_mostly_fit_the_block_and_the_warps(sm90):
    """Tiles are bounded per thread block (inner products of the tile sizes) and weighed by what fits."""
    space = generate_space(resolve_workload("matmul", "4096,4096,4096", "float16"), sm90, seed=0)
    module = next(m for m in space.modules if isinstance(m, TensorCoreTiling))
    undecided, rng = space.trace.with_decisions({}), Rng(4)
    fits = 0
    for _ in range(50):
        sch = Schedule.replay(space.workload.mod, undecided, rng=rng, until=space.prior_end)
        operands = 2 * (128 * 128 + 128 * 128)  # float16 tiles of A and B: 8x8 warps' tiles, 8 reduction tiles deep
        assert 0 < shared_memory_bytes(sch.tvm) <= max(3 * operands, 4 * 128 * 128)  # up to 3 pipeline buffers each
        fits += module.prior(sch.tvm, space.context) == 1.0
    assert fits >= 25
    assert len(valid_samples(space, 6, tries=10)) >= 6


def test_the_staged_output_reuses_the_operands_shared_memory(sm90):
    """Operand tiles and the staged output are live at different times: the block needs the larger, not the sum."""
    space = generate_space(resolve_workload("matmul", "256,256,256", "float16"), sm90, seed=0)
    sch = Schedule.replay(space.workload.mod, space.trace.with_decisions({}), rng=Rng(2), until=space.prior_end)
    raw = sch.tvm
    extents = {
        raw.get(block).name_hint: int(raw.get(raw.get_loops(block)[-1]).extent)
        for block in raw.get_child_blocks(raw.get_sblock("root"))
        if raw.get(block).name_hint.endswith("_shared.dyn")
    }
    buffers = max(loop_buffers(raw.get(loop)) for loop in raw.get_loops(raw.get_sblock("A_shared.dyn")))  # pipelined
    operands = 2 * buffers * (extents["A_shared.dyn"] + extents["B_shared.dyn"])  # float16 tiles
    output = 4 * extents["C_shared.dyn"]  # float32 accumulators
    assert shared_memory_bytes(raw) == max(operands, output) < operands + output



def test_a_grouped_convolutions_copies_are_sized_by_their_largest_window(sm90):
    """RegNet's grouped 3x3 convolution (8 channels a group, NHWC, float16): a tile of output channels reads a window
    of input channels that starts where its group does, so a copy's extent is an expression of the tile's loops.
    The priors bound it over their ranges (``int()`` of it failed every draw, and stopped the model's bundle)."""
    from probtune.model.compile import default_program

    data = te.placeholder((1, 14, 14, 208), "float16", name="data")
    kernel = te.placeholder((3, 3, 8, 208), "float16", name="kernel")
    out = topi.nn.group_conv2d_nhwc(data, kernel, 1, 1, 1, 26, "float32")
    space = generate_space(Workload.from_module(te.create_prim_func([data, kernel, out]), name="grouped"), sm90, seed=0)
    program = default_program(space, 0, sm90)
    assert program is not None
    compile_for(program, sm90)
