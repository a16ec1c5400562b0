"""Convolutions' channels padded to a dot-product instruction's blocks: its lanes of output channels, its depth of input ones.

``vnni-dot-product`` and ``bf16-dot-product`` take a convolution only where
its output channels are whole multiples of the instruction's 16 lanes and its
input channels of its sums' depth (VNNI's 4, AVX512-BF16's 2); any other (a
stem's 3 input channels, a layer's 24 output ones) is summed by plain vectors,
several times slower. ``pad-vnni-channels`` and ``pad-bf16-channels`` pad
those channels with zero weights, as ``pad-channels`` pads float
convolutions' to whole vectors, and carry the crop past the operators that
follow into the next convolution (:mod:`probtune_cpu.pad_channels`); input
channels the model's tensor lacks are added as zeros. Padding is taken where
the added work is at most what the instruction gains over plain vectors
(:attr:`PadDotChannels.max_extra_work`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import relax

from probtune.plugin import TargetSpec
from probtune_cpu.llvm_features import llvm_target_has
from probtune_cpu.pad_channels import ChannelPolicy, PadChannels
from probtune_x86.dot_product import DotInstruction

__all__ = ["DotChannels", "PadDotChannels", "dot_channels"]


def dot_channels(channels: int, block: int, max_extra_work: float) -> int:
    """``channels`` rounded up to a multiple of ``block`` where that adds at most ``max_extra_work`` of them, else as
    it is."""
    padded = -(-channels // block) * block
    return padded if padded - channels <= channels * max_extra_work else channels


@dataclass(frozen=True)
class DotChannels(ChannelPolicy):
    """Convolutions of the instruction's operand types: output channels to its lanes, input channels to its depth."""

    instruction: DotInstruction
    max_extra_work: float

    def pads(self, conv: relax.Call) -> bool:
        data, weight = conv.args
        op = self.instruction
        return (str(data.ty.dtype), str(weight.ty.dtype), str(conv.ty.dtype)) == (op.a_dtype, op.b_dtype, op.accumulator)

    def output_channels(self, channels: int) -> int:
        return dot_channels(channels, self.instruction.lanes, self.max_extra_work)

    def input_channels(self, channels: int) -> int:
        return dot_channels(channels, self.instruction.depth, self.max_extra_work)

    def carries(self, call: relax.Call) -> bool:
        return True  # the padded channels hold sums of zero weights: finite, as is what follows from them


@dataclass(frozen=True)
class PadDotChannels(PadChannels):
    """Graph rewrite padding the channels of ``instruction``'s convolutions (module docstring); on a target whose CPU
    lacks the instruction it changes nothing."""

    name: str = field()  # required: not PadChannels' own name
    instruction: DotInstruction
    max_extra_work: float  # the added share of a convolution's work that padding may cost

    def policy(self, target: TargetSpec) -> ChannelPolicy:
        return DotChannels(self.instruction, self.max_extra_work)

    def rewrite(self, mod: tvm.IRModule, target: TargetSpec) -> tuple[tvm.IRModule, int]:
        if not llvm_target_has(dict(target.tvm_target), self.instruction.llvm_feature):
            return mod, 0
        return super().rewrite(mod, target)
