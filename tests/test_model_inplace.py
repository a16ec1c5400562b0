"""A program's output written over an input it reads element for element (a residual), only where that is safe."""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.script import tirx as T

from probtune.model import extract_tasks, fuse, load_model
from probtune.model.check import check_outputs
from probtune.model.compile import CompiledModel, compile_model, default_program
from probtune.model.inplace import overwritable_inputs, write_in_place
from probtune.space.space_generator import generate_space


@T.prim_func(s_tir=True)
def residual_add(a: T.Buffer((8,), "float32"), r: T.Buffer((8,), "float32"), out: T.Buffer((8,), "float32")):
    for i in range(8):
        with T.sblock("out"):
            v = T.axis.spatial(8, i)
            out[v] = T.max(a[v] + r[v], T.float32(0))


@T.prim_func(s_tir=True)
def shifted(a: T.Buffer((8,), "float32"), out: T.Buffer((8,), "float32")):
    for i in range(8):
        with T.sblock("out"):
            v = T.axis.spatial(8, i)
            out[v] = a[(v + 1) % 8]  # reads an element another iteration overwrites


@T.prim_func(s_tir=True)
def residual_read_early(a: T.Buffer((8,), "float32"), r: T.Buffer((8,), "float32"), out: T.Buffer((8,), "float32")):
    t = T.sblock_alloc_buffer((8,))
    for i in range(8):
        with T.sblock("t"):
            v = T.axis.spatial(8, i)
            t[v] = r[v] * T.float32(2)  # r read by a block that does not write the output
    for i in range(8):
        with T.sblock("out"):
            v = T.axis.spatial(8, i)
            out[v] = t[v] + a[v]


@T.prim_func(s_tir=True)
def accumulates_in_output(a: T.Buffer((8, 4), "float32"), r: T.Buffer((8,), "float32"), out: T.Buffer((8,), "float32")):
    for i, k in T.grid(8, 4):
        with T.sblock("sum"):
            v, vk = T.axis.remap("SR", [i, k])
            with T.init():
                out[v] = r[v]
            out[v] = out[v] + a[v, vk]


def test_an_input_read_where_the_output_is_written_may_be_overwritten():
    assert overwritable_inputs(residual_add) == [0, 1]
    assert overwritable_inputs(shifted) == []
    assert overwritable_inputs(residual_read_early) == [0]
    assert overwritable_inputs(accumulates_in_output) == []


def _in_place_calls(mod: tvm.IRModule) -> list[list[int]]:
    """The in-place indices of each ``call_tir_inplace`` in ``main``, in order."""
    inplace = tvm.ir.Op.get("relax.call_tir_inplace")
    found: list[list[int]] = []

    def visit(call: relax.Call) -> None:
        if call.op.same_as(inplace):
            found.append([int(i) for i in call.attrs.inplace_indices])

    tvm_ffi.structural_walk(mod["main"], (relax.Call, visit))
    return found


def test_only_a_fresh_tensor_that_nothing_uses_later_is_overwritten():
    x = relax.Var("x", relax.TensorType((8,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.exp(x))  # x is the model's input: never overwritten
            b = bb.emit(relax.op.add(a, x))  # a is used again below
            c = bb.emit(relax.op.multiply(b, b))  # b is passed twice
            d = bb.emit(relax.op.add(c, a))  # c is used again below; a is not: over a
            out = bb.emit_output(relax.op.subtract(d, c))  # over d, the first input not used again
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    updated, count = write_in_place(mod)
    assert count == 2 and _in_place_calls(updated) == [[1], [0]]

    data = np.random.default_rng(0).standard_normal(8).astype("float32")
    a = np.exp(data)
    c = (a + data) * (a + data)
    want = (c + a) - c
    for module in (mod, updated):
        vm = relax.VirtualMachine(tvm.compile(module, "llvm"), tvm.cpu())
        np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(data)).numpy(), want, rtol=1e-5)


def test_a_call_with_two_outputs_is_left_as_it_is():
    """A program of two outputs, the second read from the first where it is written (a recurrent cell's state and
    output): its first output is no input the call could write over."""
    from tvm import te

    def two(x):
        state = te.compute(x.shape, lambda i: x[i] + 1.0, name="state")
        return [state, te.compute(x.shape, lambda i: state[i] * 2.0, name="output")]

    x = relax.Var("x", relax.TensorType((8,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            pair = bb.emit_te(two, bb.emit(relax.op.exp(x)))
            out = bb.emit_output(relax.TupleGetItem(pair, 1))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    updated, count = write_in_place(mod)
    assert count == 0 and updated.same_as(mod)


def _bottleneck_onnx(path):
    """``relu(conv2(relu(conv1(y))) + y)`` with ``y = relu(conv0(x))``: the residual ``y`` is not the last conv's input."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((8, c, 3, 3)).astype("float32") * 0.2, f"w{i}")
               for i, c in enumerate((3, 8, 8))]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c0"], ["y"]),
        helper.make_node("Conv", ["y", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]), helper.make_node("Add", ["c2", "y"], ["s"]),
        helper.make_node("Relu", ["s"], ["out"]),
    ]
    graph = helper.make_graph(nodes, "bottleneck", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 8, 8, 8])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_a_residual_add_is_written_in_place_and_the_model_still_matches_onnxruntime(tmp_path, host):
    model = load_model(_bottleneck_onnx(tmp_path / "bottleneck.onnx"))
    fused = fuse(model, host)
    programs = {}
    for task in extract_tasks(fused):
        program = default_program(generate_space(task.workload, host))
        programs.update({name: program for name in task.functions})
    assert write_in_place(fused)[1] == 0  # unscheduled, the add is a block of its own that does not write the output
    executable, _, in_place = compile_model(fused, programs, host)
    assert in_place == 1  # the last conv's residual add, inlined into its output by the space
    report = check_outputs(model, CompiledModel(executable, model.inputs, host.num_cores))
    assert report.reference == "onnxruntime"
