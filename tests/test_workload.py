"""Tests of Workload: user modules, shape parsing, resolution and its error messages."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from probtune.errors import UnknownWorkloadError, WorkloadShapeError
from probtune.workloads.catalog import BUILTIN_WORKLOADS, resolve_workload
from probtune.workloads.workload import Workload, count_inputs, parse_shape

SPECS = {spec.name: spec for spec in BUILTIN_WORKLOADS}


@T.prim_func(s_tir=True)
def hand_matmul(
    A: T.Buffer((24, 40), "float32"),
    B: T.Buffer((40, 16), "float32"),
    C: T.Buffer((24, 16), "float32"),
):
    for i, j, k in T.grid(24, 16, 40):
        with T.sblock("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]


@T.prim_func(s_tir=True)
def output_first(
    C: T.Buffer((8,), "float32"), A: T.Buffer((8,), "float32"), B: T.Buffer((8,), "float32")
):
    for i in range(8):
        with T.sblock("C"):
            vi = T.axis.remap("S", [i])
            C[vi] = A[vi] + B[vi]


@T.prim_func(s_tir=True)
def accumulate_in_place(A: T.Buffer((8,), "int32"), Acc: T.Buffer((8,), "int32")):
    for i in range(8):
        with T.sblock("Acc"):
            vi = T.axis.remap("S", [i])
            Acc[vi] = Acc[vi] + A[vi] * 3


@T.prim_func(s_tir=True)
def writes_nothing(A: T.Buffer((8,), "float32"), B: T.Buffer((8,), "float32")):
    for i in range(8):
        with T.sblock("scratch"):
            vi = T.axis.remap("S", [i])
            scratch = T.sblock_alloc_buffer((1,), "float32")
            scratch[0] = A[vi] + B[vi]


@T.prim_func(s_tir=True)
def dynamic_copy(a: T.handle, b: T.handle):
    n = T.int32()
    A = T.match_buffer(a, (n,), "float32")
    B = T.match_buffer(b, (n,), "float32")
    for i in range(n):
        with T.sblock("B"):
            vi = T.axis.remap("S", [i])
            B[vi] = A[vi]


# ------------------------------------------------------------------ parse_shape


@pytest.mark.parametrize(
    ("text", "shape"),
    [
        ("512,512,512", (512, 512, 512)),
        ("512x512x512", (512, 512, 512)),
        (" 12 x 128 , 64 ", (12, 128, 64)),
        ("(1, 2)", (1, 2)),
        ("[7]", (7,)),
        ("3 4", (3, 4)),
        ([3, 4, 5], (3, 4, 5)),
        ((np.int64(8), 2), (8, 2)),
    ],
)
def test_parse_shape_accepts_common_spellings(text: object, shape: tuple[int, ...]) -> None:
    assert parse_shape(text) == shape


@pytest.mark.parametrize(
    "text",
    ["", "  ", "abc", "512,,512", "512,512,", "1.5,2", "-1,2", "0,3", "5e3", "٣,4", "2**10"],
)
def test_parse_shape_rejects_junk_strings(text: str) -> None:
    with pytest.raises(WorkloadShapeError, match=re.escape(repr(text)) + "|positive"):
        parse_shape(text)


@pytest.mark.parametrize("value", [[1, 0], [1.5, 2], [True, 2], [], ["3"], 5, None])
def test_parse_shape_rejects_bad_sequences(value: object) -> None:
    with pytest.raises(WorkloadShapeError):
        parse_shape(value)  # type: ignore[arg-type]


def test_parse_shape_admits_zero_only_on_request() -> None:
    assert parse_shape("1,0", allow_zero=True) == (1, 0)
    with pytest.raises(WorkloadShapeError, match="non-negative"):
        parse_shape("1,-1", allow_zero=True)


# ------------------------------------------------------------------ resolve_workload


def test_resolve_catalog_name_with_default_and_given_shapes() -> None:
    default = resolve_workload("matmul")
    assert default.key == "matmul(512,512,512):float32"
    assert default.flops == 2 * 512**3
    assert resolve_workload("matmul", "64x32x16").key == "matmul(64,32,16):float32"
    assert resolve_workload("matmul", (64, 32, 16), "float64").dtype == "float64"
    assert resolve_workload("conv2d_nhwc", "1,8,7,7,8,1,1,1,0").shape[-1] == 0


def test_resolve_unknown_name_lists_known_workloads() -> None:
    with pytest.raises(UnknownWorkloadError) as raised:
        resolve_workload("foo")
    message = str(raised.value)
    assert message.startswith("unknown workload 'foo'; known workloads: ")
    assert all(name in message for name in SPECS)
    assert isinstance(raised.value, KeyError)


def test_resolve_uses_the_given_specs() -> None:
    only_softmax = {"softmax": SPECS["softmax"]}
    assert resolve_workload("softmax", (4, 8), specs=only_softmax).name == "softmax"
    with pytest.raises(UnknownWorkloadError, match=r"known workloads: softmax$"):
        resolve_workload("matmul", specs=only_softmax)


@pytest.mark.parametrize(
    ("name", "shape", "message"),
    [
        ("matmul", "512,512", r"matmul takes 3 shape parameters \(M, N, K\), got 2: \(512, 512\)"),
        ("matmul", "512,0,512", r"matmul shape parameter N must be positive, got 0"),
        ("batch_matmul", (1, 2, 3), r"batch_matmul takes 4 shape parameters \(B, M, N, K\)"),
        ("softmax", "4,-8", r"non-negative"),
        ("softmax", "four,eight", r"cannot parse shape 'four,eight'"),
    ],
)
def test_resolve_rejects_bad_shapes(name: str, shape: object, message: str) -> None:
    with pytest.raises(WorkloadShapeError, match=message):
        resolve_workload(name, shape)  # type: ignore[arg-type]


def test_resolve_rejects_unsupported_dtype() -> None:
    with pytest.raises(WorkloadShapeError, match="supports dtypes"):
        resolve_workload("softmax", (4, 8), "float16x")


def test_resolve_passes_modules_and_workloads_through() -> None:
    workload = resolve_workload(hand_matmul)
    assert resolve_workload(workload) is workload
    assert resolve_workload(tvm.IRModule({"main": hand_matmul})).key == workload.key
    with pytest.raises(WorkloadShapeError, match="only to catalog workloads"):
        resolve_workload(hand_matmul, shape=(1, 2))
    with pytest.raises(TypeError, match="catalog name, a Workload"):
        resolve_workload(42)  # type: ignore[arg-type]


# ------------------------------------------------------------------ user modules


def test_from_prim_func_detects_inputs_and_metadata() -> None:
    workload = Workload.from_module(hand_matmul)
    assert workload.name == "hand_matmul"
    assert workload.shape is None and workload.reference is None
    assert workload.num_inputs == 2
    assert workload.dtype == "float32"
    assert workload.param_specs() == [
        ((24, 40), "float32"),
        ((40, 16), "float32"),
        ((24, 16), "float32"),
    ]
    assert workload.flops == 2 * 24 * 16 * 40
    assert re.fullmatch(r"hand_matmul:[0-9a-f]{16}", workload.key)
    assert 0 <= workload.structural_hash < 2**64
    assert workload.prim_func.attrs["global_symbol"] == "main"


def test_from_ir_module_renames_and_keeps_the_key_stable() -> None:
    module = tvm.IRModule({"mm": hand_matmul.with_attr("global_symbol", "mm")})
    first = Workload.from_module(module, name="mine")
    second = Workload.from_module(module, name="mine")
    assert first.num_inputs == 2
    assert first.key.startswith("mine:")
    assert first is not second and first.key == second.key
    assert first.structural_hash == second.structural_hash
    assert next(iter(first.mod.functions)).name_hint == "main"


def test_key_distinguishes_different_programs() -> None:
    def catalog_matmul_as_user_module(shape: tuple[int, int, int]) -> Workload:
        return Workload.from_module(SPECS["matmul"].instantiate(shape, "float32").mod, "mm")

    hand_written = Workload.from_module(hand_matmul, name="mm")
    same_shape = catalog_matmul_as_user_module((24, 16, 40))
    other_shape = catalog_matmul_as_user_module((24, 16, 41))
    # One name, three programs: the te version carries other attributes; K differs.
    assert len({hand_written.key, same_shape.key, other_shape.key}) == 3


def test_reference_outputs_fall_back_to_the_untuned_module() -> None:
    workload = Workload.from_module(hand_matmul)
    a, b = workload.random_inputs(seed=11)
    (result,) = workload.reference_outputs([a, b])
    expected = a.astype(np.float64) @ b.astype(np.float64)
    rtol, atol = workload.tolerance()
    np.testing.assert_allclose(result, expected, rtol=rtol, atol=atol)
    assert not np.allclose(result, expected * 1.001, rtol=rtol, atol=atol)


def test_random_inputs_are_deterministic_per_seed() -> None:
    workload = Workload.from_module(hand_matmul)
    first, again, other = (workload.random_inputs(seed) for seed in (3, 3, 4))
    assert all(np.array_equal(x, y) for x, y in zip(first, again))
    assert not np.array_equal(first[0], other[0])
    assert all(array.dtype == np.float32 for array in first)
    assert all(np.abs(array).max() <= 1.0 for array in first)


def test_in_place_parameter_counts_as_output_and_integers_compare_exactly() -> None:
    workload = Workload.from_module(accumulate_in_place)
    assert workload.num_inputs == 1
    assert workload.tolerance() == (0.0, 0.0)
    (a,) = workload.random_inputs(seed=0)
    assert a.dtype == np.int32 and np.abs(a).max() <= 4
    (result,) = workload.reference_outputs([a])
    np.testing.assert_array_equal(result, a * 3)  # the output starts at zero


def test_reference_outputs_check_their_inputs() -> None:
    workload = Workload.from_module(hand_matmul)
    a, b = workload.random_inputs(seed=0)
    with pytest.raises(WorkloadShapeError, match="takes 2 inputs, got 1"):
        workload.reference_outputs([a])
    with pytest.raises(WorkloadShapeError, match=r"input 1 must be float32\[40, 16\]"):
        workload.reference_outputs([a, b.T])


def test_tolerance_grows_with_the_reduction() -> None:
    short = SPECS["matmul"].instantiate((8, 8, 16), "float32")
    long = SPECS["matmul"].instantiate((8, 8, 4096), "float32")
    unit = [np.ones((8, 8), np.float32)]
    assert long.tolerance(unit)[0] > short.tolerance(unit)[0]
    assert long.tolerance(unit)[1] > short.tolerance(unit)[1]
    hundredfold = [np.full((8, 8), 100.0)]
    assert short.tolerance(hundredfold)[1] == pytest.approx(100 * short.tolerance(unit)[1])


@pytest.mark.parametrize("name", ["matmul", "batch_matmul", "dense_bias_relu", "dense_bias_gelu"])
def test_half_precision_products_are_summed_in_float32_and_checked_at_half_precision(name: str) -> None:
    """A float16 workload accumulates in float32 (as tensor cores do) and rounds once; its check is that tight."""
    workload = SPECS[name].instantiate(SPECS[name].small_shape, "float16")
    reductions = [block for block in workload.mod.script().splitlines() if "= T.float32(0.0)" in block]
    assert reductions, "the reduction starts from a float32 zero"
    inputs = workload.random_inputs(seed=2)
    (untuned,) = workload._run_untuned(inputs)
    (expected,) = workload.reference_outputs(inputs)
    assert untuned.dtype == expected.dtype == np.float16
    rtol, atol = workload.tolerance()
    np.testing.assert_allclose(untuned.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol)
    assert rtol < 0.01, "the growth with the reduction is float32's, not float16's"
    off = expected.astype(np.float64) * 1.02
    assert not np.allclose(untuned.astype(np.float64), off, rtol=rtol, atol=atol)


def test_a_float32_workload_keeps_its_program_when_half_precision_is_added() -> None:
    """The float32 programs (and so their database keys) have no casts and no extra rounding block."""
    script = SPECS["dense_bias_relu"].instantiate((16, 48, 40), "float32").mod.script()
    assert "T.Cast" not in script and "T_rounded" not in script


def test_outputs_must_be_trailing_parameters() -> None:
    with pytest.raises(WorkloadShapeError, match=r"trailing.*\['A', 'B'\].*'C'"):
        Workload.from_module(output_first)


def test_module_without_outputs_is_rejected() -> None:
    with pytest.raises(WorkloadShapeError, match="writes none of its parameters"):
        count_inputs(writes_nothing)


def test_dynamic_shapes_are_rejected() -> None:
    with pytest.raises(WorkloadShapeError, match="static shapes only"):
        Workload.from_module(dynamic_copy)


def test_module_must_hold_one_prim_func() -> None:
    two = tvm.IRModule({"a": hand_matmul, "b": output_first})
    with pytest.raises(WorkloadShapeError, match="exactly one PrimFunc"):
        Workload.from_module(two)
    with pytest.raises(TypeError, match="IRModule or a PrimFunc"):
        Workload.from_module("matmul")  # type: ignore[arg-type]


def test_workload_validates_its_fields() -> None:
    valid = Workload.from_module(hand_matmul)
    with pytest.raises(WorkloadShapeError, match="num_inputs=5"):
        Workload(valid.name, None, "float32", valid.mod, 5, None, None)
    with pytest.raises(WorkloadShapeError, match="named 'main'"):
        Workload("x", None, "float32", tvm.IRModule({"f": hand_matmul}), 2, None, None)


def test_integer_inputs_are_valid_indices_so_an_embedding_lookup_is_tuned_correctly(tmp_path) -> None:
    """A model's embedding lookup reads out of bounds at a negative index: integer inputs are drawn from [0, 4]."""
    from tvm import te, topi

    import probtune

    table = te.placeholder((16, 32), "float32", name="table")
    ids = te.placeholder((8,), "int64", name="ids")
    rows = topi.take(table, ids, axis=0, mode="fast")  # what Relax legalizes a Gather to: no bounds check
    work = Workload.from_module(te.create_prim_func([table, ids, rows]), name="take")
    index = work.random_inputs(3)[1]
    assert index.min() >= 0 and index.max() <= 4 and len(set(index.tolist())) > 1
    result = probtune.tune(work, trials=4, database=tmp_path / "t.db", batch_size=4, confirm=0)
    assert result.statuses["ok"] == result.measured > 0


