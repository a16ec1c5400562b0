"""The GPU columns of a cost model's features: how a scheduled CUDA program uses threads, memories and tensor cores.

Registered as the feature extractor ``gpu`` (``probtune_register_feature_extractors``):
a cost model appends these columns to its own, as ``gpu.<column>``. Each is
a raw non-negative quantity of the scheduled program, read without lowering,
all zero for a program that binds no GPU axis (a CPU program):

``blocks``, ``threads`` and ``vthreads``: the largest extent bound to
``blockIdx``, ``threadIdx`` and ``vthread`` axes, multiplied over each
kind's axes, over the kernels; ``shared_bytes``, ``local_bytes`` and
``fragment_bytes``: buffers the blocks allocate in shared memory, registers
and tensor-core fragments (WMMA's, or ``warp`` buffers); the 16x16 tiles the
tensor-core intrinsics the program calls work on, each times the loop
iterations around it: ``mma_calls``, ``fragment_loads``, ``fragment_stores``
(WMMA's, or ``ldmatrix`` and ``mma.sync``, whose fragments are stored by
plain stores; a tensor-core program's multiply-accumulate is such a call,
not a store); ``pipeline_stages`` (the most stages of a software-pipelined
loop; 0 if none) and ``async_copies`` (1 if a pipeline copies asynchronously).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import s_tir, tirx

from probtune.plugin import as_list, child_stmts, thread_tag

__all__ = ["GPU_FEATURE_NAMES", "GPUFeatures", "gpu_features"]

GPU_FEATURE_NAMES: tuple[str, ...] = (
    "blocks", "threads", "vthreads", "shared_bytes", "local_bytes", "fragment_bytes",
    "mma_calls", "fragment_loads", "fragment_stores", "pipeline_stages", "async_copies",
)

_GPU_COLUMN = {name: index for index, name in enumerate(GPU_FEATURE_NAMES)}
_TENSOR_CORE_CALLS = {  # intrinsic (without its namespace) -> its column, and the 16x16 tiles one call does
    "tvm_mma_sync": (_GPU_COLUMN["mma_calls"], 1.0), "tvm_bmma_sync": (_GPU_COLUMN["mma_calls"], 1.0),
    "mma": (_GPU_COLUMN["mma_calls"], 0.5),  # PTX mma.sync: a 16x8x16 half tile
    "tvm_load_matrix_sync": (_GPU_COLUMN["fragment_loads"], 1.0), "ldmatrix": (_GPU_COLUMN["fragment_loads"], 1.0),
    "tvm_store_matrix_sync": (_GPU_COLUMN["fragment_stores"], 1.0), "mma_store_legacy": (_GPU_COLUMN["fragment_stores"], 1.0),
}
_THREAD_KINDS = {"blockIdx": _GPU_COLUMN["blocks"], "threadIdx": _GPU_COLUMN["threads"], "vthread": _GPU_COLUMN["vthreads"]}
_SCOPE_KINDS = {"shared": _GPU_COLUMN["shared_bytes"], "shared.dyn": _GPU_COLUMN["shared_bytes"], "local": _GPU_COLUMN["local_bytes"]}


@dataclass(frozen=True)
class GPUFeatures:
    """The feature extractor ``gpu``: :data:`GPU_FEATURE_NAMES` of a scheduled program. A dataclass, so that it pickles."""

    name: str = "gpu"
    columns: tuple[str, ...] = GPU_FEATURE_NAMES

    def extract(self, func: tirx.PrimFunc) -> np.ndarray:
        """The raw columns of ``func``; zeros without a second walk for a program that launches no kernel."""
        if not _launches_kernels(func):
            return np.zeros(len(GPU_FEATURE_NAMES), dtype=np.float64)
        return gpu_features(func)


def _int(expr: tvm.ir.expr.Expr, default: int = 1) -> int:
    """The value of a constant integer; ``default`` for a symbolic one."""
    return int(expr.value) if type(expr) is tirx.IntImm else default


def _launches_kernels(func: tirx.PrimFunc) -> bool:
    """Whether a loop nest at the root is bound to a GPU axis (a GPU program binds every nest's outermost loop)."""
    body = func.body.block.body if isinstance(func.body, s_tir.SBlockRealize) else func.body
    nests = child_stmts(body) if isinstance(body, tirx.SeqStmt) else [body]
    return any(isinstance(nest, tirx.For) and nest.thread_binding is not None for nest in nests)


def _pipeline_features(loop: tirx.For, raw: np.ndarray) -> None:
    """Raise the pipeline columns to what ``loop``'s software-pipeline annotations (TVM's) say."""
    stages = loop.annotations.get("software_pipeline_stage")
    if stages is not None:
        raw[_GPU_COLUMN["pipeline_stages"]] = max(raw[_GPU_COLUMN["pipeline_stages"]], 1 + max(int(s) for s in stages))
    if "software_pipeline_async_stages" in loop.annotations:
        raw[_GPU_COLUMN["async_copies"]] = 1


def gpu_features(func: tirx.PrimFunc) -> np.ndarray:
    """The raw ``GPU_FEATURE_NAMES`` quantities of a scheduled program (all zero without GPU bindings).

    Tensor-core calls are counted per thread: times the loops around them that
    no block or thread axis runs in parallel (virtual threads run in turn).
    """
    raw = np.zeros(len(GPU_FEATURE_NAMES), dtype=np.float64)
    kernels: list[dict[str, int]] = []  # per kernel (a root-level nest with bound loops): thread tag -> extent
    stack: list[tuple[tirx.Stmt, float, dict[str, int] | None]] = [(func.body, 1.0, None)]
    while stack:
        node, iterations, kernel = stack.pop()
        if isinstance(node, tirx.For):
            tag = thread_tag(node)
            if tag and kernel is None:
                kernel = {}
                kernels.append(kernel)
            if tag and kernel is not None:
                kernel[tag] = max(kernel.get(tag, 1), _int(node.extent))
            _pipeline_features(node, raw)
            parallel = tag.startswith(("blockIdx", "threadIdx"))
            stack.append((node.body, iterations * (1 if parallel else _int(node.extent)), kernel))
            continue
        if isinstance(node, s_tir.SBlockRealize):
            for buffer in as_list(node.block.alloc_buffers):
                scope = str(buffer.scope())
                index = _GPU_COLUMN["fragment_bytes"] if scope.startswith("wmma.") or scope == "warp" else _SCOPE_KINDS.get(scope)
                if index is not None:
                    raw[index] += float(np.prod([max(_int(d), 1) for d in as_list(buffer.shape)])) * buffer.dtype.itemsize
        elif isinstance(node, tirx.Evaluate) and isinstance(node.value, tvm.ir.Call):
            call = _TENSOR_CORE_CALLS.get(str(getattr(node.value.op, "name", "")).rpartition(".")[2])
            if call is not None:
                raw[call[0]] += iterations * call[1]
        stack.extend((child, iterations, kernel) for child in reversed(child_stmts(node)))
    for kernel in kernels:
        for kind, index in _THREAD_KINDS.items():
            extent = math.prod(extent for tag, extent in kernel.items() if tag.startswith(kind))
            raw[index] = max(raw[index], extent)
    return raw
