"""Design spaces: the probabilistic program of one workload and target, its points and their programs.

A space is made by :func:`probtune.space.space_generator.generate_space` (the space
generator, which reads the registered modules); this module reads no
registry, so that the search and its strategies can be registered by the
kernel's own plugin without an import cycle.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property

import tvm
import tvm_ffi
from tvm import s_tir

from probtune._core import Rng, Trace
from probtune.errors import ReplayError
from probtune.interfaces import SpaceContext, SpaceModule, Validator
from probtune.schedule.schedule import Schedule
from probtune.workloads.workload import Workload

__all__ = ["MAX_DRAWS", "REPLAY_FAILED", "Candidate", "DesignSpace", "Rejection", "Sketch", "program_hash"]

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


@dataclass(frozen=True)
class Rejection:
    """Why a program was dropped before measurement: the validator that refused it, and its reason."""

    validator: str
    reason: str

    def __str__(self) -> str:
        return f"{self.validator}: {self.reason}"


@dataclass(frozen=True)
class Sketch:
    """One structure of a space's programs: a trace whose sampling instructions are the free choices."""

    trace: Trace
    prior_end: int = 0
    """Instructions of ``trace`` after which the modules' priors can weigh a draw: the last one a module with a prior made."""


@dataclass
class DesignSpace:
    """A workload's space of programs: a trace whose sampling instructions are the free choices, and the alternative
    sketches a module forked (a product computed whole or with its reduction split, say), drawn as often each."""

    context: SpaceContext
    trace: Trace
    modules: list[SpaceModule]
    validators: list[Validator]
    rejections: Counter[str] = field(default_factory=Counter)
    prior_end: int = 0
    """Instructions of ``trace`` after which the modules' priors can weigh a draw: the last one a module with a prior made."""
    alternatives: list[Sketch] = field(default_factory=list)

    @property
    def sketches(self) -> list[Sketch]:
        """Every structure of the space: ``trace`` first, then the alternatives."""
        return [Sketch(self.trace, self.prior_end), *self.alternatives]

    def undecided(self, rng: Rng) -> Trace:
        """A sketch picked uniformly, its decisions left to be drawn."""
        sketches = self.sketches
        return sketches[rng.randint(0, len(sketches)) if len(sketches) > 1 else 0].trace.with_decisions({})

    def _prior_end_of(self, trace: Trace) -> int | None:
        """The prior end of the sketch whose instructions ``trace`` has, or None if it follows none."""
        if not self.alternatives:
            return self.prior_end
        structure = trace.structure_hash()
        return next((s.prior_end for s in self.sketches if s.trace.structure_hash() == structure), None)

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
        """A random point of the space: the decisions ``trace`` lacks (default: all, of a sketch picked uniformly)
        drawn from ``rng``, then finished.

        A module with a ``prior`` (see :class:`~probtune.interfaces.SpaceModule`)
        weighs each draw once it is replayed up to ``prior_end``: the draw is
        kept with the product of the weights as its probability, else drawn
        again, at most ``MAX_DRAWS`` times, and only a kept draw is replayed
        to the end and finished (conv2d: 1.2 ms to judge a draw, 8 to replay
        it whole). Fresh samples then start the search from the kinds of
        programs that are fast more often, while mutations still reach the
        whole space.
        """
        undecided = self.undecided(rng) if trace is None else trace
        priors = [prior for module in self.modules if callable(prior := getattr(module, "prior", None))]
        until = self._prior_end_of(undecided) if priors else None
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
