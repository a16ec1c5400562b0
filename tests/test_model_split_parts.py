from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from conftest import untuned_runner
from probtune.model import extract_tasks, fuse, load_model
from probtune.model.check import check_outputs
from probtune.model.examples import make_model
from probtune.model.part_reads import PART_READS
from probtune.model.precision import convert_precision
from probtune.model.rewrites import rewrite_counts
from probtune.model.split_parts import SLICED_SPLITS, slice_splits, split_bounds
from probtune.targets import resolve_target

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture
def mixed_convolution_onnx(tmp_path):
    """MixNet's mixed convolution as timm exports it: a convolution's channels split in groups of 8, 8 and 16, each
    convolved with its own window and concatenated."""
    rng = np.random.default_rng(0)
    groups, windows = [8, 8, 16], [3, 5, 1]
    weights = [numpy_helper.from_array(np.array(groups, np.int64), "sizes"),
               numpy_helper.from_array(rng.standard_normal((32, 40, 1, 1)).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["e"]), helper.make_node("Split", ["e", "sizes"], ["g0", "g1", "g2"], axis=1)]
    for n, (channels, window) in enumerate(zip(groups, windows)):
        weights.append(numpy_helper.from_array(rng.standard_normal((8, channels, window, window)).astype(np.float32), f"w{n}"))
        nodes.append(helper.make_node("Conv", [f"g{n}", f"w{n}"], [f"c{n}"], pads=[window // 2] * 4))
    nodes.append(helper.make_node("Concat", ["c0", "c1", "c2"], ["y"], axis=1))
    graph = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 40, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 24, 12, 12])], weights)
    path = tmp_path / "mixed.onnx"
    onnx.save(make_model(graph), path)
    return path


def _split(sections, length=10):
    x = relax.Var("x", relax.TensorType((2, length), "float32"))
    return relax.op.split(x, sections, axis=-1)


@pytest.mark.parametrize(("sections", "bounds"), [(2, [(0, 5), (5, 10)]), (3, [(0, 4), (4, 8), (8, 10)]),
                                                  ([3, 7], [(0, 3), (3, 7), (7, 10)])])
def test_split_bounds_cut_as_tvm_does(sections, bounds):
    call = _split(sections)
    assert split_bounds(call) == (1, bounds)
    extents = [int(field.shape[1]) for field in relax.BlockBuilder().normalize(call).ty.fields]
    assert extents == [end - begin for begin, end in bounds]


def test_each_part_becomes_a_slice(mixed_convolution_onnx):
    model = load_model(mixed_convolution_onnx)
    sliced, count = slice_splits(model.mod)
    assert count == 1
    assert "R.split" not in sliced.script() and sliced.script().count("R.strided_slice") == 3


@pytest.mark.parametrize("name", ["host", "cuda-sm90"])
def test_convolutions_read_their_groups_in_place(mixed_convolution_onnx, name):
    """No copy of a group of channels is a task: the convolutions take theirs inside their own functions (in fp16,
    cast once before the split); the outputs match onnxruntime's."""
    model = load_model(mixed_convolution_onnx)
    precision = "fp16" if name.startswith("cuda") else "fp32"
    converted = dataclasses.replace(model, mod=convert_precision(model.mod, precision)) if precision == "fp16" else model
    fused = fuse(converted, resolve_target(name))
    counts = rewrite_counts(fused)
    assert counts[SLICED_SPLITS] == 1 and counts[PART_READS] == 3
    names = [task.name for task in extract_tasks(fused)]
    assert not any("split" in task or "strided_slice" in task for task in names), names
    assert sum(task.startswith("fused_part_conv2d") for task in names) == 3
    check_outputs(model, untuned_runner(fused, resolve_target("host")), precision=precision)


def test_a_split_whose_tuple_is_read_whole_is_kept():
    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            parts = builder.emit(relax.op.split(x, 2, axis=1))
            out = builder.emit_output(parts)
        builder.emit_func_output(out)
    mod = builder.get()
    assert slice_splits(mod) == (mod, 0)
