"""AVX-512 VNNI: 8-bit products summed in int32, 16 outputs x 4 terms per instruction (``vpdpbusd``).

A reduction ``C[..., j] += int32(A[..., k]) * int32(B[..., k, ..., j])``
with ``A`` unsigned and ``B`` signed 8-bit (a quantized convolution in NHWC
or matrix product) maps onto ``vpdpbusd``: 16 int32 lanes of ``j``, each
adding the dot product of four consecutive ``k`` of ``A`` (one 32-bit
broadcast) with four of ``B``, which is laid out ``[..., j // 16, k // 4, j % 16, k % 4]``.
The tiling and the layout are :mod:`probtune_x86.dot_product`'s.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tvm import s_tir

from probtune.plugin import import_parsed
from probtune_x86.dot_channels import PadDotChannels
from probtune_x86.dot_product import DotInstruction, DotPlan, DotProductTiling, RewriteDotLayout, dot_plan

__all__ = [
    "VNNI",
    "VNNI_INTRINSIC",
    "VNNI_LAYOUT_KEY",
    "VNNI_LLVM_NAME",
    "PadVNNIChannels",
    "RewriteVNNILayout",
    "VNNIDotProduct",
    "register_vnni_intrinsic",
    "vnni_plan",
]

VNNI_LLVM_NAME = "llvm.x86.avx512.vpdpbusd.512"
"""LLVM's name of ``vpdpbusd`` on zmm registers."""

VNNI_INTRINSIC = "probtune_x86.vnni_u8s8_16x4"
"""The tensor intrinsic's name in TVM's table (:func:`register_vnni_intrinsic`)."""

VNNI_LAYOUT_KEY = "probtune_x86.vnni_layout"
"""Block annotation on ``B``'s copy: the dimension of ``k`` times 16 plus the dimension of ``j``, to be blocked."""


@functools.cache
def register_vnni_intrinsic() -> str:
    """Register the intrinsic (TVM's own description; ``vpdpbusd`` as this LLVM declares it, on bytes) once."""
    from tvm.s_tir import TensorIntrin

    dot_product_16x4_u8i8i32_desc = import_parsed("tvm.s_tir.tensor_intrin.x86").dot_product_16x4_u8i8i32_desc
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def vpdpbusd(
        A: T.Buffer((4,), "uint8", offset_factor=1),  # type: ignore[valid-type]
        B: T.Buffer((16, 4), "int8", offset_factor=1),  # type: ignore[valid-type]
        C: T.Buffer((16,), "int32", offset_factor=1),  # type: ignore[valid-type]
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            a = T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "uint8x4"), dtype="int32"), 16), dtype="int8x64")
            C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(VNNI_LLVM_NAME),
                C.vload([0], dtype="int32x16"),
                a,
                B.vload([0, 0], dtype="int8x64"),
                dtype="int32x16",
            )

    if TensorIntrin.get(VNNI_INTRINSIC, allow_missing=True) is None:
        TensorIntrin.register(VNNI_INTRINSIC, dot_product_16x4_u8i8i32_desc, vpdpbusd)
    return VNNI_INTRINSIC


VNNI = DotInstruction(
    intrinsic=VNNI_INTRINSIC,
    register=register_vnni_intrinsic,
    llvm_feature="avx512vnni",
    accumulator="int32",
    a_dtype="uint8",
    b_dtype="int8",
    lanes=16,
    depth=4,
    layout_key=VNNI_LAYOUT_KEY,
)
"""``vpdpbusd`` on zmm registers: 16 int32 sums, each of 4 products of an unsigned by a signed byte."""


def vnni_plan(raw: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> DotPlan | None:
    """How the block maps onto ``vpdpbusd``, or None where it does not (:func:`probtune_x86.dot_product.dot_plan`)."""
    return dot_plan(raw, block, VNNI)


@dataclass(frozen=True)
class VNNIDotProduct(DotProductTiling):
    """Tile a u8 x s8 -> int32 reduction around ``vpdpbusd``, where the target's CPU has VNNI."""

    name: str = "vnni-dot-product"
    instruction: DotInstruction = VNNI


@dataclass(frozen=True)
class RewriteVNNILayout(RewriteDotLayout):
    """Lay each annotated copy of ``B`` out in the blocks ``vpdpbusd`` reads: ``[..., j // 16, k // 4, j % 16, k % 4]``."""

    name: str = "rewrite-vnni-layout"
    instruction: DotInstruction = VNNI


@dataclass(frozen=True)
class PadVNNIChannels(PadDotChannels):
    """Graph rewrite ``pad-vnni-channels``: integer convolutions' channels padded to ``vpdpbusd``'s 16 x 4 blocks
    where that at most doubles their work (the instruction does 4 times the products of a 16-lane int32
    multiply-add): 24 output channels to 32 and 3 input ones to 4, but 1 not to 4."""

    name: str = "pad-vnni-channels"
    instruction: DotInstruction = VNNI
    max_extra_work: float = 1.0
