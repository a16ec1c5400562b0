"""Split-K: which products are split, and the two kernels a split product compiles to."""

from __future__ import annotations

import dataclasses
import re

import pytest
import tvm_ffi

from conftest import multiplies_on_tensor_cores, valid_samples
from probtune.measure.codegen import compile_for
from probtune.plugin import SpaceContext
from probtune.space.space_generator import generate_space
from probtune.targets import resolve_target
from probtune.workloads.catalog import resolve_workload
from probtune_cuda.launch import kernel_launches
from probtune_cuda.split_reduction import MAX_PARTS, split_choices

pytestmark = pytest.mark.filterwarnings("ignore")

TILE = 16


@pytest.fixture(scope="module")
def sm90():
    return resolve_target("cuda-sm90")


def context(target) -> SpaceContext:
    return SpaceContext(workload=None, target=target)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("extents", "tile_loops", "split"),
    [
        ([128, 768, 3072], (0, 1, 2), True),  # a transformer's second feed-forward product at batch 1
        ([64, 512, 4608], (0, 1, 2), True),  # ResNet-50's last 3x3 convolutions at batch 1 (49 rows, padded)
        ([128, 2304, 768], (0, 1, 2), False),  # its packed projections: enough tiles, a short reduction
        ([2048, 768, 3072], (0, 1, 2), False),  # the same product at batch 16: the tiles fill the GPU
        ([256, 64, 288], (0, 1, 2), False),  # a small convolution: the reduction takes about a launch's time
        ([12, 128, 128, 64], (1, 2, 3), False),  # attention's scores: the reduction is shorter than the output sides
        ([4, 64, 64, 2048], (1, 2, 3), True),  # a batch counts as tiles
    ],
)
def test_few_tiles_over_a_long_reduction_are_split(sm90, extents, tile_loops, split):
    choices = split_choices(extents, tile_loops, context(sm90), TILE)
    assert bool(choices) == split
    depth = extents[tile_loops[2]]
    assert all(2 <= n <= MAX_PARTS and depth % (n * TILE) == 0 and depth // n >= 128 for n in choices)


def test_a_target_that_does_not_count_its_multiprocessors_splits_nothing(sm90):
    unknown = dataclasses.replace(sm90, attrs={})
    assert split_choices([128, 768, 3072], (0, 1, 2), context(unknown), TILE) == []
    assert resolve_target("cuda-sm80").attrs["multiprocessors"] == 108


def split_sketch(space):
    """The space's split-K sketch alone: the product computed whole is the first, the split one its only alternative."""
    assert [sum(i.kind == "rfactor" for i in sketch.trace.instructions) for sketch in space.sketches] == [0, 1]
    (split,) = space.alternatives
    return dataclasses.replace(space, trace=split.trace, prior_end=split.prior_end, alternatives=[])


def test_the_search_draws_a_splittable_product_both_whole_and_split(sm90):
    """Split-K is a sketch beside the whole product, not a rule: fresh draws take each, and the measurements choose."""
    space = generate_space(resolve_workload("matmul", "128,768,3072", "float16"), sm90, seed=0)
    found = valid_samples(space, 12, tries=60)
    split = [any(i.kind == "rfactor" for i in candidate.trace.instructions) for candidate in found]
    assert len(found) == 12 and any(split) and not all(split)
    for candidate in found:
        assert tvm_ffi.structural_equal(space.program(candidate.trace), candidate.mod)
        assert len(kernel_launches(candidate.mod, sm90.tvm_target)[0]) == (2 if any(
            i.kind == "rfactor" for i in candidate.trace.instructions) else 1)


@pytest.mark.parametrize(("name", "shape", "outputs", "epilogue"),
                         [("matmul", "128,768,3072", 128 * 768, "(half)"), ("dense_bias_gelu", "64,256,2048", 64 * 256, "erff(")])
def test_a_split_product_runs_its_parts_on_the_tensor_cores_then_sums_them_with_the_epilogue(sm90, name, shape, outputs, epilogue):
    """Two kernels: the parts' partial products (each part its own thread blocks) into a float32 scratch buffer, then
    one thread per output summing them and finishing the epilogue, the only kernel writing the output."""
    space = split_sketch(generate_space(resolve_workload(name, shape, "float16"), sm90, seed=0))
    kinds = [inst.kind for inst in space.trace.instructions]
    assert kinds.count("rfactor") == 1 and kinds.count("transform_to_intrinsic") == 1
    found = valid_samples(space, 3, tries=30)
    assert len(found) == 3
    output = len(space.workload.prim_func.params) - 1
    for candidate in found:
        source = compile_for(candidate.mod, sm90).mod.imports[0].inspect_source()
        assert multiplies_on_tensor_cores(source)
        kernels = [part for part in re.split(r"extern \"C\" __global__", source)[1:] if "{" in part]  # definitions
        assert len(kernels) == 2 and epilogue in kernels[1] and epilogue not in kernels[0]
        (partial, summed), (scratch,) = kernel_launches(candidate.mod, sm90.tvm_target)
        parts = scratch.elements // outputs
        assert scratch.dtype == "float32" and 2 <= parts <= MAX_PARTS and scratch.elements == parts * outputs
        assert partial.grid[0] % parts == 0 and {"param": output} not in partial.args
        assert {"scratch": scratch.name} in summed.args and {"param": output} in summed.args
        assert tvm_ffi.structural_equal(space.program(candidate.trace), candidate.mod)
