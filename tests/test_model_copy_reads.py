"""A copy that only products read (a float16 cast, a transpose) is computed in the products' reads of its source."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from tvm import relax

import probtune.model.tasks as tasks
from conftest import called_primfuncs, fused_ops, untuned_runner
from probtune.model import load_model
from probtune.model.check import check_outputs
from probtune.model.copy_reads import COPY_READS, copies, read_copies_in_products
from probtune.model.precision import convert_precision
from probtune.model.prologues import callee, plain_bindings
from probtune.model.rewrites import rewrite_counts
from probtune.targets import resolve_target

pytestmark = pytest.mark.filterwarnings("ignore")

_RNG = np.random.default_rng(0)
_W0, _W1 = (_RNG.standard_normal((16, 16)).astype("float16") for _ in range(2))
_SCALE, _SHIFT = (_RNG.standard_normal(16).astype("float32") for _ in range(2))


def _no_norm(relu_reads_cast: bool) -> tvm.IRModule:
    """A product, then MobileBERT's NoNorm (a multiply and an add, fused into the product) whose float32 result ``y``
    a float16 product reads through a cast and a residual add reads as it is; with ``relu_reads_cast``, a ReLU reads
    the cast too."""
    x = relax.Var("x", relax.TensorType((8, 16), "float16"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            product = builder.emit(relax.op.matmul(x, relax.const(_W0), "float32"))
            y = builder.emit(relax.op.add(relax.op.multiply(product, relax.const(_SCALE)), relax.const(_SHIFT)))
            narrow = builder.emit(relax.op.astype(y, "float16"))
            residual = builder.emit(relax.op.add(relax.op.matmul(narrow, relax.const(_W1), "float32"), y))
            out = relax.Tuple([residual, builder.emit(relax.op.nn.relu(narrow))]) if relu_reads_cast else residual
            result = builder.emit_output(out)
        builder.emit_func_output(result)
    return builder.get()


def test_a_cast_that_only_a_product_reads_is_computed_in_the_products_function():
    grouped = fused_ops(_no_norm(relu_reads_cast=False))
    assert "cast" in called_primfuncs(relax.transform.FuseTIR()(grouped))
    joined, count = read_copies_in_products(grouped)
    assert count == 1
    fused = relax.transform.FuseTIR()(joined)
    assert not [name for name in called_primfuncs(fused) if name.startswith("cast")]
    (reader,) = [f for gv, f in fused.functions_items() if gv.name_hint.startswith("fused_copy_matmul")]
    assert [str(p.dtype) for p in reader.params[:1]] == ["float32"]  # it reads y as the residual does
    x = _RNG.standard_normal((8, 16)).astype("float16")
    vm = relax.VirtualMachine(tvm.compile(fused, target="llvm"), tvm.cpu())
    y = (x.astype("float32") @ _W0.astype("float32")) * _SCALE + _SHIFT
    expected = y.astype("float16").astype("float32") @ _W1.astype("float32") + y
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), expected, rtol=1e-4, atol=1e-3)


def test_a_cast_that_something_besides_products_reads_stays_a_call():
    """Computed in the product and again for the ReLU, the cast would be computed twice; it is left as it is."""
    grouped = fused_ops(_no_norm(relu_reads_cast=True))
    joined, count = read_copies_in_products(grouped)
    assert count == 0 and joined.same_as(grouped)


def test_a_cast_fused_with_a_reshape_is_a_copy_and_a_reshape_alone_is_not():
    x = relax.Var("x", relax.TensorType((1, 8, 16), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            flat = builder.emit(relax.op.reshape(relax.op.astype(x, "float16"), (8, 16)))
            moved = builder.emit(relax.op.reshape(x, (8, 16)))
            product = builder.emit(relax.op.matmul(flat, relax.const(_W1), "float32"))
            result = builder.emit_output(relax.Tuple([product, moved]))
        builder.emit_func_output(result)
    grouped = fused_ops(builder.get())
    calls = [(b.var, found[0]) for b in plain_bindings(grouped["main"]) if (found := callee(grouped, b.value))]
    assert len(calls) == 3  # the cast and reshape fused, the reshape of x, the product
    (narrowing,) = [var for var, gvar in calls if copies(grouped, gvar)]
    assert str(narrowing.ty.dtype) == "float16"
    joined, count = read_copies_in_products(grouped)
    assert count == 1
    x_value = _RNG.standard_normal((1, 8, 16)).astype("float32")
    vm = relax.VirtualMachine(tvm.compile(relax.transform.FuseTIR()(joined), target="llvm"), tvm.cpu())
    expected = x_value[0].astype("float16").astype("float32") @ _W1.astype("float32")
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x_value))[0].numpy(), expected, rtol=1e-4, atol=1e-3)


def test_a_cuda_target_casts_an_encoders_input_in_its_first_product_and_the_bits_are_the_same(encoder_onnx, monkeypatch):
    """The encoder's float32 input is cast and reshaped for its first product alone: on cuda-sm90 the product does
    both (a task fewer), on the host it does not; the untuned CPU builds with and without the join agree exactly and
    match onnxruntime within fp16's tolerance."""
    model = load_model(encoder_onnx)
    converted = dataclasses.replace(model, mod=convert_precision(model.mod, "fp16"))
    cuda, host = resolve_target("cuda-sm90"), resolve_target("host")
    fused = tasks.fuse(converted, cuda)
    assert rewrite_counts(fused)[COPY_READS] == 1
    assert COPY_READS not in rewrite_counts(tasks.fuse(converted, host))
    monkeypatch.setattr(tasks, "read_copies_in_products", lambda mod: (mod, 0))
    apart = tasks.fuse(converted, cuda)
    assert len(tasks.extract_tasks(apart)) == len(tasks.extract_tasks(fused)) + 1
    inputs = model.random_inputs(0)
    joined_run, apart_run = untuned_runner(fused, host), untuned_runner(apart, host)
    for a, b in zip(joined_run(*inputs), apart_run(*inputs)):
        np.testing.assert_array_equal(a, b)
    check_outputs(model, joined_run, precision="fp16")


