"""NVIDIA CUDA targets for probtune, and the GPU design space they use.

The targets' programs are tiled across thread blocks, virtual threads and
threads, read their inputs through shared memory and accumulate in
registers; they build here without a GPU or a CUDA toolkit (the module keeps
its CUDA source, compiled when a machine with a GPU loads it), and are timed
only where TVM's runtime sees a CUDA device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from probtune import hookimpl
from probtune_cuda.multi_level_tiling import GPUMultiLevelTiling
from probtune_cuda.postprocs import (
    RewriteCooperativeFetch,
    RewriteGPUReductionBlock,
    RewriteUnboundBlock,
    VerifyGPUCode,
    VerifyRegisterTile,
)
from probtune_cuda.targets import make_targets
from probtune_cuda.unroll import GPU_AUTO_UNROLL, RewriteGPUUnroll

__all__ = [
    "GPUMultiLevelTiling",
    "RewriteCooperativeFetch",
    "RewriteGPUReductionBlock",
    "RewriteGPUUnroll",
    "RewriteUnboundBlock",
    "VerifyGPUCode",
    "VerifyRegisterTile",
]


@hookimpl
def probtune_register_targets(register: Callable[[Any], None]) -> None:
    for target in make_targets():
        register(target)


@hookimpl
def probtune_register_space_modules(register: Callable[[Any], None]) -> None:
    register(GPUMultiLevelTiling())
    register(GPU_AUTO_UNROLL)


@hookimpl
def probtune_register_validators(register: Callable[[Any], None]) -> None:
    register(RewriteCooperativeFetch())
    register(RewriteUnboundBlock())
    register(RewriteGPUUnroll())
    register(RewriteGPUReductionBlock())
    register(VerifyRegisterTile())
    register(VerifyGPUCode())
