"""Dot-product tilings (VNNI's ``vpdpbusd``, AVX512-BF16's ``vdpbf16ps``): which blocks map onto each instruction,
and programs that run it and compute what the plain program does."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import te, tirx, topi

import probtune
from conftest import run_module
from probtune import Rng, generate_space
from probtune.measure.codegen import compile_for
from probtune.measure.constant_layouts import layout_copies, read_constants_packed
from probtune.plugins import get_registry
from probtune.search.search_strategy import RandomSearch
from probtune.targets import resolve_target
from probtune.workloads.workload import Workload
from probtune_cpu.host_cpu import cpu_features
from probtune_cpu.multi_level_tiling import MultiLevelTiling
from probtune_cpu.vector_unit import vector_register_bytes
from probtune_x86 import BF16_FEATURE, VNNI_FEATURE
from probtune_x86.amx import AMXBF16DotProduct, AMXDotProduct
from probtune_x86.bf16 import BF16, BF16_CALL, BF16DotProduct
from probtune_x86.dot_product import DotInstruction, DotProductTiling, dot_plan, kept_accumulator_bytes
from probtune_x86.features import X86_FEATURE_NAMES, x86_features
from probtune_x86.vnni import VNNI, VNNIDotProduct


def _bytes(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    return (rng.integers(0, 256, shape) if dtype == "uint8" else rng.integers(-128, 128, shape)).astype(dtype)


def _bfloat16(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)


@dataclass(frozen=True)
class Case:
    """One instruction, its tiling module, and how its programs are checked."""

    instruction: DotInstruction
    tiling: DotProductTiling
    cpu_feature: str  # /proc/cpuinfo's flag
    mnemonic: str  # in the program's assembly
    column: str  # the cost model's feature counting it
    other_types: tuple[str, str]  # operand types the instruction does not take
    operand: Callable[[np.random.Generator, tuple[int, ...], str], np.ndarray]
    exact: bool  # integer sums are exact; float ones are summed in another order
    linked: str | None = None  # the LLVM function linked in to run it, which must be inlined

    def assert_same(self, got: np.ndarray, want: np.ndarray) -> None:
        if self.exact:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


VNNI_CASE = Case(VNNI, VNNIDotProduct(), VNNI_FEATURE, "vpdpbusd", "vnni_calls", ("int8", "int8"), _bytes, True)
BF16_CASE = Case(BF16, BF16DotProduct(), BF16_FEATURE, "vdpbf16ps", "bf16_calls", ("float32", "float32"), _bfloat16,
                 False, BF16_CALL)
CASES = [pytest.param(VNNI_CASE, id="vnni"), pytest.param(BF16_CASE, id="bf16")]


def _vector_host():
    """This machine's target without the AMX tilings, whose tiles would otherwise take these tests' blocks (any rows
    from 8 up divide into tiles) before the vector instructions they test."""
    host = resolve_target("host")
    tilings = (AMXDotProduct().name, AMXBF16DotProduct().name)
    return dataclasses.replace(host, modules=tuple(m for m in host.modules if m not in tilings))


def _needs(case: Case) -> None:
    if case.cpu_feature not in cpu_features():
        pytest.skip(f"this CPU has no {case.cpu_feature}")


def _matmul(case: Case, m: int, n: int, k: int, types: tuple[str, str] | None = None, transposed: bool = False) -> Workload:
    """``acc(A) @ acc(B)`` plus one, in the instruction's types (``types`` for others); B as [n, k] when ``transposed``
    (ONNX Gemm's transB)."""
    a_dtype, b_dtype = types or (case.instruction.a_dtype, case.instruction.b_dtype)
    acc = case.instruction.accumulator
    a = te.placeholder((m, k), a_dtype, name="A")
    b = te.placeholder((n, k) if transposed else (k, n), b_dtype, name="B")
    r = te.reduce_axis((0, k), "r")

    def product(i, j):
        w = b[j, r] if transposed else b[r, j]
        return te.sum(a[i, r].astype(acc) * w.astype(acc), axis=r)

    c = te.compute((m, n), product, name="C")
    d = te.compute((m, n), lambda i, j: c[i, j] + tirx.const(1, acc), name="D")
    return Workload.from_module(te.create_prim_func([a, b, d]), name="dot_matmul")


def _conv_nhwc(case: Case, channels: int, filters: int, kernel: int, groups: int = 1) -> Workload:
    op = case.instruction
    x = te.placeholder((1, 8, 8, channels), op.a_dtype, name="X")
    w = te.placeholder((kernel, kernel, channels // groups, filters), op.b_dtype, name="W")
    if groups == 1:
        y = topi.nn.conv2d_nhwc(x, w, 1, kernel // 2, 1, out_dtype=op.accumulator)
    else:
        y = topi.nn.group_conv2d_nhwc(x, w, 1, kernel // 2, 1, groups, out_dtype=op.accumulator)
    return Workload.from_module(te.create_prim_func([x, w, y]), name="dot_conv")


def _plan(case: Case, workload: Workload, name: str):
    sch = tvm.s_tir.Schedule(workload.mod)
    return dot_plan(sch, sch.get_sblock(name), case.instruction)


def _operands(case: Case, work: Workload, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    (a_shape, a_dtype), (b_shape, b_dtype), (out_shape, out_dtype) = work.param_specs()
    return case.operand(rng, a_shape, a_dtype), case.operand(rng, b_shape, b_dtype), np.zeros(out_shape, out_dtype)


@pytest.mark.parametrize("case", CASES)
def test_the_plan_finds_the_lanes_and_the_deep_sum(case):
    assert _plan(case, _matmul(case, 32, 64, 128), "C").b_dims == (0, 1)  # B[k, j]
    assert _plan(case, _matmul(case, 32, 64, 128, transposed=True), "C").b_dims == (1, 0)  # B[j, k]
    assert _plan(case, _conv_nhwc(case, 32, 64, 3), "conv2d_nhwc").b_dims == (2, 3)  # HWIO: inputs, then outputs


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(
    "workload, block",
    [
        (lambda case: _matmul(case, 32, 64, 128, case.other_types), "C"),  # operand types it does not multiply
        (lambda case: _matmul(case, 32, 24, 128), "C"),  # 24 output channels are not whole 16-lane vectors
        (lambda case: _matmul(case, 32, 64, case.instruction.depth + 1), "C"),  # a sum not whole groups of its depth
        (lambda case: _conv_nhwc(case, 32, 32, 3, groups=32), "group_conv2d_nhwc"),  # depthwise: no sum over channels
    ],
)
def test_blocks_the_instruction_does_not_fit_are_left_to_multi_level_tiling(case, workload, block):
    assert _plan(case, workload(case), block) is None


@pytest.mark.parametrize("case", CASES)
def test_the_host_target_offers_the_instruction_where_the_cpu_has_it(case):
    assert (case.tiling.name in resolve_target("host").modules) == (case.cpu_feature in cpu_features())
    assert case.tiling.name not in resolve_target("x86-avx2").modules


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(
    "workload",
    [
        lambda case: _matmul(case, 28, 64, 64),
        lambda case: _matmul(case, 28, 32, 64, transposed=True),
        lambda case: _conv_nhwc(case, 32, 32, 3),
        lambda case: _conv_nhwc(case, 32, 32, 1),
    ],
)
def test_programs_run_the_instruction_and_compute_the_plain_programs_sums(case, workload):
    _needs(case)
    work = workload(case)
    host = _vector_host()
    space = generate_space(work, host)
    assert case.tiling.name in [m.name for m in space.modules]
    batch = RandomSearch(space, Rng(3)).next_batch(3)
    assert batch
    a, b, out = _operands(case, work, 0)
    want = run_module(compile_for(work.mod, host), [a, b, out])[2]
    for candidate in batch:
        lib = compile_for(candidate.mod, host)
        asm = lib.mod.inspect_source("asm")
        assert case.mnemonic in asm and (case.linked is None or case.linked not in asm)
        case.assert_same(run_module(lib, [a, b, out])[2], want)


@pytest.mark.parametrize("case", CASES)
def test_a_constant_weight_is_read_in_the_blocked_layout_not_copied_per_call(case):
    """The tensorized block matches the weight's blocked copy, so the copy is made the parameter, not inlined."""
    _needs(case)
    work = _matmul(case, 28, 64, 64)
    host = _vector_host()
    a, b, out = _operands(case, work, 1)
    want = run_module(compile_for(work.mod, host), [a, b, out])[2]
    depth = case.instruction.depth
    for candidate in RandomSearch(generate_space(work, host), Rng(5)).next_batch(2):
        program, layouts = read_constants_packed(candidate.mod, {1})
        assert list(layouts) == [1] and not layout_copies(program["main"])
        packed = layouts[1].map_tensor(tvm.runtime.tensor(b)).numpy()
        assert packed.shape == (4, 64 // depth, 16, depth)  # [j // 16, k // depth, j % 16, k % depth]
        case.assert_same(run_module(compile_for(program, host), [a, packed, out])[2], want)


@pytest.mark.parametrize("case", CASES)
def test_the_cost_model_counts_the_instructions_a_program_executes(case):
    _needs(case)
    work = _matmul(case, 28, 64, 64)
    host = _vector_host()
    tiled = RandomSearch(generate_space(work, host), Rng(3)).next_batch(1)[0]
    plain_space = generate_space(work, host, modules=[m for m in host.modules if m != case.tiling.name])
    plain = RandomSearch(plain_space, Rng(3)).next_batch(1)[0]
    want = {name: 0 for name in X86_FEATURE_NAMES}
    want[case.column] = 28 * (64 // 16) * (64 // case.instruction.depth)  # one per 16 lanes x depth terms
    assert dict(zip(X86_FEATURE_NAMES, x86_features(tiled.mod["main"]))) == want
    assert list(x86_features(plain.mod["main"])) == [0] * len(X86_FEATURE_NAMES)
    assert get_registry().feature_extractors["x86"].columns == X86_FEATURE_NAMES


@pytest.mark.parametrize("case", CASES)
def test_programs_realized_in_helper_processes_are_tensorized_there(case, tmp_path):
    """The search's helpers replay traces without the tiling that registered the intrinsic: the layout rewrite
    registers it there, so no candidate is dropped for an intrinsic the process does not know."""
    _needs(case)
    result = probtune.tune(_matmul(case, 64, 64, 64), "host", 16, database=tmp_path / "t.db", batch_size=8)
    assert result.best is not None and "rewrite-cpu-tensorize" not in result.rejections


def _tiled_matmul(case: Case, write_back: int):
    """A 64 x 64 x 128 product tiled around the instruction: i 4x4x2x2, the 4 blocks of 16 lanes 2x1x1x2, the sum
    (128 / depth) in two levels; written back under level ``write_back`` + 1 of the tiling's structure."""
    space = generate_space(_matmul(case, 64, 64, 128), _vector_host(), modules=[case.tiling], validators=[])
    trace = space.trace
    tiles = [i for i in trace.sampling_indices() if trace.instructions[i].kind == "sample_perfect_tile"]
    write_backs = [i for i in trace.sampling_indices() if trace.instructions[i].kind == "sample_categorical"]
    depth = 128 // case.instruction.depth
    decisions = dict(zip(tiles, [[4, 4, 2, 2], [2, 1, 1, 2], [depth // 4, 4]]))
    decisions[write_backs[0]] = write_back
    sch, _ = space.realize(trace.with_decisions(decisions))
    return sch, space.context


@pytest.mark.parametrize("case", CASES)
def test_the_register_tile_prior_weighs_the_sums_an_instruction_tile_keeps_under_its_write_back(case):
    _needs(case)
    low, high = (share * vector_register_bytes(_vector_host()) for share in case.tiling.register_tile)
    weights = []
    for write_back, tiles in ((1, 2 * 2 * 2), (0, 4 * 2 * 2 * 2)):  # under level 2: i's and j's last two levels
        sch, context = _tiled_matmul(case, write_back)
        kept = kept_accumulator_bytes(sch.tvm, sch.tvm.get_sblock("C_o"))
        assert kept == tiles * 64  # each a vector of 16 four-byte sums
        expected = 1.0 if low <= kept <= high else case.tiling.off_register_tile_weight
        weights.append(case.tiling.prior(sch.tvm, context))
        assert weights[-1] == expected
        assert MultiLevelTiling().prior(sch.tvm, context) == 1.0  # the instruction's tiles are not its to judge
    assert weights == [1.0, case.tiling.off_register_tile_weight]  # 8 of 32 AVX-512 registers, then all 32


@pytest.mark.parametrize("case", CASES)
def test_draws_under_the_register_tile_prior_keep_register_sized_sums_more_often(case):
    _needs(case)
    workload = _matmul(case, 256, 256, 256)
    low, high = (share * vector_register_bytes(_vector_host()) for share in case.tiling.register_tile)

    def share_in_range(tiling: DotProductTiling) -> float:
        space = generate_space(workload, _vector_host(), modules=[tiling], validators=[])
        rng, inside = Rng(7), 0
        for _ in range(80):
            sch, _ = space.draw(rng)
            inside += low <= kept_accumulator_bytes(sch.tvm, sch.tvm.get_sblock("C_o")) <= high
        return inside / 80

    without = share_in_range(dataclasses.replace(case.tiling, off_register_tile_weight=1.0))
    assert share_in_range(case.tiling) >= without + 0.25  # about 0.45 against 0.06-0.09

