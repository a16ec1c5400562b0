"""CPU design-space modules and validators for probtune."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from probtune.plugin import AutoUnroll, hookimpl
from probtune_cpu.add_rfactor import AddRFactor
from probtune_cpu.auto_inline import AutoInline
from probtune_cpu.multi_level_tiling import MultiLevelTiling, RewritePackedLayout, RewriteWriteBackLocation
from probtune_cpu.output_reuse import RewriteOutputReuse
from probtune_cpu.pad_channels import PadChannels
from probtune_cpu.padded_taps import PaddedTaps
from probtune_cpu.parallel_vectorize import (
    ParallelVectorize,
    RewriteParallelVectorizeUnroll,
    RewriteReductionBlock,
    RewriteSpatialInnermost,
)
from probtune_cpu.polynomial_exp import RewriteExpPolynomial
from probtune_cpu.random_compute_location import RandomComputeLocation
from probtune_cpu.reciprocal_division import RewriteInvariantDivision
from probtune_cpu.tensorize import RewriteCPUTensorize
from probtune_cpu.transpose_tiling import TransposeTiling
from probtune_cpu.validators import (
    VerifyNoRecompute,
    VerifyParallel,
    VerifyStaticLoops,
    VerifyUnrollSize,
    VerifyVectorize,
)
from probtune_cpu.vector_math import RewriteVectorMath
from probtune_cpu.winograd import WinogradConv2D

__all__ = [
    "AddRFactor",
    "AutoInline",
    "MultiLevelTiling",
    "PadChannels",
    "ParallelVectorize",
    "RandomComputeLocation",
    "RewriteCPUTensorize",
    "RewriteExpPolynomial",
    "RewriteInvariantDivision",
    "RewriteOutputReuse",
    "RewritePackedLayout",
    "RewriteParallelVectorizeUnroll",
    "RewriteReductionBlock",
    "RewriteSpatialInnermost",
    "RewriteVectorMath",
    "TransposeTiling",
    "WinogradConv2D",
]


@hookimpl
def probtune_register_space_modules(register: Callable[[Any], None]) -> None:
    register(MultiLevelTiling())
    register(TransposeTiling())
    register(ParallelVectorize())
    register(AutoUnroll())
    register(AutoInline())
    register(AddRFactor())
    register(RandomComputeLocation())


@hookimpl
def probtune_register_validators(register: Callable[[Any], None]) -> None:
    register(RewriteParallelVectorizeUnroll())
    register(RewriteReductionBlock())
    register(RewriteSpatialInnermost())
    register(RewriteVectorMath())
    register(RewriteExpPolynomial())
    register(RewriteInvariantDivision())
    register(RewriteOutputReuse())
    register(RewriteWriteBackLocation())
    register(RewritePackedLayout())
    register(RewriteCPUTensorize())
    register(VerifyStaticLoops())
    register(VerifyVectorize())
    register(VerifyParallel())
    register(VerifyUnrollSize())
    register(VerifyNoRecompute())


@hookimpl
def probtune_register_graph_rewrites(register: Callable[[Any], None]) -> None:
    register(PaddedTaps())
    register(PadChannels())
    register(WinogradConv2D())