def test_an_integer_input_that_picks_a_slice_is_drawn_below_the_extent_it_indexes() -> None:
    """ONNX Gather's constant index (a vision transformer's q, k or v of three) reaches its task as an input."""
    from tvm import te, topi

    data = te.placeholder((3, 16, 8), "float32", name="data")
    index = te.placeholder((), "int64", name="index")
    picked = topi.take(data, index, axis=0, mode="fast")
    work = Workload.from_module(te.create_prim_func([data, index, picked]), name="take_slice")
    assert work.index_extents == {1: 3}
    drawn = [int(work.random_inputs(seed)[1]) for seed in range(12)]
    assert set(drawn) == {0, 1, 2}  # the draws of [0, 4] folded into [0, 2]
    for seed in range(12):
        inputs, (output,) = work.reference_case(seed)
        np.testing.assert_array_equal(output, inputs[0][int(inputs[1])])


def test_integer_inputs_that_index_nothing_keep_their_draws() -> None:
    from tvm import te

    a = te.placeholder((64,), "int32", name="a")
    doubled = te.compute(a.shape, lambda i: a[i] * 2, name="doubled")
    work = Workload.from_module(te.create_prim_func([a, doubled]), name="double")
    assert work.index_extents == {} and work.random_inputs(0)[0].max() == 4


