"""How the CUDA targets lower a program, for its build and for the pre-build check alike.

TVM's ``StorageRewrite`` may let a float32 shared buffer reuse a float16
one's memory while a tensor-core load still addresses it as float16; TVM's
CUDA code generator then refuses the program (``tvm_access_ptr element type
must match the source buffer``). A program with tensor-core fragments is
therefore lowered without that pass; its shared memory is still laid out by
lifetime (``MergeSharedMemoryAllocations``). The ``warp`` buffers of
``mma.sync`` programs need the pass: without it, TVM's ``LowerWarpMemory``
finds no lane index (``threadIdx.x``) around their allocation. Other
programs keep TVM's default pipeline; one software-pipelined with
asynchronous copies also gets TVM's ``cp.async`` pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import tvm
from tvm import s_tir, tirx

from probtune.plugin import iter_stmts
from probtune_cuda.software_pipeline import uses_async_copies

__all__ = ["TENSOR_CORE_SCOPES", "build_options", "lower_for_check", "uses_tensor_cores"]

TENSOR_CORE_SCOPES = ("wmma.matrix_a", "wmma.matrix_b", "wmma.accumulator")
"""Storage scopes of tensor-core fragments."""

_NO_STORAGE_REWRITE = {"tirx.disable_storage_rewrite": True}


def uses_tensor_cores(mod: tvm.IRModule) -> bool:
    """Whether ``mod``'s ``main`` allocates tensor-core fragments."""
    for stmt in iter_stmts(mod["main"].body):
        if isinstance(stmt, s_tir.SBlockRealize) and any(
            str(buffer.scope()) in TENSOR_CORE_SCOPES for buffer in stmt.block.alloc_buffers
        ):
            return True
    return False


@contextmanager
def build_options(mod: tvm.IRModule) -> Iterator[None]:
    """The pass options ``mod`` is built under (``tvm.compile`` and the launch table read the current ones).

    A program pipelined with asynchronous copies also needs TVM's ``cp.async`` pass.
    """
    config = dict(_NO_STORAGE_REWRITE) if uses_tensor_cores(mod) else {}
    if uses_async_copies(mod):
        config["tirx.use_async_copy"] = True
    with tvm.transform.PassContext(config=config):
        yield


def lower_for_check(mod: tvm.IRModule, tvm_target: dict[str, Any]) -> tvm.IRModule:
    """``mod``'s ``main`` lowered as MetaSchedule's ``VerifyGPUCode`` lowers it, up to the device code's memory layout.

    Without ``StorageRewrite`` where the build goes without it. Raises what TVM raises.
    """
    func = mod["main"].with_attr("global_symbol", "main").with_attr("target", tvm.target.Target(tvm_target))
    func = func.with_attr("tirx.noalias", True)
    passes = [
        s_tir.transform.LowerCrossThreadReduction(),
        s_tir.transform.LowerInitBlock(),
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(),
        s_tir.transform.LiftThreadBinding(),
        s_tir.transform.ManifestSharedMemoryLocalStage(),
        s_tir.transform.CompactBufferAllocation(),
        tirx.transform.StmtSimplify(),
        s_tir.transform.LowerAutoCopy(),
        s_tir.transform.UnifyThreadBinding(),
        s_tir.transform.LowerMatchBuffer(),
        s_tir.transform.InjectSoftwarePipeline(),
        s_tir.transform.LowerOpaqueBlock(),
        tirx.transform.FlattenBuffer(),
        tirx.transform.BF16ComputeLegalize(),
        tirx.transform.NarrowDataType(32),
        tirx.transform.StmtSimplify(),
        tirx.transform.VectorizeLoop(True),
        s_tir.transform.InjectVirtualThread(),
        s_tir.transform.InjectDoubleBuffer(),
        *([] if uses_tensor_cores(mod) else [tirx.transform.StorageRewrite()]),
        s_tir.transform.MergeSharedMemoryAllocations(),
        tirx.transform.LowerIntrin(),
    ]
    return tvm.transform.Sequential(passes)(tvm.IRModule({"main": func}))
