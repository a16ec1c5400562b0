"""TVM's CUDA tensor intrinsics, and the annotations that mark a block for one."""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["TENSORIZE_INIT_KEY", "TENSORIZE_KEY", "WARP_EXECUTION_KEY", "load_tensor_intrinsics"]

TENSORIZE_KEY = "meta_schedule.auto_tensorize"
"""Block annotation naming the tensor intrinsic that replaces the block (TVM's RewriteTensorize reads it)."""

TENSORIZE_INIT_KEY = "meta_schedule.auto_tensorize_init"
"""Annotation naming the intrinsic that replaces the block's initialisation once it is split out."""

WARP_EXECUTION_KEY = "warp_execution"
"""A block run by a whole warp: ``threadIdx.x`` is then the lane, of the warp's size."""

@functools.cache
def load_tensor_intrinsics() -> Any:
    """TVM's CUDA tensor intrinsics, registered on first use (the import parses them all: seconds)."""
    import tvm.s_tir.tensor_intrin.cuda as cuda_intrinsics

    return cuda_intrinsics
