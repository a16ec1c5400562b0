"""Multi-level tiling's per-tile write-back, and the CPU validators that reject programs before building."""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

import numpy as np
import pytest
import tvm
from tvm import te
from tvm.script import tirx as T

from conftest import assert_program_correct, matmul_module, run_module
from probtune import Rng, SpaceContext, Trace, generate_space
from probtune.measure.constant_layouts import LAYOUT_FREE_ATTR
from probtune.schedule.analysis import block_names
from probtune.schedule.schedule import BlockRV, Schedule
from probtune.targets import resolve_target
from probtune.workloads.catalog import BUILTIN_WORKLOADS
from probtune.workloads.workload import Workload
from probtune_cpu.multi_level_tiling import (
    PACKED_DIM_KEY,
    PANEL_DIM_KEY,
    PANEL_KEY,
    WRITE_BACK_DEPTH_KEY,
    MultiLevelTiling,
    accumulator_bytes,
)
from probtune_cpu.validators import VerifyNoRecompute, VerifyUnrollSize, estimate_unrolled_size
from probtune_cpu.vector_unit import vector_register_bytes, vector_width

VERIFIERS = ["verify-static-loops", "verify-vectorize", "verify-parallel", "verify-unroll-size", "verify-no-recompute"]
CATALOG = {spec.name: spec for spec in BUILTIN_WORKLOADS}


@pytest.fixture(scope="module")
def two_cores(host):
    """The host target with 2 cores: which programs leave cores idle, and so are rejected, depends on the count."""
    return dataclasses.replace(host, tvm_target={**host.tvm_target, "num-cores": 2})


def _annotation_sample(trace, key: str) -> int:
    """Index of the instruction that samples the value of the (single) annotation ``key``."""
    insts = trace.instructions
    (index,) = [i for i, (inst, following) in enumerate(itertools.pairwise(insts))
                if inst.kind == "sample_categorical" and following.attrs.get("ann_key") == key]
    return index


def _write_back_sample(trace) -> int:
    """Index of the instruction that samples the write-back level."""
    return _annotation_sample(trace, WRITE_BACK_DEPTH_KEY)


def _shared_loops(sch: tvm.s_tir.Schedule, block: str, other: str) -> list[tvm.tirx.For]:
    """The outer loops that enclose both blocks."""
    shared = []
    for a, b in zip(sch.get_loops(sch.get_sblock(block)), sch.get_loops(sch.get_sblock(other))):
        if not sch.get(a).loop_var.same_as(sch.get(b).loop_var):
            break
        shared.append(sch.get(a))
    return shared


def _realize_accepted(space, decisions: dict[int, object], count: int, first_seed: int = 0) -> list:
    """``count`` schedules that no validator rejects, drawn with ``decisions`` kept and seeds from ``first_seed`` on.

    Some draws make fewer parallel jobs than the cores can share, which
    ``rewrite-parallel-vectorize-unroll`` rejects; nothing else may.
    """
    accepted = []
    for seed in range(first_seed, first_seed + 16):
        sch, rejected = space.realize(space.trace.with_decisions(decisions), Rng(seed))
        if rejected is None:
            accepted.append(sch)
            if len(accepted) == count:
                return accepted
        else:
            assert rejected.validator == "rewrite-parallel-vectorize-unroll" and "cores busy" in rejected.reason
    raise AssertionError(f"fewer than {count} of 16 draws were accepted")


def _perfect_tile_sites(trace) -> list[int]:
    """Indices of the trace's ``sample_perfect_tile`` instructions, in trace order."""
    return [i for i in trace.sampling_indices() if trace.instructions[i].kind == "sample_perfect_tile"]


def _spatial_tile_product(trace, level: int) -> int:
    """Iterations of the spatial tile levels above the write-back: the product of the first ``level`` factors."""
    decisions = trace.decisions
    return math.prod(
        math.prod(decisions[i][:level])
        for i, inst in enumerate(trace.instructions)
        if inst.kind == "sample_perfect_tile" and inst.attrs["n"] == 4
    )


