"""CPU modules auto-inline, random-compute-location and add-rfactor: where they apply, replay, correctness."""

from __future__ import annotations

import pytest
import tvm
import tvm_ffi
from tvm import s_tir, te, tirx

from conftest import assert_program_correct, assert_samples_correct
from probtune import Rng, Schedule, generate_space
from probtune.plugin import AutoUnroll
from probtune.schedule.analysis import block_names, child_stmts, find_realize, iter_stmts
from probtune.search.search_strategy import RandomSearch
from probtune.workloads.catalog import BUILTIN_WORKLOADS
from probtune.workloads.workload import Workload
from probtune_cpu.auto_inline import AutoInline
from probtune_cpu.defaults import DEFAULT_MODULES
from probtune_cpu.parallel_vectorize import MAX_UNROLLED_EXTREMUM_STEPS, VECTOR_SPLIT_KEY
from probtune_cpu.random_compute_location import PLACE_PRODUCERS_KEY
from probtune_cpu.vector_unit import vector_width

CATALOG = {spec.name: spec for spec in BUILTIN_WORKLOADS}
FULL_CPU_SPACE = list(DEFAULT_MODULES)


def catalog_workload(name: str, shape: tuple[int, ...] | None = None) -> Workload:
    spec = CATALOG[name]
    return spec.instantiate(shape or spec.small_shape, "float32")


def fresh_program(workload: Workload, space, seed: int) -> tirx.PrimFunc:
    """The space's program for fresh decisions, before validators run."""
    return Schedule.replay(workload.mod, space.trace.with_decisions({}), rng=Rng(seed)).mod["main"]


def instruction_kinds(space) -> list[str]:
    return [inst.kind for inst in space.trace.instructions]


def located_blocks(trace) -> list[str]:
    """For each sample_compute_location of ``trace``, the name of the block it places."""
    names = {inst.outputs[0]: inst.attrs["name"] for inst in trace.instructions if inst.kind == "get_sblock"}
    return [names[inst.inputs[0]["rv"]] for inst in trace.instructions if inst.kind == "sample_compute_location"]


def sampled_tiles(trace) -> dict[str, list[int]]:
    """For each sample_perfect_tile of ``trace``, its decision, keyed by the block named last before it."""
    tiles, block = {}, None
    for index, inst in enumerate(trace.instructions):
        if inst.kind == "get_sblock":
            block = inst.attrs["name"]
        elif inst.kind == "sample_perfect_tile":
            tiles[block] = trace.decision(index)
    return tiles


def allocated_shape(func: tirx.PrimFunc, buffer_name: str) -> list[int]:
    (buffer,) = [b for b in func.body.block.alloc_buffers if b.name == buffer_name]
    return [int(n) for n in buffer.shape]


def loop_mates(func: tirx.PrimFunc, name: str) -> set[str]:
    """Blocks that share at least one enclosing loop with block ``name``."""
    mates: set[str] = set()
    for stmt in iter_stmts(func.body):
        if isinstance(stmt, tirx.For):
            inside = {s.block.name_hint for s in iter_stmts(stmt) if isinstance(s, s_tir.SBlockRealize)}
            if name in inside:
                mates |= inside - {name}
    return mates


# ---------------------------------------------------------------- auto-inline


@pytest.mark.parametrize("name", ["conv2d_nchw", "conv2d_nhwc", "depthwise_conv2d_nchw"])
def test_auto_inline_keeps_conv_padding_for_random_compute_location(name, host):
    workload = catalog_workload(name)
    space = generate_space(workload, host, modules=["auto-inline", "random-compute-location"])
    assert "compute_inline" not in instruction_kinds(space)
    assert located_blocks(space.trace) == ["pad_temp"]


@pytest.mark.parametrize("name", ["conv2d_nchw", "conv2d_nhwc", "depthwise_conv2d_nchw"])
def test_auto_inline_folds_conv_padding_when_branches_may_be_recomputed(name, host):
    workload = catalog_workload(name)
    space = generate_space(workload, host, modules=[AutoInline(costly_ops=("tirx.exp",))])
    assert instruction_kinds(space).count("compute_inline") == 1
    assert block_names(fresh_program(workload, space, 0)) == [name]
    assert_samples_correct(workload, space, host, samples=1)


