"""Concatenations written by their producers: no concatenation task, no copy, the same outputs."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import s_tir, te, topi

from probtune.measure.run_model_bundle import MANIFEST
from probtune.model import extract_tasks, fuse, load_model, tune_model
from probtune.model.bundle import Tolerance, write_model_bundle
from probtune.model.check import check_outputs
from probtune.model.compile import default_programs
from probtune.model.concat_in_place import aligned, concatenations_in_place, write_into
from probtune.model.concatenation import concatenation_axis
from probtune.model.examples import make_model
from probtune.model.precision import TOLERANCES, convert_precision
from probtune.space.space_generator import generate_space
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


def test_a_view_keeps_each_elements_address_modulo_the_alignment_or_is_not_written():
    assert aligned((1, 8, 8, 40), (1, 8, 8, 16), 3, 16, "float16", 16)  # rows of 80 and 32 bytes, start at 32
    assert aligned((1, 8, 8, 40), (1, 8, 8, 24), 3, 16, "float16", 16)
    assert not aligned((1, 8, 8, 36), (1, 8, 8, 20), 3, 16, "float16", 16)  # rows of 72 and 40 bytes
    assert not aligned((1, 8, 8, 40), (1, 8, 8, 36), 3, 4, "float16", 16)  # starts 8 bytes in
    assert aligned((1, 8, 8, 40), (1, 8, 8, 36), 3, 4, "float32", 16)
    assert aligned((1, 8, 8, 37), (1, 8, 8, 5), 3, 32, "float32", 1)  # a CPU's loads take any address
    assert aligned((1, 6, 8, 8), (1, 2, 8, 8), 1, 4, "float16", 16)  # channels first: 8-element rows
    assert aligned((3, 8), (1, 8), 0, 2, "float32", 16)  # a part of one row has no row stride


def _branches(path, first: int, second: int):
    """An input convolved by two branches of ``first`` and ``second`` channels, concatenated and convolved again."""
    rng = np.random.default_rng(0)

    def weight(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"]), helper.make_node("Relu", ["a"], ["ar"]),
        helper.make_node("Conv", ["x", "w3"], ["b"], pads=[1] * 4), helper.make_node("Relu", ["b"], ["br"]),
        helper.make_node("Concat", ["ar", "br"], ["both"], axis=1),
        helper.make_node("Conv", ["both", "w5"], ["y"]),
    ]
    weights = [weight("w1", first, 16, 1, 1), weight("w3", second, 16, 3, 3), weight("w5", 8, first + second, 1, 1)]
    graph = helper.make_graph(nodes, "branches", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], weights)
    onnx.save(make_model(graph), path)
    return load_model(path)


@pytest.mark.parametrize("second, in_place", [(16, True), (12, False)])
def test_a_gpu_model_writes_a_concatenation_in_place_where_its_stretches_keep_16_byte_alignment(tmp_path, second, in_place):
    """In float16 for cuda-sm90 both branches store float16 channels last: 8 + 16 channels are stretches of 16 and 32
    bytes, written by the branches' kernels into one tensor; with a 12-channel branch (24-byte rows) they are not,
    and the concatenation is a kernel of its own. The bundle's launches name the whole tensor, not the view."""
    target = resolve_target("cuda-sm90")
    model = _branches(tmp_path / "branches.onnx", 8, second)
    fused = fuse(dataclasses.replace(model, mod=convert_precision(model.mod, "fp16")), target)
    assert [len(site.producers) for site in concatenations_in_place(fused)] == ([2] if in_place else [])
    tasks = extract_tasks(fused)
    entries = [(t.functions, generate_space(t.workload, target), t.workload.mod) for t in tasks]
    written = write_model_bundle(fused, default_programs(entries, 0, target), target, tmp_path / "bundle", name="b",
                                 inputs=model.inputs, tolerance=Tolerance(*TOLERANCES["fp16"]))
    plan = json.loads((written.path / MANIFEST).read_text())["plan"]
    concatenating = [call for call in plan["calls"] if "concatenate" in call["function"]]
    assert bool(concatenating) != in_place
    if in_place:
        into = [call for call in plan["calls"] if "_into" in call["function"]]
        assert len(into) == 2 and into[0]["args"][-1] == into[1]["args"][-1]  # both write the one tensor
        assert plan["tensors"][into[0]["args"][-1]]["shape"] == [1, 8, 8, 8 + second]
