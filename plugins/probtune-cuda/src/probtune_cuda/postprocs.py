"""GPU validators, run on a replayed program: mostly TVM MetaSchedule's CUDA postprocessors.

Each finishes the program as MetaSchedule does for CUDA (spreading the
shared-memory copies over the threads, binding blocks no module bound,
splitting reduction initialisation out, replacing marked tiles by tensor
intrinsics) or checks it before it costs a
build: ``verify-register-tile`` rejects threads with more accumulators than
registers hold, ``verify-gpu-code`` lowers the program and rejects one whose
threads, shared memory or vector accesses exceed the target's per-block limits.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms

from probtune.plugin import SpaceContext, last_line, nested_sblocks
from probtune_cuda.intrinsics import TENSORIZE_KEY, WARP_EXECUTION_KEY, load_tensor_intrinsics
from probtune_cuda.limits import MAX_VECTOR_BYTES, block_limit
from probtune_cuda.lowering import lower_for_check
from probtune_cuda.multi_level_tiling import COOPERATIVE_FETCH_KEY, MAX_ACCUMULATORS, oversized_register_tiles

__all__ = [
    "RewriteCooperativeFetch",
    "RewriteGPUReductionBlock",
    "RewriteTensorize",
    "RewriteUnboundBlock",
    "VerifyGPUCode",
    "VerifyRegisterTile",
]

_TVM_FETCH_KEY = "meta_schedule.cooperative_fetch"  # what TVM's RewriteCooperativeFetch reads


@functools.lru_cache(maxsize=64)
def _postproc(kind: str, target_json: str) -> Any:
    """TVM's postprocessor ``kind``, initialised for the target (it reads the thread and memory limits from it)."""
    load_tensor_intrinsics()  # before the tune context, which imports them too, at full cost
    postproc = getattr(ms.postproc, kind)()
    postproc._initialize_with_tune_context(ms.TuneContext(target=tvm.target.Target(json.loads(target_json))))
    return postproc


def _apply(kind: str, sch: s_tir.Schedule, ctx: SpaceContext) -> bool:
    return bool(_postproc(kind, json.dumps(dict(ctx.target.tvm_target), sort_keys=True)).apply(sch))


@dataclass(frozen=True)
class RewriteCooperativeFetch:
    """Fuse each shared-memory copy's loops and split them over the thread block's threads, with its vector width."""

    name: str = "rewrite-cooperative-fetch"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        for block in nested_sblocks(sch):
            annotations = sch.get(block).annotations
            width = annotations.get(COOPERATIVE_FETCH_KEY)
            if width is not None:
                sch.unannotate(block, COOPERATIVE_FETCH_KEY)
                sch.annotate(block, _TVM_FETCH_KEY, tvm.tirx.IntImm("int32", int(width)))
            if WARP_EXECUTION_KEY in annotations:  # TVM reads it as an integer expression: lanes are threadIdx.x
                sch.annotate(block, WARP_EXECUTION_KEY, tvm.tirx.IntImm("int32", int(annotations[WARP_EXECUTION_KEY])))
        if not _apply("RewriteCooperativeFetch", sch, ctx):
            return "a shared-memory copy cannot be spread over the threads"
        return None


@dataclass(frozen=True)
class RewriteUnboundBlock:
    """Bind every block no module bound (padding, elementwise tails) to blocks and threads of the target's size."""

    name: str = "rewrite-unbound-block"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        return None if _apply("RewriteUnboundBlock", sch, ctx) else "a block cannot be bound to GPU threads"


@dataclass(frozen=True)
class RewriteGPUReductionBlock:
    """Split each reduction's initialisation into its own block, under the loops that need it."""

    name: str = "rewrite-gpu-reduction-block"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        return None if _apply("RewriteReductionBlock", sch, ctx) else "a reduction's initialisation cannot be split out"


@dataclass(frozen=True)
class RewriteTensorize:
    """Replace each block a module marked for a tensor intrinsic (WMMA tiles, fills, loads, stores) by that intrinsic."""

    name: str = "rewrite-tensorize"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        if not any(TENSORIZE_KEY in sch.get(block).annotations for block in nested_sblocks(sch)):
            return None
        load_tensor_intrinsics()
        return None if _apply("RewriteTensorize", sch, ctx) else "a block does not match its tensor intrinsic"


@dataclass(frozen=True)
class VerifyGPUCode:
    """Reject a program whose threads per block, shared memory or vector accesses exceed the target's limits.

    MetaSchedule's ``VerifyGPUCode``: the program lowered as it is built
    (:func:`probtune_cuda.lowering.lower_for_check`), then TVM's check of its limits.
    """

    name: str = "verify-gpu-code"
    max_vthread: int = 8
    max_vector_bytes: int = MAX_VECTOR_BYTES

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        limits = ctx.target.tvm_target
        try:
            lowered = lower_for_check(sch.mod, dict(limits))
        except Exception as exc:  # noqa: BLE001 - TVM reports a program it cannot lower with whatever error it has
            return f"TVM cannot lower it: {last_line(exc)}"
        constraints = {
            "max_shared_memory_per_block": block_limit(limits, "max_shared_memory_per_block"),
            "max_threads_per_block": block_limit(limits, "max_threads_per_block"),
            "max_vthread": self.max_vthread,
            "max_vector_bytes": self.max_vector_bytes,
        }
        if s_tir.analysis.verify_gpu_code(lowered["main"], constraints):
            return None
        return (
            f"exceeds the GPU's per-block limits ({constraints['max_threads_per_block']} threads, "
            f"{constraints['max_shared_memory_per_block']} bytes of shared memory) or its vector width"
        )


@dataclass(frozen=True)
class VerifyRegisterTile:
    """Reject a tiling whose threads each accumulate more values than registers can hold.

    An accumulator array larger than ``max_accumulators`` goes to local
    memory, which the cubin lint would refuse after seconds of compiling;
    this check costs a walk of the loops.
    """

    name: str = "verify-register-tile"
    max_accumulators: int = MAX_ACCUMULATORS

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        oversized = oversized_register_tiles(sch, self.max_accumulators)
        if not oversized:
            return None
        name, count = oversized[0]
        return f"block {name} accumulates {count} values per thread (at most {self.max_accumulators} fit in registers)"
