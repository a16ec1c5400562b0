"""Precisions: fp16's and bf16's conversion of a float32 model, bf16's refusal where a target does not offer it, and
converted models checked against onnxruntime's float32 with their precision's tolerance."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.ir.expr import Constant

from conftest import untuned_runner
from probtune.errors import TuningConfigError
from probtune.model import load_model, tune_model
from probtune.model.check import check_outputs
from probtune.model.examples import make_model
from probtune.model.precision import TOLERANCES, check_precision, convert_precision
from probtune.model.tasks import extract_tasks, fuse
from probtune.targets import resolve_target

SHAPES = {"x": (1, 3, 16, 16)}
FAST = dict(batch_size=4, confirm=0)
HOST_BF16 = "bf16" in resolve_target("host").precisions


def _calls(mod) -> list[relax.Call]:
    calls: list[relax.Call] = []
    relax.analysis.post_order_visit(
        mod["main"].body, lambda e: calls.append(e) if isinstance(e, relax.Call) and hasattr(e.op, "name") else None
    )
    return calls


def _dtype(expr) -> str:
    return str(expr.ty.dtype)


NARROW = pytest.mark.parametrize("precision, narrow", [("bf16", "bfloat16"), ("fp16", "float16")])


@NARROW
@pytest.mark.parametrize("fixture, products", [("small_cnn_onnx", 4), ("encoder_onnx", 8)])
def test_narrow_precisions_multiply_narrow_operands_into_float32_sums(fixture, products, precision, narrow, request):
    model = load_model(request.getfixturevalue(fixture), SHAPES if fixture == "small_cnn_onnx" else None)
    calls = _calls(convert_precision(model.mod, precision))
    converted = [c for c in calls if str(c.op.name) in ("relax.nn.conv2d", "relax.matmul")]
    assert len(converted) >= products
    for call in converted:
        assert [_dtype(arg) for arg in call.args] == [narrow, narrow] and _dtype(call) == "float32"
    weights = [c.args[1] for c in converted if isinstance(c.args[1], Constant)]
    assert weights and all(_dtype(w) == narrow for w in weights)  # cast once, at compile time
    layouts = ("relax.astype", "relax.reshape", "relax.permute_dims", "relax.nn.max_pool2d")  # casts, moves
    others = [c for c in calls if c not in converted and str(c.op.name) not in layouts]
    assert all(_dtype(c) == "float32" for c in others if isinstance(c.ty, relax.TensorType))


@NARROW
@pytest.mark.parametrize("fixture", ["small_cnn_onnx", "encoder_onnx"])
def test_a_products_operand_is_stored_once_and_cast_in_its_producers_task(fixture, precision, narrow, request):
    """A tensor read by a product and by another operator (the residual connection) is cast once, in the narrow
    type, and the other reader widens that copy: no task casts alone, and no producer writes the tensor twice."""
    model = load_model(request.getfixturevalue(fixture), SHAPES if fixture == "small_cnn_onnx" else None)
    mod = convert_precision(model.mod, precision)
    casts = [c for c in _calls(mod) if str(c.op.name) == "relax.astype" and str(c.attrs.dtype) == narrow]
    assert len({c.args[0] for c in casts}) == len(casts)  # one copy of each
    widened = [c for c in _calls(mod) if str(c.op.name) == "relax.astype" and _dtype(c.args[0]) == narrow]
    assert widened or fixture == "encoder_onnx"  # small_cnn's residual add reads its operand's copy
    names = [task.name for task in extract_tasks(fuse(dataclasses.replace(model, mod=mod), resolve_target("host")))]
    assert not [name for name in names if re.fullmatch(r"(fused_)?cast\d*", name)]


@NARROW
def test_attentions_transposes_move_narrow_values(encoder_onnx, precision, narrow):
    """Queries, keys, values and the heads' outputs are reshaped and transposed from tensors nothing else reads:
    their producers store them narrow, and the transposes move narrow values."""
    calls = _calls(convert_precision(load_model(encoder_onnx).mod, precision))
    transposes = [c for c in calls if str(c.op.name) == "relax.permute_dims" and not isinstance(c.args[0], Constant)]
    assert len(transposes) == 4 and all(_dtype(c) == narrow for c in transposes)


@NARROW
def test_a_max_pooling_between_products_picks_narrow_values(small_cnn_onnx, precision, narrow):
    """Rounding keeps order, so pooling rounded values gives the rounded maxima: the ReLU before small_cnn's max pool
    is stored narrow by its task, and the pool moves narrow values to the next convolution, with no cast between."""
    calls = _calls(convert_precision(load_model(small_cnn_onnx, SHAPES).mod, precision))
    pools = [c for c in calls if str(c.op.name) == "relax.nn.max_pool2d"]
    assert len(pools) == 1 and _dtype(pools[0]) == narrow and _dtype(pools[0].args[0]) == narrow


def test_a_tensor_a_product_reads_directly_and_through_a_max_pool_is_pooled_narrow():
    """GoogLeNet's inception input: read by 1x1 convolutions and, through a 3x3 max pool, by another. It is cast once;
    the pool picks from that copy (no widening, no second cast), and the outputs match float32's within float16's."""
    x = relax.Var("x", relax.TensorType((1, 4, 6, 6), "float32"))
    rng = np.random.default_rng(0)
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.relu(x))
            weights = [relax.const(rng.standard_normal((4, 4, 1, 1)).astype("float32")) for _ in range(2)]
            pooled = builder.emit(relax.op.nn.max_pool2d(y, (3, 3), padding=(1, 1, 1, 1)))
            out = builder.emit_output(relax.op.add(builder.emit(relax.op.nn.conv2d(y, weights[0])),
                                                   builder.emit(relax.op.nn.conv2d(pooled, weights[1]))))
        builder.emit_func_output(out)
    mod = builder.get()
    calls = _calls(convert_precision(mod, "fp16"))
    casts = [c for c in calls if str(c.op.name) == "relax.astype"]
    pool = next(c for c in calls if str(c.op.name) == "relax.nn.max_pool2d")
    assert len(casts) == 1 and str(casts[0].attrs.dtype) == "float16" and _dtype(pool) == "float16"
    data = np.random.default_rng(1).standard_normal((1, 4, 6, 6)).astype("float32")
    host = resolve_target("host")
    expected = untuned_runner(mod, host)(data)[0]
    got = untuned_runner(relax.transform.LegalizeOps()(convert_precision(mod, "fp16")), host)(data)[0]
    np.testing.assert_allclose(got, expected, rtol=2e-2, atol=2e-2 * np.abs(expected).max())


def _two_views(returned: bool):
    """``relu(x)`` read by two products, one through a reshape and one through a transpose (and returned as well
    when ``returned``)."""
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    rng = np.random.default_rng(0)
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.relu(x))
            weight = relax.const(rng.standard_normal((4, 3)).astype("float32"))
            a = builder.emit(relax.op.matmul(builder.emit(relax.op.reshape(y, (8, 4))), weight))
            b = builder.emit(relax.op.matmul(builder.emit(relax.op.permute_dims(y)), relax.const(rng.standard_normal(
                (4, 3)).astype("float32"))))
            out = builder.emit_output(relax.Tuple([a, b, y]) if returned else relax.op.add(a, b))
        builder.emit_func_output(out)
    return builder.get()


@pytest.mark.parametrize("returned", [False, True])
def test_a_tensor_only_views_into_products_read_is_stored_narrow_once(returned):
    """Read through a reshape and a transpose by two products, ``relu(x)`` is cast once where it is made; returned as
    well, it stays float32 for that reader (a residual stream is not rounded), and each view is cast."""
    calls = _calls(convert_precision(_two_views(returned), "fp16"))
    casts = [c for c in calls if str(c.op.name) == "relax.astype" and str(c.attrs.dtype) == "float16"]
    if returned:
        assert len(casts) == 2 and all(str(c.args[0].ty.dtype) == "float32" for c in casts)
        assert not [c for c in calls if str(c.op.name) == "relax.astype" and str(c.attrs.dtype) == "float32"]
    else:
        assert len(casts) == 1
        views = [c for c in calls if str(c.op.name) in ("relax.reshape", "relax.permute_dims")]
        assert len(views) == 2 and all(_dtype(v) == "float16" for v in views)


def test_a_depthwise_convolution_reads_bfloat16_and_keeps_its_float32_weight():
    """It sums no channels: its input is the bf16 copy its producer stores, its weight stays float32."""
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "float32"))
    rng = np.random.default_rng(0)
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            pointwise = builder.emit(relax.op.nn.conv2d(x, relax.const(rng.standard_normal((16, 16, 1, 1), "float32"))))
            depthwise = relax.const(rng.standard_normal((16, 1, 3, 3), "float32"))
            out = builder.emit_output(relax.op.nn.conv2d(pointwise, depthwise, padding=1, groups=16))
        builder.emit_func_output(out)
    calls = {str(c.op.name) + str(int(c.attrs.groups)): c for c in _calls(convert_precision(builder.get(), "bf16"))
             if str(c.op.name) == "relax.nn.conv2d"}
    assert [_dtype(a) for a in calls["relax.nn.conv2d1"].args] == ["bfloat16", "bfloat16"]
    assert [_dtype(a) for a in calls["relax.nn.conv2d16"].args] == ["bfloat16", "float32"]
    assert _dtype(calls["relax.nn.conv2d16"]) == "float32"


def test_an_unknown_or_unoffered_precision_is_refused_by_name():
    with pytest.raises(TuningConfigError, match="unknown precision 'int4': choose one of fp32, fp16, bf16"):
        check_precision("int4", resolve_target("host"))
    with pytest.raises(TuningConfigError, match="target 'x86-avx2' does not offer precision bf16"):
        check_precision("bf16", resolve_target("x86-avx2"))


def test_bf16_on_a_target_without_it_is_refused_before_the_first_trial(small_cnn_onnx, tmp_path):
    database = tmp_path / "t.db"
    with pytest.raises(TuningConfigError, match="choose one of fp32, fp16"):
        tune_model(load_model(small_cnn_onnx, SHAPES), "x86-avx2", trials=4, database=database, precision="bf16")
    assert not database.exists()


@pytest.mark.skipif(not HOST_BF16, reason="this machine's target offers no bf16")
@pytest.mark.parametrize("fixture", ["small_cnn_onnx", "encoder_onnx"])
def test_a_bf16_model_matches_onnxruntime_within_bf16s_tolerance(fixture, request, tmp_path):
    model = load_model(request.getfixturevalue(fixture), SHAPES if fixture == "small_cnn_onnx" else None)
    compiled = tune_model(model, "host", trials=2, database=tmp_path / "t.db", precision="bf16", **FAST).compile()
    check = compiled.check
    assert check.precision == "bf16" and (check.rtol, check.atol_scale) == TOLERANCES["bf16"]
    assert "for bf16" in str(check)
    assert check.max_rel_error > 1e-4  # bf16's rounding shows: the products did not run in float32
    fp32 = tune_model(model, "host", trials=0, database=tmp_path / "f.db", **FAST).compile()
    assert fp32.check.max_rel_error < check.max_rel_error and "for " not in str(fp32.check)
    inputs = model.random_inputs(1)
    assert np.allclose(compiled(*inputs)[0], fp32(*inputs)[0], rtol=0.05, atol=0.5 * np.std(fp32(*inputs)[0]))


def _mobilenet_block(path):
    """A MobileNetV3 block as torchvision exports it: a pointwise convolution, ReLU6 (Clip 0..6), a depthwise one
    and HardSwish. TVM's ToMixedPrecision refused such models (a clip's bounds are not tensors)."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) / 4, name)
               for name, shape in (("w1", (16, 3, 1, 1)), ("w2", (16, 1, 3, 3)), ("b2", (16,)))]
    weights += [numpy_helper.from_array(np.float32(v), n) for n, v in (("low", 0.0), ("high", 6.0))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"]),
             helper.make_node("Clip", ["c1", "low", "high"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b2"], ["c2"], group=16, pads=[1] * 4),
             helper.make_node("HardSwish", ["c2"], ["y"])]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 16])], weights)
    onnx.save(make_model(graph), path)
    return load_model(path)