def test_both_operands_cast_by_the_same_function_are_cast_in_the_product():
    """FuseOps makes one function of a cast and a reshape that both operands go through: the product's function
    computes it twice, each with variables of its own."""
    x, y = (relax.Var(name, relax.TensorType((1, 16, 16), "float32")) for name in "xy")
    builder = relax.BlockBuilder()
    with builder.function("main", [x, y]):
        with builder.dataflow():
            a, b = (builder.emit(relax.op.reshape(relax.op.astype(v, "float16"), (16, 16))) for v in (x, y))
            result = builder.emit_output(relax.op.matmul(a, b, "float32"))
        builder.emit_func_output(result)
    joined, count = read_copies_in_products(fused_ops(builder.get()))
    assert count == 1
    fused = relax.transform.FuseTIR()(joined)
    assert len(called_primfuncs(fused)) == 1
    a_value, b_value = (_RNG.standard_normal((1, 16, 16)).astype("float32") for _ in range(2))
    vm = relax.VirtualMachine(tvm.compile(fused, target="llvm"), tvm.cpu())
    result = vm["main"](tvm.runtime.tensor(a_value), tvm.runtime.tensor(b_value)).numpy()
    expected = a_value[0].astype("float16").astype("float32") @ b_value[0].astype("float16").astype("float32")
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)


def test_a_heads_slice_and_transpose_of_a_stacked_product_is_taken_in_the_products_reading_it():
    """LeViT's attention takes each head's queries and keys out of one stacked product with a strided slice and a
    transpose: read only by the scores' product, both copies are computed in its function."""
    x = relax.Var("x", relax.TensorType((1, 8, 2, 16), "float16"))  # tokens, heads, queries and keys stacked
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            q, k = (builder.emit(relax.op.permute_dims(relax.op.strided_slice(x, [3], [start], [start + 8]), [0, 2, 1, 3]))
                    for start in (0, 8))
            result = builder.emit_output(relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2]), "float32"))
        builder.emit_func_output(result)
    grouped = fused_ops(builder.get())
    assert sum(copies(grouped, found[0]) for b in plain_bindings(grouped["main"]) if (found := callee(grouped, b.value))) == 2
    joined, count = read_copies_in_products(grouped)
    assert count == 1
    fused = relax.transform.FuseTIR()(joined)
    assert len(called_primfuncs(fused)) == 1
    x_value = _RNG.standard_normal((1, 8, 2, 16)).astype("float16")
    vm = relax.VirtualMachine(tvm.compile(fused, target="llvm"), tvm.cpu())
    heads = x_value.astype("float32").transpose(0, 2, 1, 3)
    expected = heads[..., :8] @ heads[..., 8:].transpose(0, 1, 3, 2)
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x_value)).numpy(), expected, rtol=1e-3, atol=1e-3)
