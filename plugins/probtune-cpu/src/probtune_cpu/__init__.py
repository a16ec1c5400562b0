"""CPU design-space modules and validators for probtune."""

from __future__ import annotations

from typing import Any, Callable

from probtune import hookimpl

from probtune_cpu.multi_level_tiling import MultiLevelTiling
from probtune_cpu.parallel_vectorize import ParallelVectorize, RewriteParallelVectorize

__all__ = ["MultiLevelTiling", "ParallelVectorize", "RewriteParallelVectorize"]


@hookimpl
def probtune_register_space_modules(register: Callable[[Any], None]) -> None:
    register(MultiLevelTiling())
    register(ParallelVectorize())


@hookimpl
def probtune_register_validators(register: Callable[[Any], None]) -> None:
    register(RewriteParallelVectorize())
