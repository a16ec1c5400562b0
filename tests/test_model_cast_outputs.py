"""A narrowing cast of a tensor that other tasks also read is written by the tensor's producer as a second output."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from tvm import relax

import probtune.model.tasks as tasks
from conftest import untuned_runner
from probtune.model import load_model
from probtune.model.cast_outputs import CAST_OUTPUTS, join_cast_outputs
from probtune.model.check import check_outputs
from probtune.model.precision import convert_precision
from probtune.model.rewrites import rewrite_counts
from probtune.targets import resolve_target

pytestmark = pytest.mark.filterwarnings("ignore")


def _annotated(mod: tvm.IRModule) -> tvm.IRModule:
    steps = [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern()]
    return tvm.transform.Sequential(steps)(mod)


def _residual(producer: str, residual: bool = True) -> tvm.IRModule:
    """``y = producer(x)`` read by a float16 product and, when ``residual``, added to its result in float32."""
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    rng = np.random.default_rng(0)
    gamma, beta = (relax.const(rng.standard_normal(16).astype("float32")) for _ in range(2))
    weight = relax.const(rng.standard_normal((16, 16)).astype("float16"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            made = relax.op.nn.layer_norm(x, gamma, beta, [1]) if producer == "layer_norm" else relax.op.add(x, gamma)
            y = builder.emit(made)
            product = builder.emit(relax.op.matmul(builder.emit(relax.op.astype(y, "float16")), weight, "float32"))
            out = builder.emit_output(relax.op.add(product, y) if residual else product)
        builder.emit_func_output(out)
    return builder.get()


def _joined_functions(mod: tvm.IRModule) -> list[relax.Function]:
    return [f for _, f in mod.functions_items() if isinstance(f, relax.Function) and f.attrs and f.attrs.get("Primitive")]


def test_a_layer_norms_cast_for_a_product_joins_it_as_a_second_output():
    joined, count = join_cast_outputs(_annotated(_residual("layer_norm")))
    assert count == 1
    (function,) = _joined_functions(joined)
    assert [str(t.dtype) for t in function.ret_ty.fields] == ["float32", "float16"]
    fused = relax.transform.FuseTIR()(relax.transform.FuseOps()(joined))
    (primfunc,) = [f for gv, f in fused.functions_items() if gv.name_hint.startswith("fused_layer_norm")]
    assert [str(p.dtype) for p in primfunc.params[-2:]] == ["float32", "float16"]


@pytest.mark.parametrize(("producer", "residual"), [("add", True), ("layer_norm", False)])
def test_an_elementwise_producer_or_a_cast_alone_is_left_to_fusion(producer, residual):
    """An add fuses into the product before it in a model (a residual add, MobileBERT's NoNorm); a tensor that only the
    cast reads is fused with it, or stored narrow by the precision pass."""
    joined, count = join_cast_outputs(_annotated(_residual(producer, residual)))
    assert count == 0 and not _joined_functions(joined)


def test_a_joined_model_computes_what_the_unjoined_one_does(encoder_onnx, monkeypatch):
    """The encoder layer's layer norm feeds the feed-forward product and its residual: joined with its cast, the
    untuned build returns the same bits as with a cast task, and matches onnxruntime within fp16's tolerance."""
    model = load_model(encoder_onnx)
    converted = dataclasses.replace(model, mod=convert_precision(model.mod, "fp16"))
    cuda, host = resolve_target("cuda-sm90"), resolve_target("host")
    fused = tasks.fuse(converted, cuda)
    assert rewrite_counts(fused)[CAST_OUTPUTS] == 1
    assert "fused_layer_norm_cast" in [task.name for task in tasks.extract_tasks(fused)]
    monkeypatch.setattr(tasks, "join_cast_outputs", lambda mod: (mod, 0))
    apart = tasks.fuse(converted, cuda)
    assert CAST_OUTPUTS not in rewrite_counts(apart)
    inputs = model.random_inputs(0)
    joined_run, apart_run = untuned_runner(fused, host), untuned_runner(apart, host)
    for a, b in zip(joined_run(*inputs), apart_run(*inputs)):
        np.testing.assert_array_equal(a, b)
    check_outputs(model, joined_run, precision="fp16")


def test_a_join_that_fails_is_named_and_the_model_fuses_without_it(encoder_onnx, monkeypatch):
    """The join only saves a task: where it raises, fusion warns with its name and goes on with the casts as calls."""
    model = load_model(encoder_onnx)
    converted = dataclasses.replace(model, mod=convert_precision(model.mod, "fp16"))

    def broken(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
        raise tvm.error.InternalError("a broken join")

    monkeypatch.setattr(tasks, "join_cast_outputs", broken)
    with pytest.warns(UserWarning, match="'cast-outputs' failed and was left out.*a broken join"):
        fused = tasks.fuse(converted, resolve_target("cuda-sm90"))
    assert CAST_OUTPUTS not in rewrite_counts(fused)
    assert "fused_layer_norm_cast" not in [task.name for task in tasks.extract_tasks(fused)]
