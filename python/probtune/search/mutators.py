"""Mutators over the kernel's own sampling instructions.

Tile sizes and categorical choices are mutated in Rust (``probtune._core``),
inside the evolutionary loop, without calling back into Python. A compute
location needs TVM to know which loops are legal, so that mutator is Python.
All three reach the search through the ``probtune_register_mutators`` hook,
like any third party's mutator.
"""

from __future__ import annotations

from collections.abc import Callable

from probtune._core import Rng, Trace, mutate_categorical, mutate_tile_size
from probtune.errors import NOT_REPLAYABLE
from probtune.interfaces import SpaceContext
from probtune.schedule.schedule import BlockRV, Schedule, tvm_compute_location

__all__ = ["BUILTIN_MUTATORS", "ComputeLocationMutator", "CoreMutator"]

class CoreMutator:
    """A mutator implemented in ``probtune._core``; the search runs it in Rust by ``core_mutator``."""

    def __init__(self, name: str, probability: float, function: Callable[[Trace, Rng], Trace | None]) -> None:
        self.name = name
        self.core_mutator = name
        self.probability = probability
        self._function = function

    def mutate(self, trace: Trace, rng: Rng, ctx: SpaceContext) -> Trace | None:
        return self._function(trace, rng)


def compute_location_sites(trace: Trace) -> list[int]:
    """The indices of the trace's ``sample_compute_location`` instructions."""
    return [i for i in trace.sampling_indices() if trace.instruction(i).kind == "sample_compute_location"]


class ComputeLocationMutator:
    """Moves a block sampled by ``sample_compute_location`` to another legal loop.

    It replays the trace up to that instruction, so TVM sees the program as it
    is there, and asks TVM for a location again (with seeds from ``rng``) until
    it gets a different one. The rest of the trace is kept; if the move makes
    a later instruction inapplicable, replay rejects the child.
    """

    name = "compute_location"

    def __init__(self, probability: float = 1 / 3, attempts: int = 8) -> None:
        self.probability = probability
        self.attempts = attempts

    def mutate(self, trace: Trace, rng: Rng, ctx: SpaceContext) -> Trace | None:
        sites = compute_location_sites(trace)
        if not sites:
            return None
        index = sites[rng.randint(0, len(sites))]
        decisions = trace.decisions
        try:
            sch = Schedule.replay(ctx.workload.mod, trace, until=index, instructions=ctx.instructions)
        except NOT_REPLAYABLE:
            return None
        block = sch.resolve(BlockRV(trace.instruction(index).inputs[0]["rv"]))
        for _ in range(self.attempts):
            _, taken = tvm_compute_location(sch.tvm, block, rng)
            if taken != decisions.get(index):
                return trace.with_decisions({**decisions, index: taken})
        return None


BUILTIN_MUTATORS = (
    CoreMutator("tile_size", 1 / 3, mutate_tile_size),
    CoreMutator("categorical", 1 / 3, mutate_categorical),
    ComputeLocationMutator(1 / 3),
)
"""Equal shares: a target sets its own (``TargetSpec.mutators``); these apply where it sets none."""