@pytest.mark.parametrize("fixture", ["mobilenet_block", "encoder_onnx"])
def test_an_fp16_model_matches_onnxruntime_within_fp16s_tolerance(fixture, request, tmp_path):
    """Converted to fp16 and built by TVM for this CPU as it is (the conversion is the same for every target)."""
    if fixture == "mobilenet_block":
        model = _mobilenet_block(tmp_path / "block.onnx")
    else:
        model = load_model(request.getfixturevalue(fixture))
    host = resolve_target("host")
    converted = dataclasses.replace(model, mod=convert_precision(model.mod, "fp16"))
    assert any(_dtype(c) == "float16" for c in _calls(converted.mod) if isinstance(c.ty, relax.TensorType))
    report = check_outputs(model, untuned_runner(fuse(converted, host), host), precision="fp16")
    assert report.max_rel_error > 1e-5  # float16's rounding shows: the products did not run in float32


def _split_products(other_reader: bool):
    """``relu(x)`` split in two halves along its columns, each multiplied by a weight (and the second half also
    returned when ``other_reader``): MixNet's mixed convolutions split their input this way."""
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    rng = np.random.default_rng(0)
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            halves = builder.emit(relax.op.split(builder.emit(relax.op.nn.relu(x)), 2, axis=1))
            first, second = (builder.emit(relax.TupleGetItem(halves, i)) for i in range(2))
            products = [builder.emit(relax.op.matmul(half, relax.const(rng.standard_normal((4, 3)).astype("float32"))))
                        for half in (first, second)]
            summed = relax.op.add(*products)
            out = builder.emit_output(relax.Tuple([summed, second]) if other_reader else summed)
        builder.emit_func_output(out)
    return builder.get()


