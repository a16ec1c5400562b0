"""A convolution rewritten as the tensor intrinsic's matmul: its layouts, and its numbers checked on this machine's CPU."""

from __future__ import annotations

import pytest
from tvm import s_tir

from conftest import assert_program_correct
from probtune.space.space_generator import generate_space
from probtune.targets import resolve_target
from probtune.workloads.catalog import resolve_workload
from probtune_cuda.intrinsics import load_tensor_intrinsics
from probtune_cuda.reindex import contiguous_widths, intrinsic_layout, transform_to_intrinsic

pytestmark = pytest.mark.filterwarnings("ignore")


def wmma_compute(trans_b: bool = False) -> str:
    return load_tensor_intrinsics().get_wmma_intrin_group("shared", "shared", "float16", "float32", trans_b)["compute"]


def block_extents(raw: s_tir.Schedule, name: str) -> list[int]:
    return [int(iv.dom.extent) for iv in raw.get(raw.get_sblock(name)).iter_vars]


@pytest.mark.parametrize(
    "name,shape,mkn",
    [
        ("conv2d_nhwc", "2,8,9,9,12,3,3,2,1", (2 * 5 * 5, 12, 3 * 3 * 8)),  # stride 2, zero padding, a batch of two
        ("conv2d_nchw", "1,16,8,8,16,3,3,1,1", (8 * 8, 16, 16 * 3 * 3)),
        ("conv2d_nhwc", "1,3,14,14,8,7,7,2,3", (7 * 7, 8, 7 * 7 * 3)),  # a first layer: three input channels
        ("conv2d_nchw", "1,8,6,6,4,1,1,1,0", (6 * 6, 4, 8)),  # 1x1, no padding block
    ],
)
def test_a_convolution_becomes_one_matmul_over_its_whole_window(host, name, shape, mkn):
    """The block iterates (i, j, k) = (images x rows x columns, output channels, window x input channels): no batch left."""
    workload = resolve_workload(name, shape, "float16")
    raw = s_tir.Schedule(workload.mod)
    store, a, b = transform_to_intrinsic(raw, raw.get_sblock(name), wmma_compute())
    m, n, k = mkn
    assert block_extents(raw, name) == [m, n, k]
    assert [block_extents(raw, str(raw.get(copy).name_hint)) for copy in (store, a, b)] == [[m, n], [m, k], [k, n]]
    assert_program_correct(workload, raw.mod, host)


@pytest.mark.parametrize("name,shape", [("matmul", "32,48,64"), ("batch_matmul", "2,32,48,64"), ("dense_bias_relu", "32,48,64")])
def test_blocks_that_already_iterate_as_the_intrinsic_are_left_alone(name, shape):
    raw = s_tir.Schedule(resolve_workload(name, shape, "float16").mod)
    block = "T_dense" if name == "dense_bias_relu" else "C"
    assert intrinsic_layout(raw, raw.get_sblock(block), wmma_compute()) is None


def test_a_block_with_no_matmul_in_it_is_refused_by_name():
    """A depthwise convolution multiplies each channel by its own filter: no output-channel iterator for j."""
    raw = s_tir.Schedule(resolve_workload("depthwise_conv2d_nchw", "1,8,6,6,3,3,1,1", "float32").mod)
    block = raw.get_sblock("depthwise_conv2d_nchw")
    assert intrinsic_layout(raw, block, wmma_compute()) is None
    with pytest.raises(ValueError, match="'depthwise_conv2d_nchw' has no layout as the intrinsic"):
        transform_to_intrinsic(raw, block, wmma_compute())


@pytest.mark.parametrize(
    "name,shape,trans_b,widths",
    [
        ("conv2d_nhwc", "1,8,6,6,4,3,3,1,1", False, ([1, 2, 4, 8], [1, 2, 4])),  # channels innermost; 4 output channels
        ("conv2d_nhwc", "1,12,6,6,8,3,3,1,1", False, ([1, 2, 4], [1, 2, 4, 8])),  # 8 would straddle a pixel's 12 channels
        ("conv2d_nchw", "1,8,6,6,8,3,3,1,1", True, ([1], [1, 2, 4, 8])),  # the window runs along rows; a filter is 72 in a row
        ("conv2d_nchw", "1,8,6,6,8,3,3,1,1", False, ([1], [1])),  # filters read across output channels: scalars
    ],
)
def test_copies_read_as_many_elements_at_once_as_the_layout_allows(name, shape, trans_b, widths):
    workload = resolve_workload(name, shape, "float16")
    raw = s_tir.Schedule(workload.mod)
    _, a, b = transform_to_intrinsic(raw, raw.get_sblock(name), wmma_compute(trans_b))
    assert (contiguous_widths(raw, a, [1, 2, 4, 8]), contiguous_widths(raw, b, [1, 2, 4, 8])) == widths
    matmul = s_tir.Schedule(resolve_workload("matmul", "64,48,40", "float16").mod)
    assert contiguous_widths(matmul, matmul.cache_read(matmul.get_sblock("C"), 0, "shared"), [1, 2, 4, 8]) == [1, 2, 4, 8]


@pytest.mark.parametrize("name,trans_b", [("conv2d_nhwc", False), ("conv2d_nchw", True)])
def test_the_tiling_lays_the_filters_out_as_they_are_stored(name, trans_b):
    """B[k, j] for HWIO filters, B[j, k] for OIHW ones: either way the copy into shared memory reads whole vectors."""
    space = generate_space(resolve_workload(name, "1,16,16,16,32,3,3,1,1", "float16"), resolve_target("cuda-sm90"))
    [transform] = [inst for inst in space.trace.instructions if inst.kind == "transform_to_intrinsic"]
    assert transform.attrs["intrinsic"] == wmma_compute(trans_b)


def test_a_split_reductions_partial_products_become_a_batched_matmul(host):
    """After rfactor a part reads ``A[i, p * 32 + k]``: its operands are copied into ``[p, i, k]`` and ``[p, k, j]``."""
    workload = resolve_workload("matmul", "32,48,128", "float16")
    raw = s_tir.Schedule(workload.mod)
    *_, k = raw.get_loops(raw.get_sblock("C"))
    part, _ = raw.split(k, [4, None])
    partials = raw.rfactor(part, 0)
    loops = raw.get_loops(partials)
    raw.reorder(loops[2], *loops[:2])
    assert intrinsic_layout(raw, partials, wmma_compute()) is not None
    store, a, b = transform_to_intrinsic(raw, partials, wmma_compute())
    assert block_extents(raw, "C_rf") == [4, 32, 48, 32]
    assert [block_extents(raw, str(raw.get(copy).name_hint)) for copy in (store, a, b)] == [[4, 32, 48], [4, 32, 32], [4, 32, 48]]
    assert_program_correct(workload, raw.mod, host)
