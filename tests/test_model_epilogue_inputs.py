"""Epilogue inputs: an elementwise producer that only a product's epilogue reads is computed in the product's task."""

from __future__ import annotations

import numpy as np
from tvm import relax

from conftest import untuned_runner
from probtune.model import load_model
from probtune.model.tasks import extract_tasks, fuse
from probtune.schedule.analysis import block_names
from probtune.targets import resolve_target

RNG = np.random.default_rng(0)
WEIGHT = RNG.standard_normal((16, 8)).astype("float32")


def _model(returned: bool = False, operand: bool = False):
    """``x @ W + widen(y)`` with ``y`` a float16 input widened and reshaped, which TVM's FuseOps leaves a task of its
    own; the widened ``y`` returned as well when ``returned``, and the widened input as the product's operand
    (``widen(y) @ W``) when ``operand``."""
    x = relax.Var("x", relax.TensorType((4, 16), "float32"))
    width = 16 if operand else 8
    y = relax.Var("y", relax.TensorType((1, 4, width), "float16"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x, y]):
        with builder.dataflow():
            wide = builder.emit(relax.op.reshape(relax.op.astype(y, "float32"), (4, width)))
            product = builder.emit(relax.op.matmul(wide if operand else x, relax.const(WEIGHT)))
            out = builder.emit(relax.op.add(product, relax.op.ones((4, 8), "float32") if operand else wide))
            out = builder.emit_output(relax.Tuple([out, wide]) if returned else out)
        builder.emit_func_output(out)
    return load_model(builder.get())


def _names(model) -> list[str]:
    return [task.name for task in extract_tasks(fuse(model, resolve_target("host")))]


def test_a_widened_residual_is_computed_in_the_products_epilogue():
    model, host = _model(), resolve_target("host")
    fused = fuse(model, host)
    (task,) = extract_tasks(fused)
    assert "matmul" in task.name and "cast" in task.name
    blocks = block_names(task.workload.prim_func)  # the widening and the reshape inlined where the add reads them
    assert len(blocks) == 2 and "matmul" in blocks[0]
    x, y = RNG.standard_normal((4, 16)).astype("float32"), RNG.standard_normal((1, 4, 8)).astype("float16")
    (got,) = untuned_runner(fused, host)(x, y)
    np.testing.assert_allclose(got, x @ WEIGHT + y[0].astype("float32"), rtol=1e-5, atol=1e-5)


def test_a_producer_with_another_reader_keeps_its_task():
    assert any("matmul" not in name for name in _names(_model(returned=True)))


def test_a_producer_of_a_products_operand_keeps_its_task():
    """A product reads its operand many times over: the producer's result is stored once rather than recomputed."""
    names = _names(_model(operand=True))
    assert len(names) == 2 and any("matmul" not in name for name in names)