@pytest.mark.parametrize("other_reader", [False, True])
def test_a_tensor_split_into_products_operands_is_cast_once_before_the_split(other_reader):
    """``relu(x)`` is cast once and split in float16 (a cast per part before, a task each). A part that something else
    reads as well is, as any product's operand, read from that copy widened."""
    mod = _split_products(other_reader)
    calls = _calls(convert_precision(mod, "fp16"))
    casts = [c for c in calls if str(c.op.name) == "relax.astype" and str(c.attrs.dtype) == "float16"]
    splits = [c for c in calls if str(c.op.name) == "relax.split"]
    assert len(casts) == 1 and "float16" in [_dtype(c.args[0]) for c in splits]
    x = np.random.default_rng(1).standard_normal((4, 8)).astype("float32")
    host = resolve_target("host")
    expected = untuned_runner(mod, host)(x)[0]
    got = untuned_runner(relax.transform.LegalizeOps()(convert_precision(mod, "fp16")), host)(x)[0]
    np.testing.assert_allclose(got, expected, rtol=2e-2, atol=2e-2 * np.abs(expected).max())


def _concatenated_products(other_reader: bool):
    """Two products' ReLUs concatenated along their columns and multiplied by a weight (Inception's branches); with
    ``other_reader``, the first ReLU is also returned."""
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    rng = np.random.default_rng(0)
    builder = relax.BlockBuilder()

    def weight(*shape: int) -> relax.Constant:
        return relax.const(rng.standard_normal(shape).astype("float32"))

    with builder.function("main", [x]):
        with builder.dataflow():
            first, second = (builder.emit(relax.op.nn.relu(builder.emit(relax.op.matmul(x, weight(8, n)))))
                             for n in (3, 5))
            joined = builder.emit(relax.op.concat([first, second], axis=1))
            product = builder.emit(relax.op.matmul(joined, weight(8, 2)))
            out = builder.emit_output(relax.Tuple([product, first]) if other_reader else product)
        builder.emit_func_output(out)
    return builder.get()


@pytest.mark.parametrize("other_reader", [False, True])
def test_branches_concatenated_into_a_product_are_stored_narrow_by_their_producers(other_reader):
    """The concatenation moves float16 values: each branch is cast where it is made (in its producer's task), not the
    concatenation after it. A branch that something else reads as well stays float32 and is cast alone."""
    mod = _concatenated_products(other_reader)
    calls = _calls(convert_precision(mod, "fp16"))
    concat = next(c for c in calls if str(c.op.name) == "relax.concat")
    assert _dtype(concat) == "float16"
    casts = [c for c in calls if str(c.op.name) == "relax.astype" and str(c.attrs.dtype) == "float16"]
    assert sorted(_dtype(c.args[0]) for c in casts) == ["float32"] * 3  # the input, and each branch once
    x = np.random.default_rng(1).standard_normal((4, 8)).astype("float32")
    host = resolve_target("host")
    expected = untuned_runner(mod, host)(x)
    got = untuned_runner(relax.transform.LegalizeOps()(convert_precision(mod, "fp16")), host)(x)
    for want, have in zip(expected, got):
        np.testing.assert_allclose(have, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())
    if other_reader:
        assert (got[1] != got[1].astype(np.float16)).any()  # the returned branch is not rounded to float16
