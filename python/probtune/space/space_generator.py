"""The space generator: the registered modules build a workload's design space for a target (:mod:`probtune.space.design_space`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from probtune._core import Rng
from probtune.errors import PluginError
from probtune.interfaces import GraphRewrite, SpaceContext, SpaceModule, TargetSpec, Validator
from probtune.plugins import get_registry
from probtune.schedule.analysis import block_names
from probtune.schedule.schedule import PRIMITIVES, InstructionKind, Schedule
from probtune.space.design_space import MAX_DRAWS, REPLAY_FAILED, Candidate, DesignSpace, Rejection, Sketch, program_hash
from probtune.workloads.workload import Workload

__all__ = [
    "MAX_DRAWS",
    "REPLAY_FAILED",
    "Candidate",
    "DesignSpace",
    "Rejection",
    "Sketch",
    "generate_space",
    "plugin_instructions",
    "program_hash",
    "resolve_graph_rewrites",
    "resolve_modules",
    "resolve_validators",
]

T = TypeVar("T")


def _pick(kind: str, table: Mapping[str, T], wanted: Sequence[str | T]) -> list[T]:
    """The registered items ``wanted`` names (objects given are taken as they are); an unknown name is an error."""
    chosen: list[T] = []
    for item in wanted:
        if not isinstance(item, str):
            chosen.append(item)
        elif item in table:
            chosen.append(table[item])
        else:
            known = ", ".join(sorted(table)) or "none"
            raise PluginError(f"unknown {kind} {item!r}; registered: {known}")
    return chosen


def plugin_instructions() -> dict[str, InstructionKind]:
    """The instruction kinds plugins added to the schedule language, by name."""
    return {name: kind for name, kind in get_registry().instructions.items() if name not in PRIMITIVES}


def resolve_modules(target: TargetSpec, modules: Sequence[str | SpaceModule] | None = None) -> list[SpaceModule]:
    """The target's default module list, or the caller's (names or module objects)."""
    return _pick("design-space module", get_registry().space_modules, target.modules if modules is None else modules)


def resolve_validators(target: TargetSpec, validators: Sequence[str | Validator] | None = None) -> list[Validator]:
    return _pick("validator", get_registry().validators, target.validators if validators is None else validators)


def resolve_graph_rewrites(target: TargetSpec, rewrites: Sequence[str | GraphRewrite] | None = None) -> list[GraphRewrite]:
    """The target's graph rewrites, or the caller's (names or rewrite objects)."""
    return _pick("graph rewrite", get_registry().graph_rewrites, target.graph_rewrites if rewrites is None else rewrites)


def generate_space(
    workload: Workload,
    target: TargetSpec,
    *,
    modules: Sequence[str | SpaceModule] | None = None,
    validators: Sequence[str | Validator] | None = None,
    seed: int = 0,
) -> DesignSpace:
    """Apply each module to each block, consumers before producers, and keep the recorded trace.

    Modules marked ``after_blocks`` (see :class:`~probtune.interfaces.SpaceModule`)
    run in a second pass, once every block went through the others. A module
    that forks (returns other schedules) makes each fork a sketch of its own,
    which goes through the steps after that one as the first does.
    """
    context = SpaceContext(workload=workload, target=target, instructions=plugin_instructions())
    chosen = resolve_modules(target, modules)
    late = [module for module in chosen if getattr(module, "after_blocks", False)]
    steps = [(name, module) for group in ([module for module in chosen if module not in late], late)
             for name in reversed(block_names(workload.prim_func)) for module in group]
    pending = [(Schedule(workload.mod, rng=Rng(seed), instructions=context.instructions), 0, 0)]
    sketches: list[Sketch] = []
    while pending:
        sch, start, prior_end = pending.pop(0)
        for index, (name, module) in enumerate(steps[start:], start):
            if name not in block_names(sch.mod["main"]):
                continue  # an earlier module inlined it
            forks = module.apply(sch, sch.get_sblock(name), context) or []
            weighs = callable(getattr(module, "prior", None))
            prior_end = len(sch.trace) if weighs else prior_end
            pending.extend((fork, index + 1, len(fork.trace) if weighs else prior_end) for fork in forks)
        sketches.append(Sketch(sch.trace, prior_end))
    first, *alternatives = sketches
    return DesignSpace(context, first.trace, chosen, resolve_validators(target, validators), prior_end=first.prior_end,
                       alternatives=alternatives)
