"""A part of a stacked tensor that only products read is taken inside each product's function."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, te

from conftest import called_primfuncs, fused_ops
from probtune.model.part_reads import is_part, read_parts_in_products

pytestmark = pytest.mark.filterwarnings("ignore")


def _part(stacked: te.Tensor, index: int) -> te.Tensor:
    return te.compute(stacked.shape[1:], lambda *i: stacked(index, *i), name="part")


def _stacked_reads(relu_reads_keys: bool) -> tvm.IRModule:
    """Queries and keys stacked in ``x`` (2, 4, 8); their product, and (when ``relu_reads_keys``) a ReLU of the keys."""
    x = relax.Var("x", relax.TensorType((2, 4, 8), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            queries = builder.emit_te(_part, x, 0, primfunc_name_hint="part")
            keys = builder.emit_te(_part, x, 1, primfunc_name_hint="part")
            scores = builder.emit(relax.op.matmul(queries, relax.op.permute_dims(keys)))
            out = relax.Tuple([scores, builder.emit(relax.op.nn.relu(keys))]) if relu_reads_keys else scores
            result = builder.emit_output(out)
        builder.emit_func_output(result)
    return builder.get()


def test_a_copy_of_one_leading_index_is_a_part_and_a_transpose_is_not():
    x = te.placeholder((2, 4, 8), "float32", name="x")
    assert is_part(te.create_prim_func([x, _part(x, 1)]))
    moved = te.compute((2, 8, 4), lambda a, b, c: x[a, c, b], name="moved")
    assert not is_part(te.create_prim_func([x, moved]))
    every = te.compute((4, 8), lambda b, c: x[b % 2, b, c], name="every")
    assert not is_part(te.create_prim_func([x, every]))


@pytest.mark.parametrize("relu_reads_keys", [False, True])
def test_parts_that_only_a_product_reads_are_taken_in_its_function(relu_reads_keys):
    """Read only by the product, both parts are copied inside its PrimFunc; keys that a ReLU reads too stay a call
    of their own (taking them in both would copy them twice), the queries move."""
    grouped = fused_ops(_stacked_reads(relu_reads_keys))
    rewritten, count = read_parts_in_products(grouped)
    assert count == 1
    fused = relax.transform.FuseTIR()(rewritten)
    assert [name for name in called_primfuncs(fused) if name.startswith("part")] == (["part1"] if relu_reads_keys else [])
    x = np.random.default_rng(0).standard_normal((2, 4, 8)).astype("float32")
    vm = relax.VirtualMachine(tvm.compile(fused, target="llvm"), tvm.cpu())
    result = vm["main"](tvm.runtime.tensor(x))
    scores = (result[0] if relu_reads_keys else result).numpy()
    np.testing.assert_allclose(scores, x[0] @ x[1].T, rtol=1e-5, atol=1e-5)


def test_a_module_without_parts_is_returned_as_it_is():
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            result = builder.emit_output(relax.op.matmul(x, relax.op.permute_dims(x)))
        builder.emit_func_output(result)
    grouped = fused_ops(builder.get())
    rewritten, count = read_parts_in_products(grouped)
    assert count == 0 and rewritten.same_as(grouped)
