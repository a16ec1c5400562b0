"""Concatenations written by their producers: no concatenation task, no copy, the same outputs."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import s_tir, te, topi

from probtune.model import extract_tasks, fuse, load_model, tune_model
from probtune.model.check import check_outputs
from probtune.model.concat_in_place import concatenations_in_place, write_into
from probtune.model.concatenation import concatenation_axis
from probtune.model.examples import make_model
from probtune.targets import resolve_target


def _placeholders(*shapes: tuple[int, ...]) -> list[te.Tensor]:
    return [te.placeholder(shape, name=f"x{n}") for n, shape in enumerate(shapes)]


def test_a_plain_concatenation_is_told_from_anything_else():
    a, b, c = _placeholders((1, 5, 5, 8), (1, 5, 5, 4), (1, 5, 5, 3))
    assert concatenation_axis(te.create_prim_func([a, b, c, topi.concatenate([a, b, c], axis=3)])) == 3
    d, e = _placeholders((1, 2, 5, 8), (1, 3, 5, 8))
    assert concatenation_axis(te.create_prim_func([d, e, topi.concatenate([d, e], axis=1)])) == 1
    assert concatenation_axis(te.create_prim_func([b, a, topi.concatenate([a, b], axis=3)])) is None  # not in order
    assert concatenation_axis(te.create_prim_func([a, b, topi.nn.relu(topi.concatenate([a, b], axis=3))])) is None
    f, g = _placeholders((1, 5, 5, 8), (1, 5, 5, 8))
    assert concatenation_axis(te.create_prim_func([f, g, topi.add(f, g)])) is None
    n = te.var("n")
    h, k = te.placeholder((n, 4), name="h"), te.placeholder((n, 2), name="k")
    assert concatenation_axis(te.create_prim_func([h, k, topi.concatenate([h, k], axis=1)])) is None  # symbolic


def test_a_tuned_producer_writes_only_its_stretch_of_the_whole():
    x, w = _placeholders((1, 8, 8, 16), (1, 1, 16, 24))
    func = te.create_prim_func([x, w, topi.nn.relu(topi.nn.conv2d_nhwc(x, w, 1, 0, 1))])
    sch = s_tir.Schedule(func)
    sch.compute_inline(sch.get_sblock("pad_temp"))
    loops = sch.get_loops(sch.get_sblock("compute"))
    sch.parallel(loops[1])
    sch.vectorize(sch.split(loops[3], [None, 8])[1])
    into = write_into(sch.mod["main"], (1, 8, 8, 40), axis=3, offset=16)
    built = tvm.compile(tvm.IRModule({"main": into}), target="llvm")
    rng = np.random.default_rng(0)
    xa, wa = rng.standard_normal((1, 8, 8, 16), np.float32), rng.standard_normal((1, 1, 16, 24), np.float32)
    whole = tvm.runtime.tensor(np.full((1, 8, 8, 40), -7.0, np.float32))
    built["main"](tvm.runtime.tensor(xa), tvm.runtime.tensor(wa), whole)
    out = whole.numpy()
    np.testing.assert_allclose(out[..., 16:], np.maximum(np.einsum("nhwc,ck->nhwk", xa, wa[0, 0]), 0), rtol=1e-5, atol=1e-5)
    assert (out[..., :16] == -7.0).all()


@pytest.fixture
def branches_onnx(tmp_path):
    """Two convolution branches concatenated (a fire module), and a third branch whose output is read twice."""
    rng = np.random.default_rng(0)

    def weight(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    weights = [weight("w1", 8, 4, 1, 1), weight("w3", 6, 4, 3, 3), weight("w5", 5, 14, 1, 1), weight("w7", 14, 4, 1, 1)]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"]), helper.make_node("Relu", ["a"], ["ar"]),
        helper.make_node("Conv", ["x", "w3"], ["b"], pads=[1] * 4), helper.make_node("Relu", ["b"], ["br"]),
        helper.make_node("Concat", ["ar", "br"], ["fire"], axis=1),  # written in place
        helper.make_node("Conv", ["fire", "w5"], ["c"]),
        helper.make_node("Conv", ["x", "w7"], ["d"]),
        helper.make_node("Concat", ["c", "fire"], ["both"], axis=1),  # fire is read twice: copied
        helper.make_node("Add", ["d", "fire"], ["e"]),
        helper.make_node("Concat", ["both", "e"], ["y"], axis=1),
    ]
    graph = helper.make_graph(nodes, "branches", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 33, 6, 6])], weights)
    path = tmp_path / "branches.onnx"
    onnx.save(make_model(graph), path)
    return path


def test_a_concatenation_of_fresh_outputs_is_no_task_and_the_model_still_matches(branches_onnx, tmp_path):
    host = resolve_target("host")
    model = load_model(branches_onnx)
    fused = fuse(model, host)
    sites = concatenations_in_place(fused)
    assert [len(site.producers) for site in sites] == [2]  # the fire module's; the others read a shared input
    tasks = extract_tasks(fused)
    assert not [task for task in tasks if concatenation_axis(task.workload.mod["main"]) is not None]
    assert [task.weight for task in tasks if "concatenate" in task.name] == [1]  # the last two, fused with a transpose
    result = tune_model(model, host, 0, database=tmp_path / "t.db")
    compiled = result.compile(num_threads=2)
    assert compiled.check is not None and compiled.in_place >= 2
    check_outputs(model, compiled)


def test_a_target_whose_code_cannot_write_through_a_view_keeps_the_concatenation_as_a_task(branches_onnx):
    model = load_model(branches_onnx)
    fused = fuse(model, dataclasses.replace(resolve_target("host"), concat_in_place=False))
    assert concatenations_in_place(fused) == []
    assert [task for task in extract_tasks(fused) if concatenation_axis(task.workload.mod["main"]) is not None]
