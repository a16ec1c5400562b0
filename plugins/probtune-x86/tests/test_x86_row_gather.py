"""A strided convolution's input gathered by output row: which blocks need it, the copy's layout, and the space's
tile programs reading it (their sums are checked in test_x86_amx.py)."""

from __future__ import annotations

import tvm
from tvm import te, topi

from probtune import Rng, generate_space
from probtune.workloads.workload import Workload
from probtune_x86 import _cpu_target
from probtune_x86.amx import AMX, _gather, amx_plan
from probtune_x86.row_gather import gather_rows, strided_rows

SAPPHIRE_RAPIDS = _cpu_target("amx-test", "Sapphire Rapids", {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2},
                              16, vnni=True, bf16=True, amx=True, amx_bf16=True)


def _conv(kernel: int, stride: int, width: int = 16) -> tvm.s_tir.Schedule:
    x = te.placeholder((1, width, width, 64), "uint8", name="X")
    w = te.placeholder((kernel, kernel, 64, 32), "int8", name="W")
    y = topi.nn.conv2d_nhwc(x, w, stride, kernel // 2, 1, out_dtype="int32")
    return tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([x, w, y])}))


def test_only_rows_that_step_the_input_by_more_than_one_are_gathered():
    for kernel in (1, 3):
        sch = _conv(kernel, 2)
        block = sch.get_sblock("conv2d_nhwc")
        assert strided_rows(sch, block, 0) == 2  # the output pixels along a row
        assert _gather(sch, block, AMX) == {"read": 0, "row": 2}
    sch = _conv(3, 1)
    assert strided_rows(sch, sch.get_sblock("conv2d_nhwc"), 0) is None


def test_the_copy_puts_a_rows_pixels_next_to_the_channels():
    sch = _conv(3, 2)
    block = sch.get_sblock("conv2d_nhwc")
    copy = gather_rows(sch, block, 0, 2)
    read = sch.get(block).reads[0]
    assert [int(extent) for extent in read.source.shape] == [1, 8, 3, 3, 8, 64]  # n, y, ry, rx, x, c
    assert sch.get(copy).writes[0].source.same_as(read.source)
    assert amx_plan(sch, block, AMX).rows_loop == 2


def test_the_tile_sketch_of_a_strided_convolution_gathers_and_the_vector_one_does_not():
    workload = Workload.from_module(_conv(3, 2).mod["main"], name="strided")
    space = generate_space(workload, SAPPHIRE_RAPIDS)
    (vector,) = space.alternatives
    kinds = [inst.kind for inst in space.trace.instructions]
    assert "gather_rows" in kinds
    assert "gather_rows" not in [inst.kind for inst in vector.trace.instructions]
    tiles, rejected = space.draw(Rng(0), space.trace.with_decisions({}))
    assert rejected is None and "pad_temp_reindex" in tiles.mod.script()  # the copy of the padded input
