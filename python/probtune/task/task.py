"""A tuning task: what MetaSchedule calls a tune context, less what the driver opens for it (space, search, reference)."""

from __future__ import annotations

from dataclasses import dataclass

from probtune.measure.constant_layouts import layout_free_params
from probtune.workloads.workload import Workload

__all__ = ["Task"]


@dataclass(frozen=True)
class Task:
    """A workload to tune, its weight in the whole (a model's call sites of it), and the names it stands for there.

    An operator tuned alone is one task of weight 1. A model's task is one
    distinct fused PrimFunc: ``functions`` are its names in the fused module.
    The workload's PrimFunc lists the parameter positions where every call
    passes a constant (a weight; TVM's ``layout_free_buffers``): the compiled
    model makes their layout copies once, the task's candidates are timed so
    (:mod:`probtune.measure.constant_layouts`), and its design space knows such a
    copy costs nothing per call.
    """

    workload: Workload
    weight: int = 1
    functions: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.workload.name

    @property
    def constants(self) -> frozenset[int]:
        """The parameter positions its callers pass as constants."""
        return frozenset(layout_free_params(self.workload.mod["main"]))
