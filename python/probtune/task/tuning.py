"""Tuning one operator: the one tuning loop (:mod:`probtune.task.driver`) with one task."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tvm

from probtune._core import Trace
from probtune.database.database import Database, Record
from probtune.database.measure_key import MeasureKey
from probtune.defaults import BATCH_SIZE, BUILD_TIMEOUT, CONFIRM, COST_MODEL, OPERATOR_TRIALS, RUN_TIMEOUT
from probtune.errors import TuningConfigError
from probtune.interfaces import Builder, CostModel, Runner, SpaceModule, TargetSpec
from probtune.measure.codegen import compile_for
from probtune.measure.pipeline import Progress, TrialOutcome, open_pipeline, resolve_cost_model
from probtune.measure.runner import local_device_name
from probtune.plugins import get_registry
from probtune.space.design_space import DesignSpace
from probtune.space.space_generator import generate_space
from probtune.targets import resolve_target
from probtune.task.driver import drive, strategy_kind
from probtune.task.session import best_replayable
from probtune.task.task import Task
from probtune.task.task_scheduler import RoundRobinScheduler
from probtune.workloads.catalog import resolve_workload
from probtune.workloads.workload import Workload

__all__ = ["TrialOutcome", "TuneResult", "compile_best", "tune"]


@dataclass
class TuneResult:
    """What a tuning run found; the best record spans every run recorded in the database."""

    workload: Workload
    target: TargetSpec
    measured_on: str  # the key of the records: the target and the device they were measured on
    database: Path
    space: DesignSpace
    best: Record | None
    measured: int
    statuses: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    search_seconds: float = 0.0  # choosing candidates and learning from them
    measure_seconds: float = 0.0  # building, timing and recording candidates; the rest of ``seconds`` is setup

    @property
    def best_latency(self) -> float | None:
        """Mean latency in seconds of the fastest correct program."""
        return self.best.mean_latency if self.best else None

    @property
    def best_gflops(self) -> float | None:
        if self.best is None or self.best.mean_latency is None or not self.workload.flops:
            return None
        return self.workload.flops / self.best.mean_latency / 1e9

    @property
    def best_trace(self) -> Trace | None:
        return Trace.from_json(self.best.trace_json) if self.best else None

    @property
    def rejections(self) -> dict[str, int]:
        """Candidates dropped before measurement, by validator."""
        return dict(self.space.rejections)

    def schedule(self) -> tvm.IRModule:
        """The best program (the best trace replayed with its decisions, then finished by the validators)."""
        trace = self.best_trace
        if trace is None:
            raise RuntimeError(f"no correct program of {self.workload.key} was measured on {self.target.name}")
        return self.space.program(trace)

    def build(self) -> Any:
        """The best program compiled for the target: a runnable TVM module (``lib["main"](*tensors)``)."""
        return compile_for(self.schedule(), self.target)


def tune(
    workload: str | Workload | tvm.IRModule | tvm.tirx.PrimFunc,
    target: str | TargetSpec = "host",
    trials: int = OPERATOR_TRIALS,
    *,
    shape: Sequence[int] | str | None = None,
    dtype: str = "float32",
    database: str | Path | None = None,
    seed: int = 0,
    batch_size: int = BATCH_SIZE,
    strategy: str = "evolutionary",
    cost_model: str | CostModel = COST_MODEL,
    search_options: dict[str, Any] | None = None,
    modules: Sequence[str | SpaceModule] | None = None,
    build_timeout: float = BUILD_TIMEOUT,
    run_timeout: float = RUN_TIMEOUT,
    confirm: int = CONFIRM,
    progress: Progress | None = None,
    builder: str | Builder | None = None,
    runner: str | Runner | None = None,
) -> TuneResult:
    """Tune ``workload`` for ``target`` with ``trials`` new measurements, recorded in ``database``.

    ``workload`` is a catalog name (with ``shape``), a :class:`Workload`, or an
    IRModule/PrimFunc. A database that already holds records for this workload
    and target is continued: nothing measured before is measured again, and
    the best record may come from an earlier run.

    ``strategy`` is "evolutionary" (guided by ``cost_model``, a registered
    name or a :class:`CostModel`; its state is kept in the database, so a
    later run, on this workload or another, starts from what it learned;
    ``search_options`` go to :class:`EvolutionarySearch`) or "random".

    At the end, the ``confirm`` best records are timed again, in passes
    over all of them, and the timings join their records: one pass is good
    to about ±20% on a busy machine, and the fastest of hundreds of records
    is the one whose pass was luckiest. If a record timed once then leads,
    the new best ones are timed again too, until the best is a record timed
    again. ``confirm=0`` skips it.

    ``builder`` and ``runner`` measure the candidates: objects such as
    ``LocalRunner(repeat=5)`` (used with their own settings and timeouts,
    and left open, so that one can serve several runs), names of registered
    ones, or None for the target's own.
    """
    check_tuning_options(trials, batch_size, confirm, strategy)
    spec = resolve_target(target)
    work = resolve_workload(workload, shape, dtype, get_registry().workloads)
    kind = strategy_kind(strategy)
    model = resolve_cost_model(cost_model, seed) if kind.uses_cost_model else None
    started = time.perf_counter()
    with open_pipeline(spec, database, model, trials=trials, build_timeout=build_timeout, run_timeout=run_timeout,
                       progress=progress, builder=builder, runner=runner) as pipeline:
        driven = drive(pipeline, [Task(work)], trials, RoundRobinScheduler(), strategy=kind, cost_model=model,
                       batch_size=batch_size, confirm=confirm, seed=seed, modules=modules, search_options=search_options)
    (outcome,) = driven.outcomes
    assert outcome.space is not None  # a run of one or more trials gives its task a round
    return TuneResult(
        workload=work,
        target=spec,
        measured_on=pipeline.key.text,
        database=pipeline.db.path,
        space=outcome.space,
        best=outcome.best.record if outcome.best else None,
        measured=outcome.trials,
        statuses=outcome.statuses,
        seconds=time.perf_counter() - started,
        search_seconds=outcome.search_seconds,
        measure_seconds=pipeline.measure_seconds,
    )


def check_tuning_options(trials: int, batch_size: int, confirm: int, strategy: str, *, minimum_trials: int = 1) -> None:
    """Refuse option values that cannot make a run, naming the option (a model may take 0 trials: compile only)."""
    if not isinstance(trials, int) or trials < minimum_trials:
        kind = "a positive integer" if minimum_trials > 0 else "a non-negative integer"
        raise TuningConfigError(f"trials must be {kind}, got {trials!r}")
    if batch_size <= 0:
        raise TuningConfigError(f"batch_size must be positive, got {batch_size!r}")
    if not isinstance(confirm, int) or confirm < 0:
        raise TuningConfigError(f"confirm must be a non-negative integer, got {confirm!r}")
    strategy_kind(strategy)  # an unknown name is refused, naming the registered ones


def compile_best(
    workload: str | Workload | tvm.IRModule | tvm.tirx.PrimFunc,
    target: str | TargetSpec,
    database: str | Path,
    *,
    shape: Sequence[int] | str | None = None,
    dtype: str = "float32",
    device: str | None = None,
) -> Any:
    """Compile ``workload`` with the best schedule recorded for ``target`` in ``database``.

    Records measured on ``device`` (as ``probtune db info`` lists them); None
    takes this machine's, or the only device the target was measured on.
    """
    spec = resolve_target(target)
    work = resolve_workload(workload, shape, dtype, get_registry().workloads)
    space = generate_space(work, spec)
    with Database(database) as db:
        key = records_key(db, spec, device)
        row = db.find_workload(work.mod)
        best = best_replayable(db, row.id, key, space) if row else None
    if best is None:
        raise LookupError(f"{database} holds no correct record of {work.key} on {key} that replays")
    return compile_for(best.program, spec)


def records_key(db: Database, spec: TargetSpec, device: str | None = None) -> MeasureKey:
    """The key of ``spec``'s records measured on ``device``; None: this machine's device, or else the only one."""
    keys = db.measurements(spec.name)
    if not keys and device is None:
        return MeasureKey(spec.name)  # nothing recorded: the caller finds no record under the name
    wanted = device if device is not None else local_device_name(spec)
    chosen = [m.key for m in keys if m.device == wanted]
    if not chosen and device is None:
        chosen = [m.key for m in keys]  # not measured here: the only device it was measured on, if one
    if len(chosen) == 1:
        return chosen[0]
    devices = ", ".join(str(m.device) for m in keys) or "none"
    raise LookupError(f"{db.path} holds records of target {spec.name!r} from the devices: {devices}; name one of them")
