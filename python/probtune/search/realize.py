"""Realize candidates on every core: replay, validators, program hash and features.

Realizing is most of a search's own time and runs in Python under the GIL, so
the tuning process hands a share of each batch to helper processes and does
its own share meanwhile. A candidate's outcome depends only on its trace and
the generator its missing decisions are drawn from, so the search is the same
whatever the number of helpers, none included.
"""

from __future__ import annotations

import functools
import pickle
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm

from probtune._core import Rng, Trace
from probtune.errors import NOT_REPLAYABLE, warn_caller
from probtune.interfaces import CostModel, SpaceContext, SpaceModule, TargetSpec, Validator
from probtune.measure._process import WorkerProcess, WorkerStartError
from probtune.measure.builder import LocalBuilder
from probtune.schedule.schedule import InstructionKind, Schedule
from probtune.space.design_space import REPLAY_FAILED, DesignSpace, Sketch, program_hash
from probtune.workloads.workload import Workload

__all__ = ["REPLAY_FAILED", "Realized", "Realizer", "Rejected"]

_MIN_CHUNK = 2  # jobs: a candidate takes ~10 ms to realize, a round trip through the pipe well under 1 ms
# Per helper. With two, a helper writing a large reply and this process writing the next large chunk (a design
# space of many blocks) each waited for the other to read: both blocked for good.
_CHUNKS_IN_FLIGHT = 1
_MAX_KEPT = 512  # programs a helper keeps for :meth:`Realizer.programs`: a batch's share is about 100

ProgramFeatures = Callable[[tvm.IRModule], np.ndarray]
Job = tuple[Trace, "Rng | None"]  # a trace, and the generator that draws what it lacks (DesignSpace.draw; None: decided)
Lend = Callable[[int], Sequence[WorkerProcess]]  # up to n ready, idle TVM worker processes (LocalBuilder.lend_workers)


@dataclass(frozen=True)
class Realized:
    """A valid candidate: its fully decided trace, program hash and features (and program, if realized here)."""

    trace: Trace
    program_hash: int
    features: np.ndarray
    mod: tvm.IRModule | None = None


@dataclass(frozen=True)
class Rejected:
    """A candidate dropped before measurement: ``by`` names the validator, or is ``REPLAY_FAILED``."""

    by: str


Outcome = Realized | Rejected


def realize_in_process(
    space: DesignSpace, jobs: Sequence[Job], featurize: Callable[[list[tvm.IRModule]], list[np.ndarray]]
) -> list[Outcome]:
    """Realize ``jobs`` here, featurizing the valid programs in one ``featurize`` call."""
    outcomes: list[Outcome | None] = []  # None: valid, its schedule is next in ``valid``
    valid: list[Schedule] = []
    for trace, rng in jobs:
        try:
            sch, rejected = space.realize(trace) if rng is None else space.draw(rng, trace)
        except NOT_REPLAYABLE:
            space.rejections[REPLAY_FAILED] += 1
            outcomes.append(Rejected(REPLAY_FAILED))
            continue
        if rejected:
            outcomes.append(Rejected(rejected.validator))
        else:
            outcomes.append(None)
            valid.append(sch)
    mods = [sch.mod for sch in valid]
    realized = iter(
        Realized(sch.trace, program_hash(mod), features, mod) for sch, mod, features in zip(valid, mods, featurize(mods))
    )
    return [outcome if outcome is not None else next(realized) for outcome in outcomes]


