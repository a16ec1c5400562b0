"""Concatenations written one input at a time, and batch norms as one multiply-add, on models and on programs."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import s_tir, te, topi

from conftest import untuned_runner
from probtune import Rng
from probtune.model import concatenation, extract_tasks, fuse, load_model
from probtune.model.check import check_outputs
from probtune.model.compile import CompiledModel, compile_model, default_program
from probtune.model.concatenation import MIN_INPUTS, split_concatenation, split_concatenations
from probtune.model.examples import make_model
from probtune.schedule.analysis import iter_stmts
from probtune.space.space_generator import generate_space
from probtune.targets import resolve_target
from probtune.workloads.workload import Workload


def _blocks(func: tvm.tirx.PrimFunc) -> list[str]:
    return [s.block.name_hint for s in iter_stmts(func.body)
            if isinstance(s, s_tir.SBlockRealize) and s.block.name_hint != "root"]


def _run(func: tvm.tirx.PrimFunc, arrays: list[np.ndarray], out_shape: tuple[int, ...]) -> np.ndarray:
    built = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    args = [tvm.runtime.tensor(a) for a in arrays] + [tvm.runtime.tensor(np.zeros(out_shape, np.float32))]
    built["main"](*args)
    return args[-1].numpy()


def _concat_relu(widths: tuple[int, ...], axis: int, then=None) -> tuple[tvm.tirx.PrimFunc, list[te.Tensor]]:
    inputs = [te.placeholder((2, 5, w) if axis == 2 else (2, w, 5), name=f"x{n}") for n, w in enumerate(widths)]
    out = topi.nn.relu(topi.concatenate(inputs, axis=axis) * 2.0 - 1.0)
    out = then(out) if then else out
    return te.create_prim_func([*inputs, out]), inputs


@pytest.mark.parametrize("axis", [1, 2])
def test_a_concatenation_and_its_elementwise_consumers_become_one_loop_nest_per_input(axis):
    widths = (3, 8, 1, 4)
    func, inputs = _concat_relu(widths, axis)
    assert split_concatenation(func) is None  # fewer inputs than MIN_INPUTS: a short chain of tests costs less
    split = split_concatenation(func, min_inputs=2)
    assert split is not None
    assert len(_blocks(split)) == len(widths)
    assert "if_then_else" not in split.script()
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal([int(d) for d in x.shape]).astype(np.float32) for x in inputs]
    expected = np.maximum(np.concatenate(arrays, axis=axis) * 2 - 1, 0)
    out_shape = expected.shape
    np.testing.assert_array_equal(_run(split, arrays, out_shape), expected)
    np.testing.assert_array_equal(_run(func, arrays, out_shape), expected)


def test_what_is_not_a_plain_concatenation_is_left_as_it_is():
    reduced, _ = _concat_relu((3, 5), 1, then=lambda t: topi.sum(t, axis=2))
    assert split_concatenation(reduced, min_inputs=2) is None  # a reduction: its inputs are read many times
    shuffled, _ = _concat_relu((4, 4), 1, then=lambda t: topi.transpose(topi.reshape(t, (2, 2, 4, 5)), (0, 2, 1, 3)))
    assert split_concatenation(shuffled, min_inputs=2) is None  # a channel shuffle: tests on an index expression
    x = te.placeholder((4, 6), name="x")
    padded = topi.nn.pad(x, (1, 1), (1, 1))
    assert split_concatenation(te.create_prim_func([x, padded]), min_inputs=2) is None  # padding: one input


def test_a_module_counts_its_split_functions_and_one_tvm_refuses_keeps_its_form(monkeypatch):
    many, _ = _concat_relu((2,) * MIN_INPUTS, 1)
    few, _ = _concat_relu((2, 3), 1)
    mod = tvm.IRModule({"many": many, "few": few})
    split, count = split_concatenations(mod)
    assert count == 1 and "if_then_else" not in split["many"].script() and split["few"].same_as(few)

    def refuse(func):
        raise RuntimeError("refused")

    monkeypatch.setattr(concatenation, "_inline_all", refuse)
    with pytest.warns(UserWarning) as caught:
        kept, count = split_concatenations(mod)
    assert count == 0 and kept is mod
    assert sorted(str(w.message) for w in caught) == [
        f"{name} keeps TVM's concatenation: RuntimeError: refused" for name in ("few", "many")
    ]


def test_every_draw_of_the_split_concatenations_space_is_correct():
    func, inputs = _concat_relu((16, 32, 32, 8), 2)
    split = split_concatenation(func, min_inputs=2)
    host = resolve_target("host")
    space = generate_space(Workload.from_module(split, name="concat_relu"), host)
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal([int(d) for d in x.shape]).astype(np.float32) for x in inputs]
    expected = np.maximum(np.concatenate(arrays, axis=2) * 2 - 1, 0)
    draws = Rng(3)
    programs = [space.sample(draws) for _ in range(6)]
    assert any(programs)
    for candidate in filter(None, programs):
        np.testing.assert_array_equal(_run(candidate.mod["main"], arrays, expected.shape), expected)


@pytest.fixture
def dense_block_onnx(tmp_path):
    """A dense block as torchvision exports DenseNet's: each layer concatenates every earlier output, then batch
    norm, ReLU and a convolution (the batch norm after a concatenation is not folded into a convolution)."""
    rng = np.random.default_rng(0)
    weights, nodes = [], []

    def weight(name, *shape, positive=False):
        value = rng.standard_normal(shape).astype(np.float32)
        weights.append(numpy_helper.from_array(np.abs(value) + 0.5 if positive else value, name))
        return name

    def layer(n, features, channels):
        stats = [weight(f"{kind}{n}", channels, positive=kind == "v") for kind in ("g", "b", "m", "v")]
        cat = f"cat{n}"
        nodes.append(helper.make_node("Concat", features, [cat], axis=1))
        nodes.append(helper.make_node("BatchNormalization", [cat, *stats], [f"bn{n}"], epsilon=1e-5))
        nodes.append(helper.make_node("Relu", [f"bn{n}"], [f"r{n}"]))
        nodes.append(helper.make_node("Conv", [f"r{n}", weight(f"w{n}", 4, channels, 3, 3)], [f"f{n}"], pads=[1] * 4))
        return f"f{n}"

    features = ["x"]
    for n in range(1, MIN_INPUTS + 1):  # layer n concatenates n inputs
        features.append(layer(n, features, 8 + 4 * (n - 1)))
    nodes.append(helper.make_node("Concat", features, ["y"], axis=1))
    channels = 8 + 4 * MIN_INPUTS
    graph = helper.make_graph(nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 6, 6])], weights)
    path = tmp_path / "dense.onnx"
    onnx.save(make_model(graph), path)
    return path


def test_a_dense_blocks_concatenations_are_split_and_its_batch_norms_are_a_multiply_add(dense_block_onnx):
    host = resolve_target("host")
    model = load_model(dense_block_onnx)
    fused = fuse(model, host)
    tasks = extract_tasks(fused)
    split = [task for task in tasks if "concatenate" in task.name and "if_then_else" not in task.workload.mod.script()]
    assert sorted(len(_blocks(task.workload.prim_func)) for task in split) == [MIN_INPUTS, MIN_INPUTS + 1]
    assert not any("sqrt" in task.workload.mod.script() for task in tasks)
    check_outputs(model, untuned_runner(fused, host))
    programs = {}
    for task in tasks:
        program = default_program(generate_space(task.workload, host))
        programs.update({name: program for name in task.functions})
    executable, _, _ = compile_model(fused, programs, host)
    check_outputs(model, CompiledModel(executable, model.inputs, host.num_cores))


def test_a_target_that_splits_no_concatenation_keeps_each_one_loop_nest(dense_block_onnx):
    """A GPU would launch one kernel per input's loop nest (CUDA targets set ``split_concatenations`` False): the
    concatenation stays TVM's one nest, its tests per element in one kernel, and computes the same values."""
    host = resolve_target("host")
    model = load_model(dense_block_onnx)
    kept = dataclasses.replace(host, split_concatenations=False)
    fused = fuse(model, kept)
    concatenations = [task for task in extract_tasks(fused) if "concatenate" in task.name]
    assert concatenations and all("if_then_else" in task.workload.mod.script() for task in concatenations)
    check_outputs(model, untuned_runner(fused, host))