def test_auto_inline_folds_relu_into_the_bias_add_and_leaves_the_dense_alone(host):
    workload = catalog_workload("dense_bias_relu")
    space = generate_space(workload, host, modules=["auto-inline"])
    assert instruction_kinds(space).count("reverse_compute_inline") == 1
    assert "compute_inline" not in instruction_kinds(space)
    func = fresh_program(workload, space, 0)
    assert block_names(func) == ["T_dense", "T_bias_add"]
    bias_add = find_realize(func, "T_bias_add").block
    assert [region.source.name for region in bias_add.writes] == ["T_relu"]
    assert "T.max" in bias_add.script()
    dense = find_realize(func, "T_dense").block
    assert tvm_ffi.structural_equal(dense, find_realize(workload.prim_func, "T_dense").block)
    assert_samples_correct(workload, space, host, samples=1)


@pytest.mark.parametrize("name", ["softmax", "layer_norm", "matmul"])
def test_auto_inline_keeps_reductions_and_exp_with_two_readers(name, host):
    workload = catalog_workload(name)
    space = generate_space(workload, host, modules=["auto-inline"])
    assert set(instruction_kinds(space)) == {"get_sblock"}, "a refused primitive reached the trace"


def test_auto_inline_inlines_exp_when_the_function_has_no_reduction(host):
    a = te.placeholder((8, 16), name="A")
    exp = te.compute(a.shape, lambda i, j: te.exp(a[i, j]), name="E")
    shifted = te.compute(a.shape, lambda i, j: exp[i, j] + 1.0, name="F")
    out = te.compute(a.shape, lambda i, j: shifted[i, j] * exp[i, j], name="Out")
    workload = Workload.from_module(tvm.IRModule({"main": te.create_prim_func([a, out])}))
    space = generate_space(workload, host, modules=["auto-inline"])
    assert block_names(fresh_program(workload, space, 0)) == ["Out"]


def test_auto_inline_folds_no_part_of_a_split_into_the_sum_they_all_read(host):
    """An LSTM step: one step's input projection taken from all steps', two biases added, the gates split in four.
    Folding the last part into the sum left the other parts reading a buffer nothing wrote."""
    from tvm import topi

    steps = te.placeholder((5, 1, 32), name="steps")
    recurrent = te.placeholder((1, 32), name="recurrent")
    bias = te.placeholder((32,), name="bias")
    step = topi.squeeze(topi.strided_slice(steps, [2, 0, 0], [3, 1, 32]), axis=[0])
    summed = topi.add(topi.add(step, recurrent), bias)
    gates = topi.split(summed, 4, axis=1)
    workload = Workload.from_module(tvm.IRModule({"main": te.create_prim_func([steps, recurrent, bias, *gates])}))
    assert_samples_correct(workload, generate_space(workload, host), host, samples=6)


def test_auto_inline_folds_no_crop_into_the_wider_block_it_reads(host):
    """A convolution to 64 channels, ReLU, the first 58 kept (pad-channels' crop): folded into the ReLU, the crop
    kept its 64 iterations and wrote past its 58 channels. The ReLU is inlined into the crop instead."""
    from tvm import topi

    data = te.placeholder((1, 6, 6, 16), name="data")
    kernel = te.placeholder((1, 1, 16, 64), name="kernel")
    relu = topi.nn.relu(topi.nn.conv2d_nhwc(data, kernel, 1, 0, 1))
    crop = topi.strided_slice(relu, [0, 0, 0, 0], [1, 6, 6, 58])
    workload = Workload.from_module(tvm.IRModule({"main": te.create_prim_func([data, kernel, crop])}))
    assert "compute" not in block_names(fresh_program(workload, generate_space(workload, host, modules=["auto-inline"]), 0))
    assert_samples_correct(workload, generate_space(workload, host), host, samples=6)