class Realizer:
    """Realizes batches of jobs, sharing them between this process and ``workers`` helpers.

    Helpers are TVM processes borrowed for each batch from ``lend`` (the
    tuning's ``LocalBuilder.lend_workers``: the processes that compile
    candidates realize them between builds, rather than a set of processes
    of their own, about 200 MB each); without ``lend``, the Realizer keeps a
    builder of its own for them, closed by :meth:`close`. Helpers need the
    cost model's ``program_features`` (a picklable function of one program)
    and validators that pickle; without them, or with ``workers=0``,
    everything is realized here. A helper that fails is reported, and from
    then on everything is realized here.
    """

    def __init__(self, space: DesignSpace, model: CostModel, workers: int = 0, lend: Lend | None = None) -> None:
        if workers < 0:
            raise ValueError(f"workers must not be negative, got {workers}")
        self.space = space
        self.model = model
        self._wanted = 0
        self._setup = b""
        self._lend: Lend | None = None
        self._own_builder: LocalBuilder | None = None
        self._helpers: list[WorkerProcess] = []  # this batch's
        self._holders: dict[int, WorkerProcess] = {}  # decision hash -> the helper that kept its program
        program_features: ProgramFeatures | None = getattr(model, "program_features", None)
        if workers and program_features is not None:
            setup = _HelperSetup.pickled(space, program_features)
            if setup is not None:
                if lend is None:
                    self._own_builder = LocalBuilder(workers=workers)
                    lend = self._own_builder.lend_workers
                self._setup, self._lend, self._wanted = setup, lend, workers

    @property
    def workers(self) -> int:
        return self._wanted if self._lend is not None else 0

    def realize(self, jobs: Sequence[Job]) -> list[Outcome]:
        """One outcome per job, in order.

        Jobs go out in chunks, large first and smaller as they run out, and
        each process takes the next chunk when it is done with its own: this
        process also runs the search between realizations, so a fixed split
        would leave the helpers idle for part of every batch.
        """
        jobs = list(jobs)
        self._helpers = self._borrow() if len(jobs) >= 2 else []
        if not self._helpers:
            return self._realize_here(jobs)
        outcomes: list[Outcome] = [None] * len(jobs)  # type: ignore[list-item]  # every slot is filled below
        chunks = _Chunks(len(jobs), processes=len(self._helpers) + 1)
        in_flight: list[tuple[WorkerProcess, deque[slice]]] = [(helper, deque()) for helper in self._helpers]

        def dispatch() -> None:
            for helper, spans in in_flight:
                while helper in self._helpers and len(spans) < _CHUNKS_IN_FLIGHT and chunks.left:
                    spans.append(chunks.take())
                    self._send(helper, jobs[spans[-1]])  # if the helper is gone, the span is realized below

        def collect(helper: WorkerProcess, spans: deque[slice], wait: bool) -> None:
            while spans and helper in self._helpers and (wait or helper.connection.poll()):
                span = spans.popleft()
                outcomes[span] = self._receive(helper, jobs[span])
            if helper not in self._helpers:  # it failed: what it still held is realized here
                while spans:
                    span = spans.popleft()
                    outcomes[span] = self._realize_here(jobs[span])

        dispatch()
        while chunks.left:
            span = chunks.take()
            outcomes[span] = self._realize_here(jobs[span])
            for helper, spans in in_flight:
                collect(helper, spans, wait=False)
            dispatch()
        for helper, spans in in_flight:
            collect(helper, spans, wait=True)
        self._helpers = []
        return outcomes

    def programs(self, keys: Sequence[int], keep: Collection[int] = ()) -> dict[int, str]:
        """The ``tvm.ir.save_json`` text of programs that helpers realized, by decision hash.

        A helper keeps the programs it realizes, so that the few the search
        chooses need not be realized again here (a conv2d: 7 ms each, against
        1 ms for the text). Each helper then forgets all but those of
        ``keep`` (what the next batch may still choose). A key no helper holds,
        or whose helper was replaced or fails, is missing from the answer: the
        caller realizes that one itself.
        """
        wanted: dict[WorkerProcess, list[int]] = {}
        for key in keys:
            if key in self._holders:
                wanted.setdefault(self._holders[key], []).append(key)
        kept = set(keep)
        self._holders = {key: helper for key, helper in self._holders.items() if key in kept}
        helpers = [helper for helper in self._borrow() if helper in wanted or helper in self._holders.values()]
        keep_here = {helper: [k for k, h in self._holders.items() if h is helper] for helper in helpers}
        texts: dict[int, str] = {}
        for helper in helpers:
            try:
                helper.connection.send(_ProgramsTask(wanted.get(helper, []), keep_here[helper]))
                reply = helper.connection.recv()
            except (EOFError, OSError):
                self._drop(helper, f"died ({helper.kill()})")
                continue
            if isinstance(reply, _HelperError):
                self._drop(helper, f"failed: {reply.message}")
                continue
            texts.update(reply)
        lent = set(helpers)
        self._holders = {key: helper for key, helper in self._holders.items() if helper in lent}
        return texts

    def close(self) -> None:
        if self._own_builder is not None:
            self._own_builder.close()

    def _borrow(self) -> list[WorkerProcess]:
        if self._lend is None:
            return []
        try:
            return list(self._lend(self._wanted))
        except WorkerStartError as exc:
            self._give_up(f"a realize helper did not start ({exc})")
            return []

    def _send(self, helper: WorkerProcess, chunk: list[Job]) -> None:
        try:
            helper.connection.send(_RealizeTask(self._setup, chunk))
        except OSError:  # a broken pipe: the helper is gone
            self._drop(helper, f"died ({helper.kill()})")

    def _receive(self, helper: WorkerProcess, chunk: list[Job]) -> list[Outcome]:
        try:
            reply = helper.connection.recv()
        except (EOFError, OSError):
            self._drop(helper, f"died ({helper.kill()})")
            return self._realize_here(chunk)
        if isinstance(reply, _HelperError):
            self._drop(helper, f"failed: {reply.message}")
            return self._realize_here(chunk)
        for outcome in reply:
            if isinstance(outcome, Rejected):
                self.space.rejections[outcome.by] += 1
            else:
                self._holders[outcome.trace.decision_hash()] = helper
        return reply

    def _realize_here(self, chunk: list[Job]) -> list[Outcome]:
        return realize_in_process(self.space, chunk, self.model.featurize)

    def _drop(self, helper: WorkerProcess, why: str) -> None:
        helper.kill()  # a lent worker: its builder replaces it
        if helper in self._helpers:
            self._helpers.remove(helper)
        self._give_up(f"a realize helper ({helper.name}) {why}")

    def _give_up(self, what: str) -> None:
        if self._lend is not None:
            warn_caller(f"{what}; candidates are realized in the tuning process from now on")
        self._lend = None


