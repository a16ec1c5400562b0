"""Integer convolutions' channels padded to VNNI's blocks: 16 output channels, 4 input channels deep.

``vnni-dot-product`` takes a convolution only where its output channels are
whole multiples of ``vpdpbusd``'s 16 lanes and its input channels of its
4-deep sums; any other (a stem's 3 input channels, a layer's 24 output ones)
is summed by plain int32 vectors, several times slower. ``pad-vnni-channels``
pads those channels with zero weights, as ``pad-channels`` pads float
convolutions' to whole vectors, and carries the crop past the requantization
that follows into the next convolution (:mod:`probtune_cpu.pad_channels`);
input channels the model's tensor lacks are added as zeros. Padding is taken
where it at most doubles a convolution's work: the instruction does 4 times
the products of a 16-lane int32 multiply-add.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax

from probtune.plugin import TargetSpec
from probtune_cpu.llvm_features import llvm_target_has
from probtune_cpu.pad_channels import ChannelPolicy, PadChannels
from probtune_x86.vnni import VNNI

__all__ = ["MAX_VNNI_EXTRA_WORK", "PadVNNIChannels", "VNNIChannels", "vnni_channels"]

MAX_VNNI_EXTRA_WORK = 1.0
"""Pad only where the added channels at most double the work: 24 to 32 and 3 to 4 are padded, 1 to 4 is not."""


def vnni_channels(channels: int, block: int) -> int:
    """``channels`` rounded up to a multiple of ``block`` where that adds at most :data:`MAX_VNNI_EXTRA_WORK`, else as it is."""
    padded = -(-channels // block) * block
    return padded if padded - channels <= channels * MAX_VNNI_EXTRA_WORK else channels


@dataclass(frozen=True)
class VNNIChannels(ChannelPolicy):
    """uint8 x int8 convolutions summed in int32: output channels to 16-lane blocks, input channels to 4-deep ones."""

    def pads(self, conv: relax.Call) -> bool:
        data, weight = conv.args
        return (str(data.ty.dtype), str(weight.ty.dtype), str(conv.ty.dtype)) == ("uint8", "int8", "int32")

    def output_channels(self, channels: int) -> int:
        return vnni_channels(channels, VNNI.lanes)

    def input_channels(self, channels: int) -> int:
        return vnni_channels(channels, VNNI.depth)

    def carries(self, call: relax.Call) -> bool:
        return True  # an integer tensor is always finite; a float one from padded sums is finite too


class PadVNNIChannels(PadChannels):
    """Graph rewrite ``pad-vnni-channels`` (module docstring); on a target without VNNI it changes nothing."""

    name = "pad-vnni-channels"

    def policy(self, target: TargetSpec) -> ChannelPolicy:
        return VNNIChannels()

    def rewrite(self, mod: tvm.IRModule, target: TargetSpec) -> tuple[tvm.IRModule, int]:
        if not llvm_target_has(dict(target.tvm_target), "avx512vnni"):
            return mod, 0
        return super().rewrite(mod, target)
