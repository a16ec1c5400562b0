"""Graph rewrite packed-projections: per-head products of the same tokens stacked into one product."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from tvm import relax

from conftest import untuned_runner
from probtune.model import extract_tasks, fuse, load_model
from probtune.model.check import check_outputs
from probtune.model.precision import convert_precision
from probtune.model.rewrites import rewrite_counts
from probtune.targets import resolve_target
from probtune_cuda.packed_projections import PackedProjections, packed_groups
from probtune_cuda.targets import DEFAULT_GRAPH_REWRITES

pytestmark = pytest.mark.filterwarnings("ignore")

SM90 = resolve_target("cuda-sm90")


def _fp16(model):
    return dataclasses.replace(model, mod=convert_precision(model.mod, "fp16"))


def test_an_encoders_queries_keys_and_values_are_one_product_whose_parts_attention_reads(encoder_onnx):
    """Three projections become one product of a (3, 1, heads, features, width) weight; attention's two products take
    their parts themselves, so no task copies one, and the untuned build computes what the unstacked one does."""
    model = _fp16(load_model(encoder_onnx))
    fused = fuse(model, SM90)
    counts = rewrite_counts(fused)
    assert counts["packed-projections"] == 3 and counts["part-reads"] == 2
    names = [task.name for task in extract_tasks(fused)]
    assert not [name for name in names if name.startswith("part")]
    stacked = [gv for gv, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)
               and any(len(p.shape) == 5 and int(p.shape[0]) == 3 for p in f.params)]
    assert len(stacked) == 3  # the product writes the stacked parts, and the two products that read them
    apart = fuse(model, SM90, [name for name in DEFAULT_GRAPH_REWRITES if name != "packed-projections"])
    assert "packed-projections" not in rewrite_counts(apart)
    host = resolve_target("host")
    inputs = load_model(encoder_onnx).random_inputs(0)
    joined_run = untuned_runner(fused, host)
    for a, b in zip(joined_run(*inputs), untuned_runner(apart, host)(*inputs)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    check_outputs(load_model(encoder_onnx), joined_run, precision="fp16")


def _projections(scaled: bool) -> relax.Function:
    """Three per-head products of the same tokens with a bias each; the first also scaled when ``scaled``."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 1, 8, 16), "float16"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            outs = []
            for index in range(3):
                weight = relax.const(rng.standard_normal((2, 16, 4)).astype("float16"))
                value = builder.emit(relax.op.matmul(x, weight, out_dtype="float32"))
                value = builder.emit(relax.op.add(value, relax.const(rng.standard_normal((2, 1, 4)).astype("float32"))))
                if scaled and index == 0:
                    value = builder.emit(relax.op.multiply(value, relax.const(0.5, "float32")))
                outs.append(value)
            result = builder.emit_output(relax.Tuple(outs))
        builder.emit_func_output(result)
    return builder.get()


@pytest.mark.parametrize(("scaled", "stacked"), [(False, 3), (True, 2)])
def test_only_products_with_the_same_steps_after_them_are_stacked(scaled, stacked):
    """A projection scaled after its bias (ViT's queries) has a step the others lack: it stays a product of its own,
    and the other two are stacked."""
    mod = _projections(scaled)
    assert [len(group) for group in packed_groups(mod["main"])] == [stacked]
    rewritten, count = PackedProjections().rewrite(mod, SM90)
    assert count == stacked
    x = np.random.default_rng(1).standard_normal((1, 1, 8, 16)).astype("float16")

    def run(module):
        vm = relax.VirtualMachine(tvm.compile(module, target="llvm"), tvm.cpu())
        return [r.numpy() for r in vm["main"](tvm.runtime.tensor(x))]

    for a, b in zip(run(rewritten), run(mod)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
