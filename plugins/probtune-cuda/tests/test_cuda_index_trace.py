"""Index tracing: the element numbers a chain of moves gives agree with what TVM's build of the same chain computes."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from probtune_cuda.index_trace import is_move, moved

CHAINS = {
    "reshape-expand-transpose-squeeze-take": [
        lambda x: relax.op.reshape(x, (6, 1, 3, 4)), lambda x: relax.op.expand_dims(x, [0]),
        lambda x: relax.op.permute_dims(x, [3, 1, 2, 0, 4]), lambda x: relax.op.squeeze(x, [3]),
        lambda x: relax.op.take(x, relax.const(2, "int64"), axis=0)],
    "transpose-reverse-take-vector": [
        lambda x: relax.op.permute_dims(x), lambda x: relax.op.take(x, relax.const(np.array([3, 0, 1]), "int64"), axis=1)],
    "squeeze-all": [lambda x: relax.op.reshape(x, (1, 12, 1, 6)), lambda x: relax.op.squeeze(x)],
}


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_moved_numbers_match_tvms_build_of_the_chain(name):
    x = relax.Var("x", relax.TensorType((6, 12), "int64"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            value, calls = x, []
            for step in CHAINS[name]:
                value = builder.emit(step(value))
                calls.append(builder.lookup_binding(value))
            out = builder.emit_output(value)
        builder.emit_func_output(out)
    assert all(is_move(call) for call in calls)
    vm = relax.VirtualMachine(tvm.compile(builder.get(), "llvm"), tvm.cpu())
    want = vm["main"](tvm.runtime.tensor(np.arange(72).reshape(6, 12))).numpy()
    np.testing.assert_array_equal(moved(calls, [6, 12]), want)


def test_a_take_by_a_computed_index_is_not_a_move():
    x = relax.Var("x", relax.TensorType((4, 4), "float32"))
    i = relax.Var("i", relax.TensorType((), "int64"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x, i]):
        call = builder.normalize(relax.op.take(x, i, axis=0))
        builder.emit_func_output(call)
    assert not is_move(call) and not is_move(builder.normalize(relax.op.add(x, x)))
