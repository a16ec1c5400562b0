"""NVIDIA GPU targets with their limits written out, as TVM's context checks need them.

A bare ``{"kind": "cuda"}`` target carries no ``max_threads_per_block``, and
MetaSchedule's own tuning context refuses it; each target here names the
architecture and the per-block limits its programs are checked against. The
shared memory limit is the block's opt-in maximum: the spaces allocate shared
memory at launch (``shared.dyn``), which a block may take beyond the 48 KB of
a static allocation.
"""

from __future__ import annotations

from typing import Any

from probtune.plugin import TargetSpec
from probtune_cuda.codegen import NVRTCCompiler
from probtune_cuda.device import CUDARequirement
from probtune_cuda.limits import MAX_VECTOR_BYTES

__all__ = [
    "DEFAULT_GRAPH_REWRITES",
    "DEFAULT_LAYOUTS",
    "DEFAULT_MODULES",
    "DEFAULT_MUTATORS",
    "DEFAULT_VALIDATORS",
    "cuda_target",
    "make_targets",
]

DEFAULT_MODULES = (
    "auto-inline",
    "gpu-broadcast-producers",
    "tensor-core-tiling",
    "gpu-multi-level-tiling",
    "gpu-inline-padding",
    "gpu-row-kernel",
    "gpu-cross-thread-reduction",
    "gpu-auto-bind",
    "gpu-auto-unroll",
)
"""Inline elementwise blocks first (so tiling sees a single consumer); a block's small broadcast producers go into its
kernel before a tiling takes them; tensor cores take the blocks they can compute,
the thread tiling the other matmul-like ones; padding left apart is read where it is needed; a block whose producers
reduce rows is computed with them, a row per thread block; other row reductions go across threads and the remaining
blocks are spread over threads (a reduction in each thread with its elementwise consumers); then sample unrolling."""

DEFAULT_VALIDATORS = (
    "rewrite-mma-sync",
    "rewrite-cooperative-fetch",
    "rewrite-unbound-block",
    "rewrite-gpu-unroll",
    "rewrite-gpu-reduction-block",
    "rewrite-tensorize",
    "rewrite-software-pipeline",
    "verify-register-tile",
    "verify-gpu-code",
)
"""Finish the program (the tensor-core tiles sampled for mma.sync moved to it, shared-memory copies spread over the
threads, every block bound, unrolling, tensor intrinsics in place of the tiles marked for them, the sampled software
pipelines), then check it fits."""

DEFAULT_LAYOUTS = {"relax.nn.conv2d": ("NHWC", "HWIO")}
"""A model's convolutions run channels-last: the channels are a matmul's reduction, contiguous for the tensor cores'
operand tiles (NCHW would gather them with strided scalar copies)."""

DEFAULT_GRAPH_REWRITES = ("cumsum-product", "head-projections", "sink-reshapes", "packed-projections")
"""Cumulative sums become products (a model bundle runs no library scan); attention's projections write each head's
queries, keys and values where attention reads them (no transposes); and a model's reshapes are done after the
elementwise operators that follow them, so that those run in the epilogue of the matrix product before (a
transformer's bias, residual add and GELU around its 2-D products)."""

DEFAULT_MUTATORS = {"tile_size": 0.9, "categorical": 0.1}
"""Mutators by probability, after TVM MetaSchedule's CUDA defaults (tile sizes 0.9; unroll and fetch widths share 0.1)."""


def cuda_target(
    name: str, description: str, arch: str, max_shared_memory_per_block: int, multiprocessors: int = 0, **limits: Any
) -> TargetSpec:
    """A CUDA target for ``arch`` (e.g. ``sm_80``) with explicit per-block limits and the GPU space; ``multiprocessors``
    (attribute of that name; 0: unknown) tells the space how many thread blocks fill the GPU."""
    tvm_target = {
        "kind": "cuda",
        "arch": arch,
        "max_threads_per_block": 1024,
        "max_num_threads": 1024,
        "thread_warp_size": 32,
        "registers_per_block": 65536,
        "max_shared_memory_per_block": max_shared_memory_per_block,
        **limits,
    }
    return TargetSpec(
        name=name,
        description=description,
        tvm_target=tvm_target,
        modules=DEFAULT_MODULES,
        validators=DEFAULT_VALIDATORS,
        mutators=DEFAULT_MUTATORS,
        layouts=DEFAULT_LAYOUTS,
        graph_rewrites=DEFAULT_GRAPH_REWRITES,
        concat_in_place=True,
        view_alignment=MAX_VECTOR_BYTES,
        split_concatenations=False,
        copies_in_product_reads=True,
        attrs={"multiprocessors": multiprocessors},
        compiler=NVRTCCompiler(),
        runs_here=CUDARequirement(),
    )


def make_targets() -> list[TargetSpec]:
    return [
        cuda_target("cuda-sm90", "NVIDIA Hopper (H100/H200 class), sm_90, 227 KB shared memory per block", "sm_90", 232448, 132),
        cuda_target("cuda-sm80", "NVIDIA Ampere (A100 class), sm_80, 163 KB shared memory per block", "sm_80", 166912, 108),
    ]
