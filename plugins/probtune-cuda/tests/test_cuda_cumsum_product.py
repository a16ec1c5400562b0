"""Graph rewrite cumsum-product: cumulative sums as products with a triangle of ones, which a model bundle can run."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import untuned_runner
from probtune.model import fuse, load_model
from probtune.model.check import check_outputs
from probtune.model.examples import make_model
from probtune.model.rewrites import rewrite_counts
from probtune.targets import resolve_target

pytestmark = pytest.mark.filterwarnings("ignore")


def _positions(path, length: int, exclusive: int = 0):
    """RoBERTa's position ids: ``cumsum(mask) * mask + 1`` over the tokens, the mask ``ids != 1`` (padding)."""
    weights = [numpy_helper.from_array(np.array(1, dtype=np.int64), "pad"),
               numpy_helper.from_array(np.array(1, dtype=np.int64), "axis")]
    nodes = [helper.make_node("Equal", ["ids", "pad"], ["is_pad"]), helper.make_node("Not", ["is_pad"], ["keep"]),
             helper.make_node("Cast", ["keep"], ["mask"], to=TensorProto.INT64),
             helper.make_node("CumSum", ["mask", "axis"], ["count"], exclusive=exclusive),
             helper.make_node("Mul", ["count", "mask"], ["kept"]), helper.make_node("Add", ["kept", "pad"], ["positions"])]
    graph = helper.make_graph(nodes, "positions", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, length])],
                              [helper.make_tensor_value_info("positions", TensorProto.INT64, [2, length])], weights)
    onnx.save(make_model(graph), path)
    return load_model(path)


@pytest.mark.parametrize("exclusive", [0, 1])
def test_a_cumulative_sum_becomes_a_product_that_computes_the_same(tmp_path, exclusive):
    model = _positions(tmp_path / "p.onnx", 16, exclusive)
    host = resolve_target("host")
    fused = fuse(model, host, rewrites=["cumsum-product"])
    assert rewrite_counts(fused)["cumsum-product"] == 1
    check_outputs(model, untuned_runner(fused, host))


def test_a_cuda_model_with_a_cumulative_sum_can_be_laid_out_as_a_plan(tmp_path):
    """The plan a bundle carries calls PrimFuncs only: TVM's own cumsum is a library call it cannot say."""
    cuda = resolve_target("cuda-sm90")
    fused = fuse(_positions(tmp_path / "p.onnx", 16), cuda)
    assert rewrite_counts(fused)["cumsum-product"] == 1
    assert "R.cumsum(" not in fused["main"].script()


def test_an_axis_longer_than_the_triangle_allows_is_left_to_tvm(tmp_path):
    from probtune_cuda.cumsum_product import MAX_LENGTH

    fused = fuse(_positions(tmp_path / "p.onnx", MAX_LENGTH + 1), resolve_target("cuda-sm90"))
    assert rewrite_counts(fused).get("cumsum-product", 0) == 0
