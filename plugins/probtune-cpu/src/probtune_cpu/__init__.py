"""CPU design-space modules and validators for probtune."""

from __future__ import annotations

from typing import Any, Callable

from probtune import hookimpl

from probtune_cpu.multi_level_tiling import MultiLevelTiling
from probtune_cpu.parallel_vectorize import (
    AutoUnroll,
    ParallelVectorize,
    RewriteParallelVectorizeUnroll,
    RewriteReductionBlock,
)

__all__ = ["MultiLevelTiling", "ParallelVectorize", "AutoUnroll", "RewriteParallelVectorizeUnroll", "RewriteReductionBlock"]


@hookimpl
def probtune_register_space_modules(register: Callable[[Any], None]) -> None:
    register(MultiLevelTiling())
    register(ParallelVectorize())
    register(AutoUnroll())


@hookimpl
def probtune_register_validators(register: Callable[[Any], None]) -> None:
    register(RewriteParallelVectorizeUnroll())
    register(RewriteReductionBlock())