class _Chunks:
    """Consecutive spans of ``total`` jobs for ``processes`` to share, each a fraction of what is left.

    Early chunks are large (few messages); the last ones are small, so that
    no process is left with much to do when the others run out.
    """

    def __init__(self, total: int, processes: int) -> None:
        self.total = total
        self.processes = processes
        self.start = 0

    @property
    def left(self) -> int:
        return self.total - self.start

    def take(self) -> slice:
        size = max(_MIN_CHUNK, self.left // (2 * self.processes))
        span = slice(self.start, min(self.total, self.start + size))
        self.start = span.stop
        return span


@dataclass(frozen=True)
class _HelperSetup:
    """What a helper needs to realize candidates as the tuning process would (TVM objects as JSON)."""

    workload: dict[str, Any]
    mod_json: str
    context_options: dict[str, Any]
    instructions: dict[str, InstructionKind]  # the plugins' kinds the trace may hold
    target: TargetSpec
    trace: Trace
    modules: list[SpaceModule]  # their priors weigh fresh draws
    prior_end: int
    validators: list[Validator]
    program_features: ProgramFeatures
    alternatives: list[Sketch]

    @classmethod
    def pickled(cls, space: DesignSpace, program_features: ProgramFeatures) -> bytes | None:
        """The setup, pickled, or None if a piece of it does not pickle (a validator defined inside a function, say)."""
        context, work = space.context, space.workload
        setup = cls(
            {"name": work.name, "shape": work.shape, "dtype": work.dtype, "num_inputs": work.num_inputs, "flops": work.flops},
            tvm.ir.save_json(work.mod),
            dict(context.options),
            dict(context.instructions),
            context.target,
            space.trace,
            list(space.modules),
            space.prior_end,
            list(space.validators),
            program_features,
            list(space.alternatives),
        )
        try:
            return pickle.dumps(setup)
        except Exception:  # noqa: BLE001 - any pickling failure means: realize in this process
            return None


@dataclass(frozen=True)
class _HelperError:
    message: str


@dataclass(frozen=True)
class _RealizeTask:
    """A chunk of jobs, called in a helper (a builder worker, which calls what it is sent)."""

    setup: bytes  # a pickled _HelperSetup: the same bytes with every chunk, unpickled once per helper
    jobs: list[Job]

    def __call__(self) -> list[Outcome] | _HelperError:
        """The outcomes, without programs (kept here instead); a Python error is reported, not fatal to the search."""
        try:
            space, program_features = _helper_space(self.setup)
            outcomes = realize_in_process(space, self.jobs, lambda mods: [program_features(m) for m in mods])
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which realizes the share itself
            return _HelperError(f"{type(exc).__name__}: {exc}")
        for outcome in outcomes:
            if isinstance(outcome, Realized):
                _KEPT[outcome.trace.decision_hash()] = outcome.mod
                _KEPT.move_to_end(outcome.trace.decision_hash())
        while len(_KEPT) > _MAX_KEPT:
            _KEPT.popitem(last=False)
        return [o if isinstance(o, Rejected) else Realized(o.trace, o.program_hash, o.features) for o in outcomes]


_KEPT: OrderedDict[int, tvm.IRModule] = OrderedDict()  # in a helper: the programs it realized, oldest first


@dataclass(frozen=True)
class _ProgramsTask:
    """Called in a helper: the text of the ``send`` programs it kept; it keeps only ``keep`` from now on."""

    send: list[int]
    keep: list[int]

    def __call__(self) -> dict[int, str] | _HelperError:
        try:
            texts = {key: tvm.ir.save_json(_KEPT[key]) for key in self.send if key in _KEPT}
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which realizes them itself
            return _HelperError(f"{type(exc).__name__}: {exc}")
        kept = {key: _KEPT[key] for key in self.keep if key in _KEPT}
        _KEPT.clear()
        _KEPT.update(kept)
        return texts


@functools.lru_cache(maxsize=1)
def _helper_space(setup_bytes: bytes) -> tuple[DesignSpace, ProgramFeatures]:
    """The space a helper realizes candidates in, made once per setup."""
    setup: _HelperSetup = pickle.loads(setup_bytes)
    work = Workload(mod=tvm.ir.load_json(setup.mod_json), reference=None, **setup.workload)
    context = SpaceContext(work, setup.target, setup.context_options, setup.instructions)
    space = DesignSpace(context, setup.trace, setup.modules, setup.validators, prior_end=setup.prior_end,
                        alternatives=setup.alternatives)
    return space, setup.program_features
