"""NVIDIA CUDA targets for probtune, and the GPU design space they use.

The targets' programs are tiled across thread blocks, virtual threads and
threads, read their inputs through shared memory and accumulate in
registers, or, for float16 and int8 matmul-like blocks, run on the tensor
cores (WMMA or mma.sync) warp by warp, software-pipelined or not; they build here
without a GPU or a CUDA toolkit (the module keeps its CUDA source, compiled
when a machine with a GPU loads it), and are timed only where TVM's runtime
sees a CUDA device, or in a bundle, whose cubins the plugin's bundle runtime
(``cupy``) launches with CuPy. The plugin also gives cost models the GPU
columns of a program's features (the feature extractor ``gpu``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from probtune.plugin import hookimpl
from probtune_cuda.broadcast_producers import GPUBroadcastProducers
from probtune_cuda.bundles import CUPY_RUNTIME
from probtune_cuda.cumsum_product import CumsumProduct
from probtune_cuda.features import GPUFeatures
from probtune_cuda.head_projections import HeadProjections
from probtune_cuda.inline_padding import GPUInlinePadding
from probtune_cuda.instructions import PAD_EINSUM
from probtune_cuda.mma import RewriteMMASync
from probtune_cuda.multi_level_tiling import GPUMultiLevelTiling
from probtune_cuda.packed_projections import PackedProjections
from probtune_cuda.postprocs import (
    RewriteCooperativeFetch,
    RewriteGPUReductionBlock,
    RewriteTensorize,
    RewriteUnboundBlock,
    VerifyGPUCode,
    VerifyRegisterTile,
)
from probtune_cuda.reindex import TRANSFORM_TO_INTRINSIC
from probtune_cuda.row_kernel import GPURowKernel
from probtune_cuda.sink_reshapes import SinkReshapes
from probtune_cuda.software_pipeline import RewriteSoftwarePipeline
from probtune_cuda.targets import make_targets
from probtune_cuda.tensor_core import TensorCoreTiling
from probtune_cuda.thread_binding import GPUAutoBind, GPUCrossThreadReduction
from probtune_cuda.unroll import GPU_AUTO_UNROLL, RewriteGPUUnroll

__all__ = [
    "CumsumProduct",
    "GPUAutoBind",
    "GPUBroadcastProducers",
    "GPUCrossThreadReduction",
    "GPUFeatures",
    "GPUInlinePadding",
    "GPUMultiLevelTiling",
    "GPURowKernel",
    "HeadProjections",
    "PackedProjections",
    "RewriteCooperativeFetch",
    "RewriteGPUReductionBlock",
    "RewriteGPUUnroll",
    "RewriteMMASync",
    "RewriteSoftwarePipeline",
    "RewriteTensorize",
    "RewriteUnboundBlock",
    "SinkReshapes",
    "TensorCoreTiling",
    "VerifyGPUCode",
    "VerifyRegisterTile",
]


@hookimpl
def probtune_register_targets(register: Callable[[Any], None]) -> None:
    for target in make_targets():
        register(target)


@hookimpl
def probtune_register_instructions(register: Callable[[Any], None]) -> None:
    register(PAD_EINSUM)
    register(TRANSFORM_TO_INTRINSIC)


@hookimpl
def probtune_register_graph_rewrites(register: Callable[[Any], None]) -> None:
    register(CumsumProduct())
    register(HeadProjections())
    register(SinkReshapes())
    register(PackedProjections())


@hookimpl
def probtune_register_space_modules(register: Callable[[Any], None]) -> None:
    register(GPUBroadcastProducers())
    register(TensorCoreTiling())
    register(GPUMultiLevelTiling())
    register(GPUInlinePadding())
    register(GPURowKernel())
    register(GPUCrossThreadReduction())
    register(GPUAutoBind())
    register(GPU_AUTO_UNROLL)


@hookimpl
def probtune_register_validators(register: Callable[[Any], None]) -> None:
    register(RewriteMMASync())
    register(RewriteCooperativeFetch())
    register(RewriteUnboundBlock())
    register(RewriteGPUUnroll())
    register(RewriteGPUReductionBlock())
    register(RewriteTensorize())
    register(RewriteSoftwarePipeline())
    register(VerifyRegisterTile())
    register(VerifyGPUCode())


@hookimpl
def probtune_register_bundle_runtimes(register: Callable[[Any], None]) -> None:
    register(CUPY_RUNTIME)


@hookimpl
def probtune_register_feature_extractors(register: Callable[[Any], None]) -> None:
    register(GPUFeatures())
