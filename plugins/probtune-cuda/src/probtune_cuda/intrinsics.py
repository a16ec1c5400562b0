"""TVM's CUDA tensor intrinsics, and the annotations that mark a block for one."""

from __future__ import annotations

import functools
from typing import Any

from probtune.plugin import import_parsed

__all__ = ["TENSORIZE_INIT_KEY", "TENSORIZE_KEY", "WARP_EXECUTION_KEY", "load_tensor_intrinsics"]

TENSORIZE_KEY = "meta_schedule.auto_tensorize"
"""Block annotation naming the tensor intrinsic that replaces the block (TVM's RewriteTensorize reads it)."""

TENSORIZE_INIT_KEY = "meta_schedule.auto_tensorize_init"
"""Annotation naming the intrinsic that replaces the block's initialisation once it is split out."""

WARP_EXECUTION_KEY = "warp_execution"
"""A block run by a whole warp: ``threadIdx.x`` is then the lane, of the warp's size."""


@functools.cache
def load_tensor_intrinsics() -> Any:
    """TVM's CUDA tensor intrinsics, registered on first use (the import parses them all: seconds).

    TVM names but does not register the int8 ``mma.sync`` loads from dynamic
    shared memory and the int32 store into it (its
    ``get_mma_intrin_group`` returns their names): they are registered here,
    from TVM's own generators.
    """
    from tvm.s_tir import TensorIntrin

    import_parsed("tvm.s_tir.tensor_intrin")  # every target's, as MetaSchedule's postprocessors import them
    cuda_intrinsics = import_parsed("tvm.s_tir.tensor_intrin.cuda")

    missing = {
        "mma_ldmatrix_i8_a_dyn": lambda: cuda_intrinsics.get_ldmatrix_intrin(32, "int8", "A", False, "shared.dyn"),
        "mma_ldmatrix_i8_b_dyn": lambda: cuda_intrinsics.get_ldmatrix_intrin(32, "int8", "B", False, "shared.dyn"),
        "mma_ldmatrix_i8_b_trans_dyn": lambda: cuda_intrinsics.get_ldmatrix_intrin(32, "int8", "B", True, "shared.dyn"),
        "mma_store_16x16_i32_shared_dyn_simple_": lambda: cuda_intrinsics.get_mma_store_intrin("int32", 8, "shared.dyn", False),
    }
    for name, generate in missing.items():
        if TensorIntrin.get(name, allow_missing=True) is None:
            TensorIntrin.register(name, *generate())
    return cuda_intrinsics
