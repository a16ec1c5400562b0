"""Launch tables: a program's kernels, grids and arguments as a bundle runtime launches them without TVM."""

from __future__ import annotations

import tvm
from tvm import s_tir, te, topi

from probtune.model.concat_in_place import write_into
from probtune.targets import resolve_target
from probtune_cuda.launch import kernel_launches


def test_an_output_written_as_a_view_into_a_larger_tensor_is_launched_with_that_tensor():
    """The kernel gets the whole tensor's address and adds the view's offset itself; the table names the parameter."""
    x = te.placeholder((1, 8, 8, 16), "float16", name="x")
    sch = s_tir.Schedule(te.create_prim_func([x, topi.nn.relu(x)]))
    block = sch.get_sblock("compute")
    outer, inner = sch.split(sch.fuse(*sch.get_loops(block)), [None, 64])
    sch.bind(outer, "blockIdx.x")
    sch.bind(inner, "threadIdx.x")
    into = write_into(sch.mod["main"], (1, 8, 8, 40), axis=3, offset=16)
    launches, scratch = kernel_launches(tvm.IRModule({"main": into}), resolve_target("cuda-sm90").tvm_target)
    assert scratch == [] and len(launches) == 1
    assert sorted(arg["param"] for arg in launches[0].args if "param" in arg) == [0, 1]
    assert launches[0].grid == (16, 1, 1) and launches[0].block == (64, 1, 1)