def _normalize_by_a_given_variance() -> Workload:
    """What a real text recognizer's layer-norm task is: the variance comes in as an input, under a square root."""
    from tvm import te

    x = te.placeholder((4, 64), name="x")
    mean = te.placeholder((4, 1), name="mean")
    var = te.placeholder((4, 1), name="var")
    y = te.compute(x.shape, lambda i, j: (x[i, j] - mean[i, 0]) / te.sqrt(var[i, 0] + 1e-5), name="y")
    return Workload.from_module(te.create_prim_func([x, mean, var, y]), name="normalize")


def test_a_check_draws_inputs_where_the_function_is_defined() -> None:
    work = _normalize_by_a_given_variance()
    assert np.isnan(work.reference_outputs(work.random_inputs(0))[0]).any()  # U(-1, 1): negative variances
    inputs, outputs = work.reference_case(0)
    assert inputs[2].min() >= 0 and np.isfinite(outputs[0]).all()
    np.testing.assert_allclose(inputs[0], (work.random_inputs(0)[0] + 1) / 2, rtol=1e-6)  # the same draws, moved


def test_a_function_defined_nowhere_on_the_ranges_keeps_the_draw_with_fewest_nans() -> None:
    from tvm import te

    x = te.placeholder((64,), name="x")
    y = te.compute(x.shape, lambda i: te.sqrt(x[i] - 1.5), name="y")  # NaN below 1.5: half of U(1, 2) still
    work = Workload.from_module(te.create_prim_func([x, y]), name="sqrt_shifted")
    inputs, outputs = work.reference_case(0)
    assert inputs[0].min() >= 1.0 and 0 < np.isnan(outputs[0]).sum() < 64


