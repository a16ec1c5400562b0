"""A task writes the narrow value it computed; the one task that reads it widens it itself."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from conftest import called_primfuncs, fused_ops, untuned_runner
from probtune.model import load_model
from probtune.model import tasks as model_tasks
from probtune.model.narrow_outputs import NARROW_OUTPUTS, narrow_outputs
from probtune.model.rewrites import REWRITES_ATTR
from probtune.targets import resolve_target

pytestmark = pytest.mark.filterwarnings("ignore")


SHAPES = {"x": (1, 3, 16, 16)}


def _float_writers(fused: tvm.IRModule) -> list[str]:
    """The called PrimFuncs of ``fused`` that write float32 (their last parameter is their output)."""
    return [name for name in called_primfuncs(fused) if str(fused[name].params[-1].dtype) == "float32"]


def test_dequantized_results_are_written_in_8_bits_and_the_outputs_stay_the_same(qdq_cnn, monkeypatch):
    """Without the rewrite, the tasks before the max pool, the mean and a transpose write float32; with it only the
    classifier, whose result is the model's output, does. The outputs are bit for bit those of the unrewritten
    model: the same operators run on the same values, only in the reader's task."""
    model, target = load_model(qdq_cnn, SHAPES), resolve_target("host")
    fused = model_tasks.fuse(model, target)
    assert dict(fused.attrs[REWRITES_ATTR])[NARROW_OUTPUTS] == 3
    assert len(_float_writers(fused)) == 1
    monkeypatch.setattr(model_tasks, "narrow_outputs", lambda mod: (mod, 0))
    unrewritten = model_tasks.fuse(model, target)
    assert len(_float_writers(unrewritten)) == 4
    inputs = model.random_inputs(0)
    got, want = untuned_runner(fused, target)(*inputs), untuned_runner(unrewritten, target)(*inputs)
    np.testing.assert_array_equal(got[0], want[0])


def _quantized_product(reader: str) -> tvm.IRModule:
    """``x @ w`` rounded to 8 bits and widened again, then read by ``reader``: an add of another product made
    before it (as a residual block's end reads a downsampling), a product, or the model's output."""
    x = relax.Var("x", relax.TensorType((8, 8), "float32"))
    w, v = (relax.const(a.astype("float32")) for a in np.random.default_rng(0).standard_normal((2, 8, 8)))
    scale, step = relax.const(np.full((1, 8), 4.0, "float32")), relax.const(np.full((1, 8), 0.25, "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            other = builder.emit(relax.op.matmul(x, v))
            product = builder.emit(relax.op.matmul(x, w))
            rounded = relax.op.round(relax.op.multiply(product, scale))
            narrow = builder.emit(relax.op.astype(relax.op.clip(rounded, 0, 255), "uint8"))
            wide = builder.emit(relax.op.multiply(relax.op.astype(narrow, "float32"), step))
            read = {"add": lambda: relax.op.add(wide, other), "product": lambda: relax.op.matmul(wide, w),
                    "output": lambda: wide}[reader]()
            result = builder.emit_output(read)
        builder.emit_func_output(result)
    return builder.get()


@pytest.mark.parametrize("reader, moved", [("add", 1), ("product", 0), ("output", 0)])
def test_only_a_reader_that_widens_each_element_once_takes_the_widening(reader, moved):
    """FuseOps fuses the widening into the product that rounds; moved to an add, the product writes 8 bits and the
    result is the same bit for bit. A product reading it (each element for 8 outputs) or the model's output keeps
    the widened tensor."""
    grouped = fused_ops(_quantized_product(reader))
    widening = [gv.name_hint for gv in grouped.get_global_vars() if "_cast_cast1_multiply" in gv.name_hint]
    assert widening  # FuseOps left the widening in the rounding product's function
    rewritten, count = narrow_outputs(grouped)
    assert count == moved
    if not moved:
        assert rewritten.same_as(grouped)
        return
    fused, target = relax.transform.FuseTIR()(rewritten), resolve_target("host")
    assert _float_writers(fused) == [name for name in _float_writers(fused) if name.endswith("_add")]
    x = np.random.default_rng(1).standard_normal((8, 8)).astype("float32")
    np.testing.assert_array_equal(untuned_runner(fused, target)(x)[0],
                                  untuned_runner(relax.transform.FuseTIR()(grouped), target)(x)[0])