def test_auto_inline_keeps_a_pass_its_consumer_reads_at_two_places(host):
    """A bilinear upsampling in two passes: the pass along the height reads two rows of the pass along the width
    for each element. Inlined, the first pass would be computed twice per output element; it is kept, and
    random-compute-location may still sample inlining it."""
    from probtune.model.legalize import bilinear_upsampling

    data = te.placeholder((1, 4, 8, 8), name="data")
    out = bilinear_upsampling(data, (32, 32), "NCHW", "half_pixel")
    workload = Workload.from_module(tvm.IRModule({"main": te.create_prim_func([data, out])}))
    space = generate_space(workload, host, modules=["auto-inline"])
    assert block_names(fresh_program(workload, space, 0)) == ["resize_width", "resize_height"]
    full = generate_space(workload, host)
    assert "resize_width" in located_blocks(full.trace)
    assert_samples_correct(workload, full, host, samples=6)


def _rolled_windows() -> Workload:
    """Swin's window merge and cyclic shift: 2 x 2 windows of 7 x 7 merged into a 14 x 14 map, rolled by 3 along
    its rows, then its columns (each a choice between two reads), plus a residual."""
    windows = te.placeholder((4, 7, 7, 8), name="windows")
    residual = te.placeholder((1, 14, 14, 8), name="residual")
    merged = te.compute((1, 14, 14, 8), lambda n, h, w, c: windows[h // 7 * 2 + w // 7, h % 7, w % 7, c], name="merged")
    rows = te.compute(merged.shape, lambda n, h, w, c: tirx.if_then_else(
        h >= 3, merged[n, h - 3, w, c], merged[n, h + 11, w, c]), name="rows")
    cols = te.compute(merged.shape, lambda n, h, w, c: tirx.if_then_else(
        w >= 3, rows[n, h, w - 3, c], rows[n, h, w + 11, c]), name="cols")
    out = te.compute(merged.shape, lambda *i: cols(*i) + residual(*i), name="out")
    return Workload.from_module(tvm.IRModule({"main": te.create_prim_func([windows, residual, out])}))


def test_auto_inline_takes_a_roll_as_one_read_per_element(host):
    """A roll reads its input in one branch or the other of a choice: one place per element, so it is inlined.
    Kept, random-compute-location computed the merge under the roll's parallel rows, where TVM's region of a read
    at two distant rows made Swin-T's default program wrong."""
    workload = _rolled_windows()
    space = generate_space(workload, host, modules=["auto-inline"])
    assert len(block_names(fresh_program(workload, space, 0))) == 1  # merged, rolled and added in one block
    assert_samples_correct(workload, generate_space(workload, host), host, samples=8)


def _tanh_then(consumer: str) -> Workload:
    """``tanh(A)`` read by a matrix product (each element once per column) or by an elementwise add."""
    a = te.placeholder((4, 16), name="A")
    t = te.compute(a.shape, lambda i, j: te.tanh(a[i, j]), name="T")
    if consumer == "matmul":
        w = te.placeholder((16, 32), name="W")
        k = te.reduce_axis((0, 16), "k")
        out = te.compute((4, 32), lambda i, c: te.sum(t[i, k] * w[k, c], axis=k), name="Out")
        return Workload.from_module(tvm.IRModule({"main": te.create_prim_func([a, w, out])}))
    out = te.compute(a.shape, lambda i, j: t[i, j] + a[i, j], name="Out")
    return Workload.from_module(tvm.IRModule({"main": te.create_prim_func([a, out])}))


@pytest.mark.parametrize(("consumer", "kept"), [("matmul", True), ("add", False)])
def test_auto_inline_keeps_a_transcendental_that_its_consumer_would_recompute(consumer, kept, host):
    """A recurrent cell's state is the next step's matrix product's operand: inlined, its tanh would be computed
    once per column of the product. Read once per element, it is inlined as before."""
    workload = _tanh_then(consumer)
    space = generate_space(workload, host, modules=["auto-inline"])
    assert len(block_names(fresh_program(workload, space, 0))) == (2 if kept else 1)
    assert_samples_correct(workload, generate_space(workload, host), host, samples=4)


# ---------------------------------------------------------------- random-compute-location


def test_random_compute_location_places_conv_padding(host):
    workload = catalog_workload("conv2d_nchw")
    space = generate_space(workload, host, modules=["random-compute-location"])
    assert located_blocks(space.trace) == ["pad_temp"]
    assert instruction_kinds(space)[-1] == "compute_at"
    index = instruction_kinds(space).index("sample_compute_location")
    decisions = {
        RandomSearch(space, Rng(seed)).next_batch(1)[0].trace.decision(index) for seed in range(12)
    }
    assert -1 in decisions and any(d >= 0 for d in decisions), decisions

    at_root = Schedule.replay(workload.mod, space.trace.with_decisions({index: -1})).mod
    assert tvm_ffi.structural_equal(at_root, workload.mod)
    inlined = Schedule.replay(workload.mod, space.trace.with_decisions({index: -2})).mod["main"]
    assert block_names(inlined) == ["conv2d_nchw"]
    inside = Schedule.replay(workload.mod, space.trace.with_decisions({index: 3})).mod["main"]
    assert loop_mates(inside, "pad_temp") == {"conv2d_nchw"}
    assert_samples_correct(workload, space, host, samples=4)


def test_random_compute_location_skips_tiled_blocks_and_outputs(host):
    workload = catalog_workload("dense_bias_relu")
    space = generate_space(workload, host, modules=["multi-level-tiling", "random-compute-location"])
    assert located_blocks(space.trace) == ["T_bias_add"]  # not the tiled T_dense, not the output T_relu
    assert_samples_correct(workload, space, host, samples=3)


def test_random_compute_location_does_nothing_on_a_single_block(host):
    workload = catalog_workload("matmul")
    space = generate_space(workload, host, modules=["random-compute-location"])
    assert instruction_kinds(space) == ["get_sblock"]


# ---------------------------------------------------------------- add-rfactor


@pytest.mark.parametrize(
    ("name", "shape", "reductions"),
    [
        ("softmax", (4, 256), ["T_softmax_maxelem", "T_softmax_expsum"]),
        ("layer_norm", (6, 192), ["T_layer_norm_sum", "T_layer_norm_sq_dev_sum"]),
        ("matmul", (2, 2, 512), ["C"]),  # matrix-vector-like: too few outputs for the cores
    ],
)
def test_add_rfactor_splits_long_reductions(name, shape, reductions, host):
    workload = catalog_workload(name, shape)
    space = generate_space(workload, host, modules=["add-rfactor"])
    assert instruction_kinds(space).count("rfactor") == len(reductions)
    untouched = [n for n in block_names(workload.prim_func) if n not in reductions]
    for seed in range(3):
        program = Schedule.replay(workload.mod, space.trace.with_decisions({}), rng=Rng(seed))
        func = program.mod["main"]
        tiles = sampled_tiles(program.trace)
        assert sorted(block_names(func)) == sorted([*block_names(workload.prim_func), *(f"{r}_rf" for r in reductions)])
        for reduction in reductions:
            outer, inner = tiles[reduction]
            assert outer * inner == shape[-1] and inner <= 64
            (result,) = find_realize(func, reduction).block.writes
            partials = allocated_shape(func, f"{reduction}.rf")
            assert len(partials) == len(result.region) + 1 and partials[-1] == inner  # partials: a new innermost axis
            assert PLACE_PRODUCERS_KEY in find_realize(func, reduction).block.annotations
        for other in untouched:
            before = find_realize(workload.prim_func, other).block
            assert tvm_ffi.structural_equal(find_realize(func, other).block, before)
    assert_samples_correct(workload, space, host, samples=3)


def test_add_rfactor_splits_row_reductions_with_many_rows(host):
    workload = catalog_workload("layer_norm", (1024, 64))
    space = generate_space(workload, host, modules=["add-rfactor"])
    assert instruction_kinds(space).count("rfactor") == 2


@pytest.mark.parametrize(
    ("name", "shape"),
    [("softmax", (4, 16)), ("matmul", (24, 40, 56)), ("matmul", (4, 8, 512)), ("conv2d_nchw", None)],
)
def test_add_rfactor_leaves_short_or_matmul_like_reductions_alone(name, shape, host):
    workload = catalog_workload(name, shape)
    space = generate_space(workload, host, modules=["add-rfactor"])
    assert set(instruction_kinds(space)) == {"get_sblock"}


def test_random_compute_location_places_the_partial_sums(host):
    workload = catalog_workload("softmax", (4, 256))
    space = generate_space(workload, host, modules=["add-rfactor", "random-compute-location"])
    assert set(located_blocks(space.trace)) >= {"T_softmax_maxelem_rf", "T_softmax_expsum_rf"}
    nested = set()
    for seed in range(8):
        func = fresh_program(workload, space, seed)
        assert all(PLACE_PRODUCERS_KEY not in find_realize(func, n).block.annotations for n in block_names(func))
        nested |= {n for n in ("T_softmax_maxelem", "T_softmax_expsum") if f"{n}_rf" in loop_mates(func, n)}
    assert nested, "no sample computed the partial sums inside the loop that sums them"
    assert_samples_correct(workload, space, host, samples=4)


@pytest.mark.parametrize(("name", "shape"), [("softmax", (4, 256)), ("layer_norm", (6, 192))])
def test_partial_sums_are_vectorized_wherever_they_are_placed(name, shape, host):
    """At the root (own parallel loop) or inside the loop that sums them (loops rebuilt reduction-innermost)."""
    workload = catalog_workload(name, shape)
    space = generate_space(workload, host)
    placements = set()
    for candidate in RandomSearch(space, Rng(3)).next_batch(12):
        func = candidate.mod["main"]
        for block in [n for n in block_names(func) if n.endswith("_rf_update")]:
            if allocated_shape(func, block.replace("_rf_update", ".rf"))[-1] == 1:
                continue  # an inner factor of 1: nothing to vectorize
            (innermost,) = [s for s in iter_stmts(func.body) if isinstance(s, tirx.For)
                            and isinstance(s.body, s_tir.SBlockRealize) and s.body.block.name_hint == block]
            if int(innermost.extent) == 1:
                continue  # placed inside the loop over the partials: one partial per iteration
            assert innermost.kind == tirx.ForKind.VECTORIZED, f"{block} of {candidate.trace.decisions}"
            placements.add(bool(loop_mates(func, block) - {block.replace("_update", "_init")}))
    assert placements == {True, False}, "the samples did not place partial sums both at the root and inside"


# ---------------------------------------------------------------- multi-level-tiling and parallel-vectorize


@pytest.mark.parametrize(("name", "shape"), [("softmax", (4, 256)), ("layer_norm", (6, 192))])
def test_multi_level_tiling_leaves_row_reductions_alone(name, shape, host):
    space = generate_space(catalog_workload(name, shape), host, modules=["multi-level-tiling"])
    assert "split" not in instruction_kinds(space)


def test_a_long_elementwise_loop_is_split_at_a_sampled_width_and_vectorized(host):
    workload = catalog_workload("softmax", (4, 32 * vector_width(host)))  # rows of more than 16 vectors
    space = generate_space(workload, host, modules=["parallel-vectorize"])
    lanes = vector_width(host)
    splits = [i for i, inst in enumerate(space.trace.instructions)
              if inst.kind == "sample_categorical" and list(inst.attrs["candidates"]) == [lanes * v for v in (1, 2, 4, 8)]]
    assert len(splits) == 2  # the exponentials and the normalisation; the reductions' innermost loops are not spatial
    for choice, vectors in enumerate((1, 2, 4, 8)):
        sch, rejected = space.realize(space.trace.with_decisions({i: choice for i in splits}), Rng(0))
        assert rejected is None
        func = sch.mod["main"]
        for name in ("T_softmax_exp", "T_softmax_norm"):
            (innermost,) = [s for s in iter_stmts(func.body) if isinstance(s, tirx.For)
                            and isinstance(s.body, s_tir.SBlockRealize) and s.body.block.name_hint == name]
            assert innermost.kind == tirx.ForKind.VECTORIZED and int(innermost.extent) == vectors * lanes
            assert VECTOR_SPLIT_KEY not in find_realize(func, name).block.annotations
        assert_program_correct(workload, sch.mod, host)


def test_a_transpose_gathers_one_vector_at_a_time(host):
    """A channels-last transpose reads its input across the vectorized loop: each vector lane is a load of its own,
    and 96 of them unrolled made LLVM's build far too slow; only a vector's width at a time is vectorized."""
    a = te.placeholder((1, 96, 6, 7), name="a")
    out = te.compute((1, 6, 7, 96), lambda n, h, w, c: a[n, c, h, w], name="T")
    workload = Workload.from_module(tvm.IRModule({"main": te.create_prim_func([a, out])}))
    lanes = vector_width(host)
    for candidate in assert_samples_correct(workload, generate_space(workload, host), host, samples=4):
        vectors = [s for s in iter_stmts(candidate.mod["main"].body)
                   if isinstance(s, tirx.For) and s.kind == tirx.ForKind.VECTORIZED]
        assert vectors and all(int(loop.extent) <= lanes for loop in vectors)


def _parallel_loops(func: tirx.PrimFunc) -> list[tirx.For]:
    return [s for s in iter_stmts(func.body) if isinstance(s, tirx.For) and s.kind == tirx.ForKind.PARALLEL]


def _row_of(a: te.Tensor, k: int):
    return lambda _, j: a[k, j]


def test_a_block_of_few_iterations_runs_on_one_core(host):
    """A split into 8 pieces of 512 floats: each piece's copy is shorter than starting the workers; a piece of 8192
    floats is split over the cores."""
    for size, parallel in ((512, False), (8192, True)):
        a = te.placeholder((8, size), name="a")
        pieces = [te.compute((1, size), _row_of(a, k), name=f"piece{k}") for k in range(8)]
        workload = Workload.from_module(tvm.IRModule({"main": te.create_prim_func([a, *pieces])}))
        for candidate in assert_samples_correct(workload, generate_space(workload, host), host, samples=3):
            assert bool(_parallel_loops(candidate.mod["main"])) == parallel, size


@pytest.mark.parametrize(("shape", "sampled"), [((1, 128, 512), True), ((64, 128, 512), False)])
def test_a_small_product_may_run_on_one_core(host, shape, sampled):
    """A recurrent step's product (1 x 128 x 512, 65k multiply-adds) takes about as long on one core as starting
    and joining the workers: whether it is parallel is sampled, and both choices compute the product. A larger
    one is always parallel."""
    import dataclasses

    m, k, n = shape
    a, w = te.placeholder((m, k), name="A"), te.placeholder((k, n), name="W")
    r = te.reduce_axis((0, k), "r")
    out = te.compute((m, n), lambda i, j: te.sum(a[i, r] * w[r, j], axis=r), name="P")
    workload = Workload.from_module(tvm.IRModule({"main": te.create_prim_func([a, w, out])}))
    two_cores = dataclasses.replace(host, tvm_target={**host.tvm_target, "num-cores": 2})
    space = generate_space(workload, two_cores)
    choices = [i for i, inst in enumerate(space.trace.instructions)
               if inst.kind == "sample_categorical" and list(inst.attrs["candidates"]) == [1, 32]]
    assert len(choices) == (1 if sampled else 0)
    parallel_loops = set()
    for decision in range(2 if sampled else 1):
        sch, rejected = space.realize(space.trace.with_decisions({i: decision for i in choices}), Rng(1))
        assert rejected is None
        parallel_loops.add(any(isinstance(s, tirx.For) and s.kind == tirx.ForKind.PARALLEL
                               for s in iter_stmts(sch.mod["main"].body)))
        assert_program_correct(workload, sch.mod, host)
    assert parallel_loops == ({False, True} if sampled else {True})


def test_softmax_can_make_one_parallel_pass_over_each_row(host):
    """Every block placed in the normalisation's loop over rows: max, exponentials, sum and division row by row."""
    workload = catalog_workload("softmax", (4, 256))
    space = generate_space(workload, host)
    first_loop = {i: 0 for i, inst in enumerate(space.trace.instructions) if inst.kind == "sample_compute_location"}
    assert len(first_loop) == 5  # the two sums, their partials and the exponentials
    sch, rejected = space.realize(space.trace.with_decisions(first_loop), Rng(0))
    assert rejected is None
    root = sch.mod["main"].body.block.body
    assert isinstance(root, tirx.For) and root.kind == tirx.ForKind.PARALLEL and int(root.extent) == 4
    assert set(block_names(sch.mod["main"])) - {"root"} == {
        s.block.name_hint for s in iter_stmts(root) if isinstance(s, s_tir.SBlockRealize)
    }
    assert_program_correct(workload, sch.mod, host)


def unroll_limits(func: tirx.PrimFunc) -> dict[str, int]:
    """For each block, the ``pragma_auto_unroll_max_step`` of its innermost enclosing loop that has one (0: none)."""
    limits: dict[str, int] = {}

    def visit(stmt: tirx.Stmt, limit: int) -> None:
        if isinstance(stmt, tirx.For) and "pragma_auto_unroll_max_step" in stmt.annotations:
            limit = int(stmt.annotations["pragma_auto_unroll_max_step"])
        if isinstance(stmt, s_tir.SBlockRealize):
            limits[stmt.block.name_hint] = limit
        for child in child_stmts(stmt):
            visit(child, limit)

    visit(func.body, 0)
    return limits


def test_max_reductions_unroll_no_more_than_their_own_limit(host):
    """LLVM takes exponential time on long unrolled chains of float max updates; the rest of the nest keeps the sampled step."""
    workload = catalog_workload("softmax", (4, 256))
    # The steps hold whatever compute locations are drawn; some of those draws recompute a block and are refused.
    validators = [name for name in host.validators if name != "verify-no-recompute"]
    space = generate_space(workload, host, validators=validators)
    steps = AutoUnroll().max_steps
    unrolls = [i for i, inst in enumerate(space.trace.instructions)
               if inst.kind == "sample_categorical" and list(inst.attrs["candidates"]) == list(steps)]
    assert unrolls
    for choice, step in enumerate(steps):
        sch, rejected = space.realize(space.trace.with_decisions({i: choice for i in unrolls}), Rng(choice))
        assert rejected is None
        limits = unroll_limits(sch.mod["main"])
        maxes = {limits[n] for n in limits if n.startswith("T_softmax_maxelem") and not n.endswith("_init")}
        assert max(maxes) == min(step, MAX_UNROLLED_EXTREMUM_STEPS), limits
        assert limits["T_softmax_norm"] == step, limits
        assert_program_correct(workload, sch.mod, host)


# ---------------------------------------------------------------- the modules together


@pytest.mark.parametrize("spec", BUILTIN_WORKLOADS, ids=lambda s: s.name)
def test_full_cpu_space_samples_compile_and_are_correct(spec, host):
    workload = catalog_workload(spec.name)
    space = generate_space(workload, host, modules=FULL_CPU_SPACE)
    assert_samples_correct(workload, space, host, samples=3)


@pytest.mark.parametrize(("name", "shape"), [("softmax", (4, 256)), ("layer_norm", (6, 192)), ("conv2d_nchw", None)])
def test_full_cpu_space_with_partial_sums_and_placed_padding(name, shape, host):
    workload = catalog_workload(name, shape)
    space = generate_space(workload, host, modules=FULL_CPU_SPACE)
    assert_samples_correct(workload, space, host, samples=3)