def _matmul_decisions(trace, level: int, lanes: int) -> dict[int, object]:
    """Fixed tiles for a 64^3 matmul (i: 2x2x4x4, j: 2x2x(64 / lanes / 4)x(1 vector), k: 8x8) and write-back level.

    j is first split into whole vectors of the host's lanes, so its tiles cover 64 / lanes.
    """
    tile_indices = _perfect_tile_sites(trace)
    decisions: dict[int, object] = dict(zip(tile_indices, [[2, 2, 4, 4], [2, 2, 64 // lanes // 4, 1], [8, 8]]))
    decisions[_write_back_sample(trace)] = level
    return decisions


@pytest.mark.parametrize("level", [0, 1])
def test_matmul_writes_back_through_a_cache_at_the_sampled_level(host, level):
    workload = Workload.from_module(matmul_module(64, 64, 64))
    space = generate_space(workload, host, validators=["rewrite-write-back-location"])
    kinds = [inst.kind for inst in space.trace.instructions]
    assert kinds.count("cache_write") == 1
    index = _write_back_sample(space.trace)
    depths = space.trace.instructions[index].attrs["candidates"]
    assert depths == [2, 4]  # after the first and the second spatial tile level of i and j

    sch, rejected = space.realize(space.trace.with_decisions(_matmul_decisions(space.trace, level, vector_width(host))))
    assert rejected is None
    assert len(_shared_loops(sch.tvm, "C", "C_global")) == depths[level]
    assert sch.trace.structure_hash() == space.trace.structure_hash()  # the level moves the block, not the trace


def test_matmul_write_back_is_vectorized_inside_the_parallel_tile(host):
    workload = Workload.from_module(matmul_module(64, 64, 64))
    space = generate_space(workload, host)
    for level, tile_iterations in [(0, 2 * 2), (1, 2 * 2 * 2 * 2)]:
        sch, rejected = space.realize(space.trace.with_decisions(_matmul_decisions(space.trace, level, vector_width(host))))
        assert rejected is None
        shared = _shared_loops(sch.tvm, "C_update", "C_global")
        assert shared and shared[0].kind == tvm.tirx.ForKind.PARALLEL
        assert math.prod(int(loop.extent) for loop in shared) == tile_iterations
        innermost = sch.tvm.get(sch.tvm.get_loops(sch.tvm.get_sblock("C_global"))[-1])
        assert innermost.kind == tvm.tirx.ForKind.VECTORIZED


def test_dense_fuses_its_elementwise_epilogue_instead_of_a_cache(host):
    spec = CATALOG["dense_bias_relu"]
    space = generate_space(spec.instantiate(spec.small_shape), host, validators=["rewrite-write-back-location"])
    assert "cache_write" not in [inst.kind for inst in space.trace.instructions]
    index = _write_back_sample(space.trace)
    depths = space.trace.instructions[index].attrs["candidates"]
    for level in (0, 1):
        sch, rejected = space.realize(space.trace.with_decisions({index: level}), Rng(3))
        assert rejected is None
        (epilogue,) = sch.tvm.get_consumers(sch.tvm.get_sblock("T_dense"))
        assert len(_shared_loops(sch.tvm, "T_dense", sch.tvm.get(epilogue).name_hint)) == depths[level]


def test_dense_packs_its_weight_per_outer_tile_in_panels_of_the_vector_tile(host):
    spec = CATALOG["dense_bias_relu"]
    workload = spec.instantiate(spec.small_shape)
    _, n, k = spec.small_shape
    space = generate_space(workload, host)
    realized = [space.realize(space.trace.with_decisions({}), Rng(seed)) for seed in range(8)]
    accepted = [sch for sch, rejected in realized if rejected is None]
    assert len(accepted) >= 4
    for sch in accepted:
        raw = sch.tvm
        tiled = raw.get_sblock("T_dense_update")
        innermost = raw.get_loops(tiled)[-1]
        width = int(raw.get(innermost).extent)
        assert raw.get(innermost).kind == tvm.tirx.ForKind.VECTORIZED
        assert width % vector_width(host) == 0  # whole vectors, as if W were contiguous
        packed = raw.get(raw.get_sblock("W_global")).writes[0].source
        assert [int(extent) for extent in packed.shape] == [n // width, k, width]  # W[j, k] as [j // w, k, j % w]
        (shared,) = _shared_loops(raw, "W_global", "T_dense_update")  # copied once per tile of j, for every row tile
        assert int(shared.extent) == _outer_tile_of_last_spatial_loop(sch.trace)
    assert_program_correct(workload, accepted[0].mod, host)


def test_dense_copies_its_weight_into_panels_in_square_tiles(host):
    """Reads along k, writes along j: in ``w x w`` tiles, k innermost, when both extents are whole tiles."""
    workload = CATALOG["dense_bias_relu"].instantiate((16, 48, 64))
    space = generate_space(workload, host)
    realized = [space.realize(space.trace.with_decisions({}), Rng(seed)) for seed in range(8)]
    accepted = [sch for sch, rejected in realized if rejected is None]
    assert len(accepted) >= 4
    tiled = 0
    for sch in accepted:
        raw = sch.tvm
        width = int(raw.get(raw.get_loops(raw.get_sblock("T_dense_update"))[-1]).extent)
        copy = raw.get_sblock("W_global")
        extents = [int(raw.get(loop).extent) for loop in raw.get_loops(copy)]
        if 64 % width == 0:
            tiled += 1
            assert extents[-2:] == [width, width] and extents[-3] == 64 // width
            assert_program_correct(workload, sch.mod, host)
        else:
            assert extents[-1] == 64  # rows of k as before
    assert tiled


def test_a_weight_copy_recorded_with_its_dimension_moved_last_replays_as_recorded(host):
    """Database records from before panels: the copy's annotation says which dimension to move last."""
    spec = CATALOG["dense_bias_relu"]
    workload = spec.instantiate(spec.small_shape)
    _, n, k = spec.small_shape
    space = generate_space(workload, host)
    sch, rejected = space.realize(space.trace.with_decisions({}), Rng(0))
    assert rejected is None
    recorded = Trace.from_json(sch.trace.to_json().replace(f'"{PANEL_DIM_KEY}"', f'"{PACKED_DIM_KEY}"'))
    raw = space.program(recorded)
    (packed,) = [buffer for buffer in raw["main"].body.block.alloc_buffers if buffer.name == "W_global"]
    assert [int(extent) for extent in packed.shape] == [k, n]  # W[j, k] laid out as [k, j]
    assert_program_correct(workload, raw, host)


def _outer_tile_of_last_spatial_loop(trace) -> int:
    """The outermost factor of the last four-level tiling: the vectorized loop's outermost tile."""
    tilings = [i for i, inst in enumerate(trace.instructions) if inst.kind == "sample_perfect_tile" and inst.attrs["n"] == 4]
    return trace.decisions[tilings[-1]][0]


@pytest.mark.parametrize(("name", "input_name", "kernel"), [("matmul", "B", "C_update"), ("batch_matmul", "B", "C_update")])
def test_an_input_walked_with_a_stride_by_the_reduction_may_be_packed_in_panels(host, two_cores, name, input_name, kernel):
    """``B[k, j]``: packed, its copy is laid out ``[j // w, ..., k, j % w]`` for a kernel vector tile of w; or not."""
    lanes = vector_width(host)  # j spans whole vectors: 5 or 3 of them
    shape = {"matmul": (24, 5 * lanes, 56), "batch_matmul": (3, 16, 3 * lanes, 40)}[name]
    workload = CATALOG[name].instantiate(shape)
    space = generate_space(workload, two_cores)
    index = _annotation_sample(space.trace, PANEL_KEY)
    for pack in (0, 1):
        (sch,) = _realize_accepted(space, {index: pack}, 1, first_seed=pack)
        raw = sch.tvm
        copies = [name for name in block_names(raw.mod["main"]) if name == f"{input_name}_global"]
        if pack:
            width = int(raw.get(raw.get_loops(raw.get_sblock(kernel))[-1]).extent)
            assert width % vector_width(host) == 0
            original = list(workload.param_specs()[1][0])
            packed = raw.get(raw.get_sblock(copies[0])).writes[0].source
            assert [int(extent) for extent in packed.shape] == [original[-1] // width, *original[:-1], width]
            (shared,) = _shared_loops(raw, copies[0], kernel)
            assert int(shared.extent) == _outer_tile_of_last_spatial_loop(sch.trace)
        else:
            assert not copies  # the copy is inlined back
        assert_program_correct(workload, sch.mod, host)


def test_a_constant_weight_read_once_per_call_may_be_packed_in_panels_of_half_vectors(host, two_cores):
    """A single-row matmul reads ``B`` once per call: packing it repays only when ``B`` is a constant whose copy is made
    once (TVM's ``layout_free_buffers``); an ``N`` of whole half vectors but not whole vectors still gets vector tiles."""
    half = vector_width(host) // 2
    shape = (1, 5 * half, 64)
    plain = CATALOG["matmul"].instantiate(shape)
    with pytest.raises(ValueError):  # no copy would repay: no panels offered
        _annotation_sample(generate_space(plain, two_cores).trace, PANEL_KEY)
    workload = dataclasses.replace(plain, mod=tvm.IRModule({"main": plain.mod["main"].with_attr(LAYOUT_FREE_ATTR, [1])}))
    space = generate_space(workload, two_cores)
    (sch,) = _realize_accepted(space, {_annotation_sample(space.trace, PANEL_KEY): 1}, 1)
    raw = sch.tvm
    width = int(raw.get(raw.get_loops(raw.get_sblock("C_update"))[-1]).extent)
    assert width % half == 0
    packed = raw.get(raw.get_sblock("B_global")).writes[0].source
    assert [int(extent) for extent in packed.shape] == [shape[1] // width, shape[2], width]
    assert_program_correct(workload, sch.mod, host)


def test_a_panel_copy_under_an_outer_tile_of_one_leaves_the_row_tiles_parallel(host):
    """The copy sits under the vector loop's outermost tile; drawn as 1, the loops under it run in parallel."""
    workload = CATALOG["matmul"].instantiate((64, 64, 64))
    space = generate_space(workload, host)
    decisions = {**_matmul_decisions(space.trace, 0, vector_width(host)), _annotation_sample(space.trace, PANEL_KEY): 1}
    j_tiling = _perfect_tile_sites(space.trace)[1]
    decisions[j_tiling] = [1, 2, 64 // vector_width(host) // 2, 1]
    sch, rejected = space.realize(space.trace.with_decisions(decisions))
    assert rejected is None
    raw = sch.tvm
    (outer,) = _shared_loops(raw, "B_global", "C_update")
    assert int(outer.extent) == 1 and outer.kind == tvm.tirx.ForKind.SERIAL
    parallel = [raw.get(loop) for loop in raw.get_loops(raw.get_sblock("C_update"))[1:]]
    assert parallel[0].kind == tvm.tirx.ForKind.PARALLEL and int(parallel[0].extent) > 1
    assert_program_correct(workload, sch.mod, host)


@pytest.mark.parametrize("i_tiles, level, jobs, rejected", [
    ([3, 2, 2, 4], 0, 3, True),  # 3 jobs keep 2 cores busy 75% of the time; the next tile level offered 6
    ([3, 2, 2, 4], 1, 6, False),  # the write-back one level deeper: both levels are fused, 3 x 2 jobs
    ([6, 1, 2, 4], 0, 6, False),
])
def test_a_parallel_loop_that_leaves_cores_idle_is_rejected(host, two_cores, i_tiles, level, jobs, rejected):
    workload = CATALOG["matmul"].instantiate((48, 64, 64))
    space = generate_space(workload, two_cores)
    tile_indices = _perfect_tile_sites(space.trace)
    decisions = {**_matmul_decisions(space.trace, level, vector_width(host)), tile_indices[0]: i_tiles}
    decisions[tile_indices[1]] = [1, 1, 64 // vector_width(host), 1]  # the jobs come from i alone
    sch, rejection = space.realize(space.trace.with_decisions(decisions))
    if rejected:
        assert rejection.validator == "rewrite-parallel-vectorize-unroll"
        assert f"{jobs} parallel jobs keep 2 cores busy 75% of the time" in rejection.reason
        return
    assert rejection is None
    parallel = [loop for loop in sch.tvm.get_loops(sch.tvm.get_sblock("C_update")) if sch.tvm.get(loop).kind == tvm.tirx.ForKind.PARALLEL]
    assert [int(sch.tvm.get(loop).extent) for loop in parallel] == [jobs]
    assert_program_correct(workload, sch.mod, host)


def test_few_jobs_are_kept_when_the_workload_offers_no_more(host, two_cores):
    """A sum over 3 rows can only have 3 jobs: its programs are not rejected for them."""
    a = te.placeholder((3, 1024), name="A")
    k = te.reduce_axis((0, 1024), name="k")
    row_sum = te.compute((3,), lambda i: te.sum(a[i, k], axis=k), name="row_sum")
    workload = Workload.from_module(tvm.IRModule({"main": te.create_prim_func([a, row_sum])}))
    space = generate_space(workload, two_cores, modules=["parallel-vectorize"])
    sch, rejection = space.realize(space.trace)
    assert rejection is None
    (outer, _) = [sch.tvm.get(loop) for loop in sch.tvm.get_loops(sch.tvm.get_sblock("row_sum_update"))]
    assert outer.kind == tvm.tirx.ForKind.PARALLEL and int(outer.extent) == 3
    rows = np.random.default_rng(0).standard_normal((3, 1024), dtype=np.float32)
    lib = tvm.compile(sch.mod, target=tvm.target.Target(host.tvm_target))
    _, sums = run_module(lib, [rows, np.zeros(3, np.float32)])
    np.testing.assert_allclose(sums, rows.sum(axis=1), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name", ["conv2d_nchw", "conv2d_nhwc"])
def test_convolution_inputs_are_not_packed(host, name):
    """Read contiguously along the vector loop and through an intermediate (padding) or at ``h + r``: no panels."""
    spec = CATALOG[name]
    space = generate_space(spec.instantiate(spec.small_shape), host)
    assert "cache_read" not in [inst.kind for inst in space.trace.instructions]


def _dense_module(weight_read_again: bool) -> tvm.IRModule:
    x, w = te.placeholder((16, 8), name="X"), te.placeholder((32, 8), name="W")
    k = te.reduce_axis((0, 8), name="k")
    y = te.compute((16, 32), lambda i, j: te.sum(x[i, k] * w[j, k], axis=k), name="Y")
    doubled = [te.compute((32, 8), lambda j, c: w[j, c] * 2.0, name="W2")] if weight_read_again else []
    return tvm.IRModule({"main": te.create_prim_func([x, w, y, *doubled])})


def _batched_matvec_module() -> tvm.IRModule:
    """``A[i, j, k]`` is strided along ``j`` but indexed by every spatial loop: a tile reads each element once."""
    a, v = te.placeholder((4, 16, 32), name="A"), te.placeholder((32,), name="v")
    k = te.reduce_axis((0, 32), name="k")
    y = te.compute((4, 16), lambda i, j: te.sum(a[i, j, k] * v[k], axis=k), name="Y")
    return tvm.IRModule({"main": te.create_prim_func([a, v, y])})


def _rows_scaled_by_matvec_module() -> tvm.IRModule:
    """A tiled reduction (``v`` serves every row) whose result every element of its row reads."""
    a, v, x = te.placeholder((16, 32), name="A"), te.placeholder((32,), name="v"), te.placeholder((16, 64), name="X")
    k = te.reduce_axis((0, 32), name="k")
    scale = te.compute((16,), lambda i: te.sum(a[i, k] * v[k], axis=k), name="scale")
    y = te.compute((16, 64), lambda i, j: x[i, j] * scale[i], name="Y")
    return tvm.IRModule({"main": te.create_prim_func([a, v, x, y])})


@pytest.mark.parametrize(
    "module, packed",
    [(_dense_module(False), True), (_dense_module(True), False), (_batched_matvec_module(), False)],
    ids=["dense", "weight-read-by-another-block", "strided-but-not-reused"],
)
def test_a_strided_input_is_packed_only_when_one_block_reads_it_and_reuses_it(host, module, packed):
    space = generate_space(Workload.from_module(module), host, modules=["multi-level-tiling"])
    assert ("cache_read" in [inst.kind for inst in space.trace.instructions]) == packed


def test_no_write_back_for_an_intermediate_read_by_a_broadcast(host):
    space = generate_space(Workload.from_module(_rows_scaled_by_matvec_module()), host, modules=["multi-level-tiling"])
    kinds = [inst.kind for inst in space.trace.instructions]
    assert "split" in kinds and "cache_write" not in kinds
    assert not any(inst.attrs.get("ann_key") == WRITE_BACK_DEPTH_KEY for inst in space.trace.instructions)


@pytest.mark.parametrize("name", ["matmul", "batch_matmul", "dense_bias_relu", "conv2d_nchw", "conv2d_nhwc"])
def test_every_write_back_level_compiles_and_matches_numpy(host, two_cores, name):
    spec = CATALOG[name]
    workload = spec.instantiate(spec.small_shape, "float32")
    space = generate_space(workload, two_cores, seed=0)
    index = _write_back_sample(space.trace)
    inputs = workload.random_inputs(0)
    expected = workload.reference(*inputs)
    rtol, atol = workload.tolerance()
    target = tvm.target.Target(host.tvm_target)
    accepted = [(level, sch) for level in (0, 1) for sch in _realize_accepted(space, {index: level}, 2, 1 + 2 * level)]
    for level, sch in accepted:
        raw = sch.tvm
        tiled = next(block for block in block_names(raw.mod["main"]) if block.endswith("_update"))
        (write_back,) = raw.get_consumers(raw.get_sblock(tiled))
        shared = _shared_loops(raw, tiled, raw.get(write_back).name_hint)
        assert math.prod(int(loop.extent) for loop in shared) == _spatial_tile_product(sch.trace, level + 1)
        lib = tvm.compile(sch.mod, target=target)
        outputs = [np.zeros(shape, dtype) for shape, dtype in workload.param_specs()[workload.num_inputs :]]
        for got, want in zip(run_module(lib, [*inputs, *outputs])[workload.num_inputs :], expected):
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


# ---- validators ------------------------------------------------------------------------------------------------


@T.prim_func(s_tir=True)
def _prefix_sum(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
    for i in range(16):
        for j in range(i + 1):  # a triangular loop: its extent changes with i
            with T.sblock("prefix"):
                vi = T.axis.spatial(16, i)
                vj = T.axis.reduce(16, j)
                with T.init():
                    B[vi] = T.float32(0)
                B[vi] = B[vi] + A[vj]


@T.prim_func(s_tir=True)
def _row_sum_parallel_over_k(A: T.Buffer((16, 32), "float32"), B: T.Buffer((16,), "float32")):
    for i in range(16):
        for k in T.parallel(32):
            with T.sblock("row_sum"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    B[vi] = T.float32(0)
                B[vi] = B[vi] + A[vi, vk]


@T.prim_func(s_tir=True)
def _row_sum_vectorized_over_k(A: T.Buffer((16, 32), "float32"), B: T.Buffer((16,), "float32")):
    for i in range(16):
        for k in T.vectorized(32):
            with T.sblock("row_sum"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    B[vi] = T.float32(0)
                B[vi] = B[vi] + A[vi, vk]


@dataclass(frozen=True)
class _Steps:
    """A test module: apply ``steps(sch, loops)`` to every block (loops of a plain matmul: i, j, k)."""

    steps: object
    name: str = "test-steps"

    def apply(self, sch: Schedule, block: BlockRV, ctx) -> None:
        self.steps(sch, sch.get_loops(block))


def _vectorize_outer(sch, loops):
    sch.vectorize(loops[0])


def _vectorize_wide(sch, loops):
    i, j, k = loops
    sch.reorder(i, k, j)
    sch.vectorize(j)


def _nested_parallel(sch, loops):
    sch.parallel(loops[0])
    sch.parallel(loops[1])


def _unroll_everything(sch, loops):
    sch.annotate(loops[0], "pragma_auto_unroll_max_step", 1 << 20)
    sch.annotate(loops[0], "pragma_unroll_explicit", 1)


@pytest.mark.parametrize(
    "steps, shape, validator, reason",
    [
        (_vectorize_outer, (16, 16, 16), "verify-vectorize", "not innermost"),
        (_vectorize_wide, (4, 4096, 4), "verify-vectorize", "4096 lanes"),
        (_nested_parallel, (16, 16, 16), "verify-parallel", "nested"),
        (_unroll_everything, (64, 64, 64), "verify-unroll-size", "once unrolled"),
    ],
    ids=["vectorize-outer", "vectorize-wide", "nested-parallel", "unroll-size"],
)
def test_traced_programs_are_rejected_and_counted(host, steps, shape, validator, reason):
    space = generate_space(Workload.from_module(matmul_module(*shape)), host, modules=[_Steps(steps)])
    _, rejected = space.realize(space.trace)
    assert rejected is not None and rejected.validator == validator and reason in rejected.reason
    assert space.sample(Rng(0)) is None and space.sample(Rng(1)) is None
    assert space.rejections == {validator: 3}  # realize counts too


@pytest.mark.parametrize(
    "func, validator, reason",
    [
        (_prefix_sum, "verify-static-loops", "runs from 0 for i + 1"),
        (_row_sum_parallel_over_k, "verify-parallel", "reduction iterator of block row_sum"),
        (_row_sum_vectorized_over_k, "verify-vectorize", "reduction iterator of block row_sum"),
    ],
    ids=["dynamic-extent", "parallel-reduction", "vectorized-reduction"],
)
def test_hand_written_programs_are_rejected_and_counted(host, func, validator, reason):
    space = generate_space(Workload.from_module(func), host, modules=[], validators=VERIFIERS)
    assert space.sample(Rng(0)) is None
    assert space.rejections == {validator: 1}
    _, rejected = space.realize(space.trace)
    assert rejected is not None and reason in rejected.reason


@pytest.mark.parametrize("name", ["matmul", "dense_bias_relu", "conv2d_nhwc"])
def test_normal_samples_pass_every_validator(host, two_cores, name):
    spec = CATALOG[name]
    space = generate_space(spec.instantiate(spec.small_shape), two_cores, seed=0)
    assert set(VERIFIERS) <= set(host.validators)
    rng = Rng(5)
    samples = [space.sample(rng) for _ in range(24)]
    # Only the size limit (big unrolled bodies, never the fastest) and too few parallel jobs for the cores prune
    # the space's own output, and rarely.
    assert set(space.rejections) <= {"verify-unroll-size", "rewrite-parallel-vectorize-unroll"}
    assert sum(s is None for s in samples) == sum(space.rejections.values()) <= 6


def test_a_producer_redone_for_each_element_of_its_consumer_is_rejected(host):
    """A softmax's exponentials and their sum computed under the loop over the row's outputs: each output redoes
    the row's work."""
    workload = CATALOG["softmax"].instantiate((16, 256))
    context = SpaceContext(workload=workload, target=host)
    sch = Schedule(workload.mod)
    assert VerifyNoRecompute().check(sch, context) is None
    _, j = sch.get_loops(sch.get_sblock("T_softmax_norm"))
    sch.compute_at(sch.get_sblock("T_softmax_expsum"), j)
    sch.compute_at(sch.get_sblock("T_softmax_exp"), j)
    reason = VerifyNoRecompute().check(sch, context)
    assert reason is not None and "a block is recomputed" in reason


def test_unroll_estimate_follows_tvm_unroll_rule(host):
    def nest(max_step: int) -> tvm.tirx.Stmt:
        a = te.placeholder((4, 8), name="A")
        b = te.compute((4, 8), lambda i, j: a[i, j] + 1.0, name="B")
        sch = tvm.s_tir.Schedule(te.create_prim_func([a, b]))
        i, _ = sch.get_loops(sch.get_sblock("B"))
        sch.annotate(i, "pragma_auto_unroll_max_step", max_step)
        return sch.mod["main"].body

    assert estimate_unrolled_size(nest(32), vector_width(host)) == 32  # both loops unrolled: 4 x 8 stores
    assert estimate_unrolled_size(nest(8), vector_width(host)) == 8  # only the inner loop fits: 8 stores, once
    assert estimate_unrolled_size(nest(0), vector_width(host)) == 1  # nothing unrolled


def test_unroll_estimate_counts_the_operations_of_each_store(host):
    """A polynomial unrolled is as much code as many stores of a sum: its build took seconds."""

    def unrolled(value) -> int:
        a = te.placeholder((4, 8), name="A")
        b = te.compute((4, 8), lambda i, j: value(a[i, j]), name="B")
        sch = tvm.s_tir.Schedule(te.create_prim_func([a, b]))
        i, _ = sch.get_loops(sch.get_sblock("B"))
        sch.annotate(i, "pragma_auto_unroll_max_step", 32)
        return estimate_unrolled_size(sch.mod["main"].body, vector_width(host))

    def horner(x):  # eight multiply-adds: 16 floating-point nodes, about 8 instructions
        result = x
        for coefficient in range(8):
            result = result * x + float(coefficient + 1)
        return result

    assert unrolled(lambda x: x + 1.0) == 32  # one instruction a store
    assert unrolled(lambda x: x * 2.0 + 1.0) == 32  # a multiply-add is one instruction
    assert unrolled(horner) == 32 * 8


@pytest.mark.parametrize(("k_tiles", "inner_levels"), [([8, 8], 1), ([64, 1], 2)])
def test_accumulator_is_the_output_tile_under_the_innermost_reduction_loop(host, k_tiles, inner_levels):
    # i: 2x2x4x4; j: 2x2x(64 / lanes / 4)x(1 vector); a unit inner k tile adds the spatial level above it
    workload = Workload.from_module(matmul_module(64, 64, 64))
    space = generate_space(workload, host, modules=[MultiLevelTiling()], validators=[])
    decisions = _matmul_decisions(space.trace, 0, vector_width(host))
    decisions[_perfect_tile_sites(space.trace)[2]] = k_tiles
    sch, _ = space.realize(space.trace.with_decisions(decisions))
    rows, columns = (4, vector_width(host)) if inner_levels == 1 else (4 * 4, 64 // 4)
    assert accumulator_bytes(sch.tvm, sch.tvm.get_sblock("C")) == rows * columns * 4
    assert accumulator_bytes(sch.tvm, sch.tvm.get_sblock("C_global")) is None  # the copy-out reduces nothing


def test_register_tile_prior_keeps_a_draw_by_its_accumulator_share_of_the_registers(host):
    workload = Workload.from_module(matmul_module(64, 64, 64))
    tiling = MultiLevelTiling()
    space = generate_space(workload, host, modules=[tiling], validators=[])
    decisions = _matmul_decisions(space.trace, 0, vector_width(host))
    register_bytes = vector_register_bytes(host)
    weights = set()
    for k_tiles in [[8, 8], [64, 1], [1, 64]]:
        decisions[_perfect_tile_sites(space.trace)[2]] = k_tiles
        sch, _ = space.realize(space.trace.with_decisions(decisions))
        tile = accumulator_bytes(sch.tvm, sch.tvm.get_sblock("C"))
        low, high = (share * register_bytes for share in tiling.register_tile)
        expected = 1.0 if low <= tile <= high else tiling.off_register_tile_weight
        weights.add(tiling.prior(sch.tvm, space.context))
        assert tiling.prior(sch.tvm, space.context) == expected
    assert weights == {1.0, tiling.off_register_tile_weight}  # these tiles fall on both sides, AVX2 or AVX-512
    # a block that is not tiled (softmax's row reductions) leaves every draw as likely as before
    softmax = CATALOG["softmax"].instantiate(CATALOG["softmax"].small_shape)
    softmax_space = generate_space(softmax, host)
    sch, _ = softmax_space.draw(Rng(0))
    assert tiling.prior(sch.tvm, softmax_space.context) == 1.0


@pytest.mark.parametrize("target_name", ["x86-avx2", "x86-avx512"])
def test_draws_under_the_register_tile_prior_fill_the_registers_more_often(target_name):
    target = resolve_target(target_name)  # drawn, not run: any x86 machine
    workload = Workload.from_module(matmul_module(256, 256, 256))
    tiling = MultiLevelTiling()
    low, high = (share * vector_register_bytes(target) for share in tiling.register_tile)

    def share_in_range(modules) -> float:
        space = generate_space(workload, target, modules=modules, validators=[])
        rng, inside = Rng(7), 0
        for _ in range(40):
            sch, _ = space.draw(rng)
            again = Schedule.replay(workload.mod, sch.trace)  # the finished draw's own tiled block
            inside += low <= accumulator_bytes(again.tvm, again.tvm.get_sblock("C")) <= high
        return inside / 40

    without = share_in_range([dataclasses.replace(tiling, off_register_tile_weight=1.0)])
    with_prior = share_in_range([tiling])
    assert with_prior >= without + 0.3


def test_targets_know_their_vector_register_files():
    assert vector_register_bytes(resolve_target("x86-avx512")) == 32 * 64
    assert vector_register_bytes(resolve_target("x86-avx2")) == 16 * 32
    assert vector_register_bytes(resolve_target("arm-neon")) == 32 * 16
    host = resolve_target("host")
    assert vector_register_bytes(host) == (32 * 64 if vector_width(host) == 16 else 16 * vector_width(host) * 4)


def test_a_cpu_module_on_a_target_without_a_vector_unit_names_what_is_missing():
    bare = dataclasses.replace(resolve_target("host"), name="bare", attrs={})
    with pytest.raises(ValueError, match=r"target 'bare' has no 'vector_width'"):
        vector_width(bare)


def test_the_unroll_limit_holds_for_each_loop_nest_and_a_larger_one_for_the_function(host):
    """Two nests of 32 stores each unrolled: each is judged against the nest limit, their sum against the
    function's (a run of recurrent steps is several nests, each as large as one step's)."""
    a = te.placeholder((4, 8), name="A")
    b = te.compute((4, 8), lambda i, j: a[i, j] + 1.0, name="B")
    c = te.compute((4, 8), lambda i, j: b[i, j] * 2.0, name="C")
    workload = Workload.from_module(tvm.IRModule({"main": te.create_prim_func([a, c])}))
    sch = Schedule(workload.mod)
    for name in ("B", "C"):
        i, _ = sch.get_loops(sch.get_sblock(name))
        sch.annotate(i, "pragma_auto_unroll_max_step", 32)
    context = SpaceContext(workload=workload, target=host)
    assert VerifyUnrollSize(max_vector_ops=32, max_function_ops=64).check(sch, context) is None
    assert "a loop nest of about 32" in VerifyUnrollSize(max_vector_ops=31, max_function_ops=64).check(sch, context)
    assert "about 64 vector operations" in VerifyUnrollSize(max_vector_ops=32, max_function_ops=63).check(sch, context)
