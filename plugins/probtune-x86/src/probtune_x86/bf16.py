"""AVX512-BF16: bfloat16 products summed in float32, 16 outputs x 2 terms per instruction (``vdpbf16ps``).

A reduction ``C[..., j] += float32(A[..., k]) * float32(B[..., k, ..., j])``
with ``A`` and ``B`` bfloat16 (a convolution or matrix product of a model
compiled in bf16) maps onto ``vdpbf16ps``: 16 float32 lanes of ``j``, each
adding the dot product of two consecutive ``k`` of ``A`` (one 32-bit
broadcast) with two of ``B``, which is laid out ``[..., j // 16, k // 2, j % 16, k % 2]``.
The tiling and the layout are :mod:`probtune_x86.dot_product`'s.

TVM cannot hand the instruction its operands as values: its bfloat16
legalization retypes bfloat16 expressions as float32 and stores them as
uint16, while LLVM declares ``vdpbf16ps`` on bfloat vectors. So the
intrinsic passes the operands' addresses to a three-line LLVM function,
linked into the program (TVM's ``pragma_import_llvm``) and inlined, that
loads them as bfloat vectors.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from probtune_x86.dot_channels import PadDotChannels
from probtune_x86.dot_product import DotInstruction, DotProductTiling, RewriteDotLayout

__all__ = [
    "BF16",
    "BF16_CALL",
    "BF16_INTRINSIC",
    "BF16DotProduct",
    "PadBF16Channels",
    "RewriteBF16Layout",
    "register_bf16_intrinsic",
]

BF16_INTRINSIC = "probtune_x86.bf16_16x2"
"""The tensor intrinsic's name in TVM's table (:func:`register_bf16_intrinsic`)."""

BF16_LAYOUT_KEY = "probtune_x86.bf16_layout"
"""Block annotation on ``B``'s copy: the dimension of ``k`` times 16 plus the dimension of ``j``, to be blocked."""

BF16_CALL = "probtune_x86_dpbf16ps"
"""The linked LLVM function the intrinsic calls: the 16 sums, A's address (a pair), B's (16 pairs)."""

_LLVM_IR = f"""
define <16 x float> @{BF16_CALL}(<16 x float> %c, ptr %a, ptr %b) {{
  %pair = load i32, ptr %a, align 2
  %first = insertelement <16 x i32> poison, i32 %pair, i64 0
  %pairs = shufflevector <16 x i32> %first, <16 x i32> poison, <16 x i32> zeroinitializer
  %av = bitcast <16 x i32> %pairs to <32 x bfloat>
  %bv = load <32 x bfloat>, ptr %b, align 2
  %sums = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %c, <32 x bfloat> %av, <32 x bfloat> %bv)
  ret <16 x float> %sums
}}
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
"""


@functools.cache
def register_bf16_intrinsic() -> str:
    """Register the intrinsic (16 lanes x 2 terms; ``vdpbf16ps`` through :data:`BF16_CALL`) once."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def description(
        A: T.Buffer((2,), "bfloat16", offset_factor=1),  # type: ignore[valid-type]
        B: T.Buffer((16, 2), "bfloat16", offset_factor=1),  # type: ignore[valid-type]
        C: T.Buffer((16,), "float32", offset_factor=1),  # type: ignore[valid-type]
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:2], B[0:16, 0:2])
            T.writes(C[0:16])
            for i, k in T.grid(16, 2):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + T.Cast("float32", A[vk]) * T.Cast("float32", B[vi, vk])

    @T.prim_func(s_tir=True)
    def vdpbf16ps(
        A: T.Buffer((2,), "bfloat16", offset_factor=1),  # type: ignore[valid-type]
        B: T.Buffer((16, 2), "bfloat16", offset_factor=1),  # type: ignore[valid-type]
        C: T.Buffer((16,), "float32", offset_factor=1),  # type: ignore[valid-type]
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:2], B[0:16, 0:2])
            T.writes(C[0:16])
            with T.attr(T.int32(0), "pragma_import_llvm", _LLVM_IR):
                # typed as the uint16 that bfloat16 is stored as by the time the pointers are checked
                C[T.ramp(T.int32(0), 1, 16)] = T.call_extern(
                    "float32x16",
                    BF16_CALL,
                    C.vload([0], dtype="float32x16"),
                    T.tvm_access_ptr(T.type_annotation("uint16"), A.data, A.elem_offset, 2, 1),
                    T.tvm_access_ptr(T.type_annotation("uint16"), B.data, B.elem_offset, 32, 1),
                )

    if TensorIntrin.get(BF16_INTRINSIC, allow_missing=True) is None:
        TensorIntrin.register(BF16_INTRINSIC, description, vdpbf16ps)
    return BF16_INTRINSIC


BF16 = DotInstruction(
    intrinsic=BF16_INTRINSIC,
    register=register_bf16_intrinsic,
    llvm_feature="avx512bf16",
    accumulator="float32",
    a_dtype="bfloat16",
    b_dtype="bfloat16",
    lanes=16,
    depth=2,
    layout_key=BF16_LAYOUT_KEY,
)
"""``vdpbf16ps`` on zmm registers: 16 float32 sums, each of 2 products of bfloat16 pairs."""


@dataclass(frozen=True)
class BF16DotProduct(DotProductTiling):
    """Tile a bf16 x bf16 -> float32 reduction around ``vdpbf16ps``, where the target's CPU has AVX512-BF16."""

    name: str = "bf16-dot-product"
    instruction: DotInstruction = BF16


@dataclass(frozen=True)
class RewriteBF16Layout(RewriteDotLayout):
    """Lay each annotated copy of ``B`` out in the blocks ``vdpbf16ps`` reads: ``[..., j // 16, k // 2, j % 16, k % 2]``."""

    name: str = "rewrite-bf16-layout"
    instruction: DotInstruction = BF16


@dataclass(frozen=True)
class PadBF16Channels(PadDotChannels):
    """Graph rewrite ``pad-bf16-channels``: bf16 convolutions' channels padded to ``vdpbf16ps``'s 16 x 2 blocks where
    that adds at most half their work (the instruction does twice the products of a 16-lane float32 fused
    multiply-add): 24 output channels to 32 and 3 input ones to 4, but 8 not to 16."""

    name: str = "pad-bf16-channels"
    instruction: DotInstruction = BF16
    max_extra_work: float = 0.5
