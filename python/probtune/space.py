"""Design spaces: the probabilistic program that modules build for one workload and target."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TypeVar

import tvm
import tvm_ffi
from tvm import s_tir

from probtune._core import Rng, Trace
from probtune.errors import PluginError, ReplayError
from probtune.interfaces import GraphRewrite, SpaceContext, SpaceModule, TargetSpec, Validator
from probtune.plugins import get_registry
from probtune.schedule import PRIMITIVES, InstructionKind, Schedule
from probtune.tir import block_names
from probtune.workload import Workload

__all__ = [
    "MAX_DRAWS",
    "REPLAY_FAILED",
    "Candidate",
    "DesignSpace",
    "Rejection",
    "generate_space",
    "plugin_instructions",
    "program_hash",
    "resolve_graph_rewrites",
    "resolve_modules",
    "resolve_validators",
]

REPLAY_FAILED = "replay"
"""The rejection count of traces that cannot be replayed at all (a mutation made a later decision illegal)."""

MAX_DRAWS = 16
"""Fresh random draws a sample may take under the modules' priors; the last one is kept whatever its weight."""


def program_hash(mod: tvm.IRModule) -> int:
    """The program's structural hash as an unsigned 64-bit integer: equal programs, equal hashes (dedup)."""
    return tvm_ffi.structural_hash(mod) & (2**64 - 1)


@dataclass(frozen=True)
class Candidate:
    """One point of the space: its trace and the finished program it gives.

    ``program`` is the program, or its ``tvm.ir.save_json`` text when a
    realize helper made it: the builder sends text to its workers anyway, and
    loading it here would cost half as much as realizing it again.
    """

    trace: Trace
    program: tvm.IRModule | str
    decision_hash: int
    program_hash: int

    @cached_property
    def mod(self) -> tvm.IRModule:
        """The finished program, loaded from its text if that is what was kept."""
        return tvm.ir.load_json(self.program) if isinstance(self.program, str) else self.program


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


@dataclass(frozen=True)
class Rejection:
    """Why a program was dropped before measurement: the validator that refused it, and its reason."""

    validator: str
    reason: str

    def __str__(self) -> str:
        return f"{self.validator}: {self.reason}"


@dataclass
class DesignSpace:
    """A workload's space of programs: a trace whose sampling instructions are the free choices."""

    context: SpaceContext
    trace: Trace
    modules: list[SpaceModule]
    validators: list[Validator]
    rejections: Counter[str] = field(default_factory=Counter)
    prior_end: int = 0
    """Instructions of ``trace`` after which the modules' priors can weigh a draw: the last one a module with a prior made."""

    @property
    def workload(self) -> Workload:
        return self.context.workload

    def finish(self, sch: s_tir.Schedule) -> Rejection | None:
        """Run the validators in order; the first rejection wins and is counted against its validator."""
        for validator in self.validators:
            reason = validator.check(sch, self.context)
            if reason is not None:
                self.rejections[validator.name] += 1
                return Rejection(validator.name, reason)
        return None

    def realize(self, trace: Trace, rng: Rng | int = 0) -> tuple[Schedule, Rejection | None]:
        """Replay ``trace`` (missing decisions are sampled from ``rng``) and finish it with the validators."""
        sch = Schedule.replay(self.workload.mod, trace, rng=rng, instructions=self.context.instructions)
        return sch, self.finish(sch.tvm)

    def draw(self, rng: Rng, trace: Trace | None = None) -> tuple[Schedule, Rejection | None]:
        """A random point of the space: the decisions ``trace`` lacks (default: all) drawn from ``rng``, then finished.

        A module with a ``prior`` (see :class:`~probtune.interfaces.SpaceModule`)
        weighs each draw once it is replayed up to ``prior_end``: the draw is
        kept with the product of the weights as its probability, else drawn
        again, at most ``MAX_DRAWS`` times, and only a kept draw is replayed
        to the end and finished (conv2d: 1.2 ms to judge a draw, 8 to replay
        it whole). Fresh samples then start the search from the kinds of
        programs that are fast more often, while mutations still reach the
        whole space.
        """
        undecided = self.trace.with_decisions({}) if trace is None else trace
        priors = [prior for module in self.modules if callable(prior := getattr(module, "prior", None))]
        until = self.prior_end if priors else None
        for attempt in range(1, MAX_DRAWS + 1):
            sch = Schedule.replay(self.workload.mod, undecided, rng=rng, until=until, instructions=self.context.instructions)
            if not priors or attempt == MAX_DRAWS or rng.random() < math.prod(p(sch.tvm, self.context) for p in priors):
                break
        if until is not None:
            sch.replay_more(undecided, until)
        return sch, self.finish(sch.tvm)

    def sample(self, rng: Rng) -> Candidate | None:
        """A fresh random point of the space (:meth:`draw`), or None if a validator rejected it."""
        try:
            sch, rejected = self.draw(rng)
        except ReplayError:
            self.rejections[REPLAY_FAILED] += 1
            return None
        if rejected:
            return None
        trace = sch.trace
        return Candidate(trace, sch.mod, trace.decision_hash(), program_hash(sch.mod))

    def program(self, trace: Trace) -> tvm.IRModule:
        """The finished program of a recorded trace (its decisions kept); raises if a validator rejects it."""
        sch, rejected = self.realize(trace)
        if rejected:
            raise ReplayError(f"the trace's program is rejected by {rejected}")
        return sch.mod


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
    run in a second pass, once every block went through the others.
    """
    context = SpaceContext(workload=workload, target=target, instructions=plugin_instructions())
    chosen = resolve_modules(target, modules)
    sch = Schedule(workload.mod, rng=Rng(seed), instructions=context.instructions)
    prior_end = 0
    late = [module for module in chosen if getattr(module, "after_blocks", False)]
    for group in ([module for module in chosen if module not in late], late):
        for name in reversed(block_names(workload.prim_func)):
            for module in group:
                if name not in block_names(sch.mod["main"]):
                    break  # an earlier module inlined it
                module.apply(sch, sch.get_sblock(name), context)
                if callable(getattr(module, "prior", None)):
                    prior_end = len(sch.trace)
    return DesignSpace(context, sch.trace, chosen, resolve_validators(target, validators), prior_end=prior_end)
