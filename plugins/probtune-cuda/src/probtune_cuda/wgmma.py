"""Hopper's warpgroup matrix multiply (``wgmma.mma_async``) as TVM 0.27 emits it, and a float16 matmul kernel on it.

TVM 0.27's CUDA back end emits ``wgmma`` from ordinary TIR (``T.ptx.wgmma...``
with a shared-memory descriptor from ``T.cuda.wgmma.encode_matrix_descriptor``),
but none of its schedule primitives produce it, so it is not yet a module of
the tuned space. This module holds what such a module needs, in one kernel
built on it: the architecture (``sm_90a``; ptxas refuses ``wgmma`` for
``sm_90``), the K-major unswizzled shared-memory layout the descriptor reads
(``[k // 8, row, k % 8]``: 8 x 8 core matrices of 128 contiguous bytes), and
which accumulator register of which of the warpgroup's 128 threads holds which
output (:func:`accumulator_element`). :func:`wgmma_matmul` computes
``C = A @ B.T`` (``A`` [m, k] and ``B`` [n, k] float16, ``C`` float32), one
64 x 64 tile per warpgroup, 16 deep per instruction; bench/gpu_wgmma.py checks
its outputs on a Hopper GPU.
"""

from __future__ import annotations

from typing import Any

import tvm

__all__ = ["TILE", "WARPGROUP", "WGMMA_ARCH", "accumulator_element", "wgmma_matmul", "wgmma_tvm_target"]

WGMMA_ARCH = "sm_90a"
"""The architecture ``wgmma`` needs: Hopper's arch-specific features (NVRTC's ``-arch``)."""

WARPGROUP = 128
"""Threads that issue one ``wgmma`` together: four warps."""

TILE = (64, 64, 16)
"""The instruction's m x n x k: 64 rows, 64 columns of float32 sums, 16 products deep."""


def wgmma_tvm_target() -> dict[str, Any]:
    """The Hopper target's TVM target (``cuda-sm90``'s limits) with the architecture ``wgmma`` needs."""
    from probtune_cuda.targets import make_targets

    hopper = next(target for target in make_targets() if target.name == "cuda-sm90")
    return {**hopper.tvm_target, "arch": WGMMA_ARCH}


def accumulator_element(thread: Any, register: int) -> tuple[Any, Any]:
    """The (row, column) of the 64 x 64 tile that accumulator ``register`` of warpgroup ``thread`` holds.

    mma.m16n8's C fragment, repeated over 8-column blocks and one 16-row stripe per warp: register ``4j + 2h + c``
    of thread ``t`` holds row ``16 (t // 32) + (t % 32) // 4 + 8h``, column ``8j + 2 (t % 4) + c``.
    """
    block, half, column = register // 4, register % 4 // 2, register % 2
    return 16 * (thread // 32) + thread % 32 // 4 + 8 * half, 8 * block + 2 * (thread % 4) + column


def wgmma_matmul(m: int, n: int, k: int) -> tvm.IRModule:
    """``C[m, n] = A[m, k] @ B[n, k].T`` in float32 sums of float16 products on ``wgmma`` (module docstring).

    ``m`` and ``n`` whole 64-tiles, ``k`` whole 16-steps; each step copies its A and B slices into shared memory in the
    descriptor's layout, then one instruction adds their products.
    """
    from tvm.script import tirx as T

    tm, tn, tk = TILE
    if m % tm or n % tn or k % tk:
        raise ValueError(f"wgmma_matmul needs m, n multiples of {tm} and k of {tk}, not {m}, {n}, {k}")
    registers = tm * tn // WARPGROUP
    per_thread = tm * tk // WARPGROUP  # elements of each operand's slice one thread copies
    # the descriptors' offsets in 16-byte units: between the tile's two 8-deep halves of k, and between 8-row groups
    a_halves, b_halves, rows_8 = tm * 8 * 2 // 16, tn * 8 * 2 // 16, 8 * 8 * 2 // 16
    mma = T.ptx[f"wgmma.mma_async.sync.aligned.m{tm}n{tn}k{tk}.f32.f16.f16"]

    def multiply(acc: Any, a: Any, b: Any) -> Any:
        return mma(*[acc[r] for r in range(registers)], a, b, True, 1, 1, 0, 0)

    def row(tx: Any, i: int) -> Any:
        return (tx * per_thread + i) // tk

    def col(tx: Any, i: int) -> Any:
        return (tx * per_thread + i) % tk

    @T.prim_func
    def main(A: T.Buffer((m, k), "float16"), B: T.Buffer((n, k), "float16"), C: T.Buffer((m, n), "float32")) -> None:  # type: ignore[valid-type]
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        bx = T.launch_thread("blockIdx.x", m // tm)
        by = T.launch_thread("blockIdx.y", n // tn)
        tx = T.launch_thread("threadIdx.x", WARPGROUP)
        a_tile = T.alloc_buffer((2, tm, 8), "float16", scope="shared", align=128)
        b_tile = T.alloc_buffer((2, tn, 8), "float16", scope="shared", align=128)
        acc = T.alloc_buffer((registers,), "float32", scope="local")
        a_desc = T.alloc_buffer((1,), "uint64", scope="local")
        b_desc = T.alloc_buffer((1,), "uint64", scope="local")
        for r in range(registers):
            acc[r] = T.float32(0)
        for step in range(k // tk):
            for i in range(per_thread):
                a_tile[col(tx, i) // 8, row(tx, i), col(tx, i) % 8] = A[bx * tm + row(tx, i), step * tk + col(tx, i)]
                b_tile[col(tx, i) // 8, row(tx, i), col(tx, i) % 8] = B[by * tn + row(tx, i), step * tk + col(tx, i)]
            T.ptx.fence.proxy.async_.shared__cta()  # the generic proxy's stores, seen by wgmma's async proxy
            T.tvm_storage_sync("shared")
            T.cuda.wgmma.encode_matrix_descriptor(T.address_of(a_desc[0]), T.address_of(a_tile[0, 0, 0]), a_halves, rows_8, 0)
            T.cuda.wgmma.encode_matrix_descriptor(T.address_of(b_desc[0]), T.address_of(b_tile[0, 0, 0]), b_halves, rows_8, 0)
            T.ptx.wgmma.fence.sync.aligned()
            multiply(acc, a_desc[0], b_desc[0])
            T.ptx.wgmma.commit_group.sync.aligned()
            T.ptx.wgmma.wait_group.sync.aligned(0)
            T.tvm_storage_sync("shared")  # the tiles are read before the next step overwrites them
        for r in range(registers):
            C[bx * tm + accumulator_element(tx, r)[0], by * tn + accumulator_element(tx, r)[1]] = acc[r]

    return tvm.IRModule({"main": main})