def test_the_tolerance_admits_reordered_sums_through_an_epilogue_but_not_a_missing_term() -> None:
    """A convolution with a hard-swish-like epilogue that zeroes most outputs (their RMS is small, but not the
    error the epilogue carries where it is steep); a program summing in another order must pass, one that drops
    a sliver of its sums must not."""
    from tvm import te, topi

    x = te.placeholder((1, 8, 8, 256), name="x")
    w = te.placeholder((3, 3, 256, 16), name="w")
    conv = topi.nn.conv2d_nhwc(x, w, 1, 1, 1)
    out = te.compute(conv.shape, lambda *i: conv(*i) * te.min(te.max(conv(*i) - 20.0, 0.0), 6.0) / 6.0, name="hs")
    work = Workload.from_module(te.create_prim_func([x, w, out]), name="conv_gated")
    inputs, (want,) = work.reference_case(0)
    rtol, atol = work.tolerance([want], work.rounding_change(inputs, [want]))
    padded = np.pad(inputs[0], ((0, 0), (1, 1), (1, 1), (0, 0)))

    def program(blocks: range) -> np.ndarray:  # float32 sums over 16-channel blocks, in the order given
        summed = np.zeros(want.shape, np.float32)
        for c in blocks:
            for i in range(3):
                for j in range(3):
                    summed += np.einsum("nhwc,ck->nhwk", padded[:, i:i + 8, j:j + 8, c:c + 16], inputs[1][i, j, c:c + 16])
        return summed * np.clip(summed - np.float32(20.0), 0, 6) / np.float32(6.0)

    def admitted(got: np.ndarray) -> bool:
        return bool(np.all(np.abs(got - want) <= atol + rtol * np.abs(want)))

    assert admitted(program(range(240, -1, -16)))
    assert not admitted(program(range(0, 240, 16)))  # the last 16 of 2304 terms missing


def test_a_task_that_takes_a_variance_is_tuned_not_refused(tmp_path) -> None:
    import probtune

    result = probtune.tune(_normalize_by_a_given_variance(), trials=4, database=tmp_path / "t.db", batch_size=4,
                           confirm=0)
    assert result.statuses["ok"] == result.measured > 0


def test_an_output_rounded_to_bfloat16_is_compared_within_its_rounding() -> None:
    """A bf16 model's layer hands on its output in bfloat16: summed in another order, an element may round to the
    neighbouring bfloat16 value (2**-8 relative apart), which a tuned program's check must allow."""
    from tvm import te

    a = te.placeholder((16, 512), "bfloat16", name="a")
    b = te.placeholder((512, 16), "bfloat16", name="b")
    r = te.reduce_axis((0, 512), "r")
    c = te.compute((16, 16), lambda i, j: te.sum(a[i, r].astype("float32") * b[r, j].astype("float32"), axis=r))
    d = te.compute((16, 16), lambda i, j: c[i, j].astype("bfloat16"), name="d")
    rtol, atol = Workload.from_module(te.create_prim_func([a, b, d]), name="rounded").tolerance()
    assert 2**-8 < rtol < 0.1 and atol > 0
