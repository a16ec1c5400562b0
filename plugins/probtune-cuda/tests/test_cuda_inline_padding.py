"""Padding computed where it is read on the GPU: a depthwise convolution or a pooling is one kernel, not two."""

from __future__ import annotations

import re

import pytest
from tvm import te, topi

from conftest import valid_samples
from probtune.measure.codegen import compile_for
from probtune.schedule.analysis import program_blocks
from probtune.space.space_generator import generate_space
from probtune.targets import resolve_target
from probtune.workloads.workload import Workload
from probtune_cuda.codegen import CUDALintError
from probtune_cuda.inline_padding import is_padding

pytestmark = pytest.mark.filterwarnings("ignore")


def _depthwise() -> Workload:
    x = te.placeholder((1, 28, 28, 64), "float16", name="x")
    w = te.placeholder((3, 3, 64, 1), "float32", name="w")
    y = topi.nn.depthwise_conv2d_nhwc(x, w, (1, 1), (1, 1), (1, 1), out_dtype="float32")
    return Workload.from_module(te.create_prim_func([x, w, y]), name="depthwise")


def test_a_padding_block_is_told_from_other_copies():
    blocks = {block.name_hint: block for block in program_blocks(_depthwise().prim_func)}
    assert is_padding(blocks["PaddedInput"])
    assert not any(is_padding(block) for name, block in blocks.items() if name != "PaddedInput")


def test_a_depthwise_convolution_reads_its_input_through_the_padding_condition_in_one_kernel():
    target = resolve_target("cuda-sm90")
    space = generate_space(_depthwise(), target, seed=0)
    assert any(inst.kind == "compute_inline" for inst in space.trace.instructions)
    built = 0
    for candidate in valid_samples(space, 4, tries=40):
        try:
            source = compile_for(candidate.mod, target).mod.imports[0].inspect_source()
        except CUDALintError:  # a draw whose registers spill: refused as any such draw is
            continue
        built += 1
        assert len(set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", source))) == 1
        assert "PaddedInput" not in source
    assert built
