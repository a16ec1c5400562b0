"""The tuning loop: sample candidates, build and time them, record every result as it arrives."""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import tvm

from probtune._core import Rng, Trace
from probtune.database import Database, Record
from probtune.errors import PluginError, TuningConfigError
from probtune.interfaces import SpaceModule, TargetSpec
from probtune.measure import prepare_reference
from probtune.plugins import get_registry
from probtune.search import RandomSearch
from probtune.space import Candidate, DesignSpace, generate_space
from probtune.targets import check_runs_here, resolve_target
from probtune.workload import Workload, resolve_workload

__all__ = ["TuneResult", "TrialOutcome", "tune", "compile_best"]

Progress = Callable[["TrialOutcome"], None]


@dataclass(frozen=True)
class TrialOutcome:
    """One measured candidate, as reported to a progress callback."""

    trial: int  # 1-based within this run
    trials: int
    status: str
    latency: float | None
    best_latency: float | None
    error: str | None
    flops: float | None


@dataclass
class TuneResult:
    """What a tuning run found; the best record spans every run recorded in the database."""

    workload: Workload
    target: TargetSpec
    database: Path
    space: DesignSpace
    best: Record | None
    measured: int
    statuses: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def best_latency(self) -> float | None:
        """Mean latency in seconds of the fastest correct program."""
        return self.best.mean_latency if self.best else None

    @property
    def best_gflops(self) -> float | None:
        if self.best is None or not self.workload.flops:
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
        return tvm.compile(self.schedule(), target=tvm.target.Target(self.target.tvm_target))


def _factory(kind: str, table: dict[str, Callable[..., Any]], name: str, target: str) -> Callable[..., Any]:
    if name not in table:
        raise PluginError(
            f"target {target!r} uses the {kind} {name!r}, which no installed plugin registers "
            f"(registered {kind}s: {', '.join(sorted(table)) or 'none'}); install a plugin that provides it, "
            f"or tune for a target this machine can measure, such as 'host'"
        )
    return table[name]


def tune(
    workload: str | Workload | tvm.IRModule | tvm.tirx.PrimFunc,
    target: str | TargetSpec = "host",
    trials: int = 64,
    *,
    shape: Sequence[int] | str | None = None,
    dtype: str = "float32",
    database: str | Path | None = None,
    seed: int = 0,
    batch_size: int = 16,
    modules: Sequence[str | SpaceModule] | None = None,
    build_timeout: float = 60.0,
    run_timeout: float = 10.0,
    progress: Progress | None = None,
) -> TuneResult:
    """Tune ``workload`` for ``target`` with ``trials`` new measurements, recorded in ``database``.

    ``workload`` is a catalog name (with ``shape``), a :class:`Workload`, or an
    IRModule/PrimFunc. A database that already holds records for this workload
    and target is continued: nothing measured before is measured again, and
    the best record may come from an earlier run.
    """
    if not isinstance(trials, int) or trials <= 0:
        raise TuningConfigError(f"trials must be a positive integer, got {trials!r}")
    if batch_size <= 0:
        raise TuningConfigError(f"batch_size must be positive, got {batch_size!r}")
    spec = resolve_target(target)
    registry = get_registry()
    work = resolve_workload(workload, shape, dtype, registry.workloads)
    builder_factory = _factory("builder", registry.builders, spec.builder, spec.name)
    runner_factory = _factory("runner", registry.runners, spec.runner, spec.name)
    if spec.runner == "local":
        check_runs_here(spec)

    started = time.perf_counter()
    rng = Rng(seed)
    space = generate_space(work, spec, modules=modules, seed=seed)
    with tempfile.TemporaryDirectory(prefix="probtune-") as scratch:
        db_path = Path(database) if database is not None else Path(scratch) / "tuning.db"
        with Database(db_path) as db:
            workload_id = db.commit_workload(work.key, work.mod)
            search = RandomSearch(
                space,
                rng.fork(),
                seen_decisions=db.seen_decision_hashes(workload_id, spec.name),
                seen_programs=db.seen_program_hashes(workload_id, spec.name),
            )
            reference = prepare_reference(work, scratch, seed=seed)
            statuses: Counter[str] = Counter()
            best = db.best(workload_id, spec.name)
            best_latency = best[0].mean_latency if best else None
            measured = 0
            with builder_factory(timeout=build_timeout) as builder, runner_factory(timeout=run_timeout) as runner:
                while measured < trials:
                    batch = search.next_batch(min(batch_size, trials - measured))
                    if not batch:
                        break  # the space has no new program left to offer
                    for candidate, status, latencies, error, build_s, run_s in _measure(
                        batch, builder, runner, reference, spec, scratch
                    ):
                        db.add_record(
                            workload_id,
                            spec.name,
                            candidate.trace.to_json(),
                            candidate.decision_hash,
                            status,
                            latencies,
                            error,
                            program_hash=candidate.program_hash,
                            build_seconds=build_s,
                            run_seconds=run_s,
                        )
                        measured += 1
                        statuses[status] += 1
                        latency = sum(latencies) / len(latencies) if status == "ok" and latencies else None
                        if latency is not None and (best_latency is None or latency < best_latency):
                            best_latency = latency
                        if progress is not None:
                            progress(TrialOutcome(measured, trials, status, latency, best_latency, error, work.flops))
            best = db.best(workload_id, spec.name)
    return TuneResult(
        workload=work,
        target=spec,
        database=db_path,
        space=space,
        best=best[0] if best else None,
        measured=measured,
        statuses=statuses,
        seconds=time.perf_counter() - started,
    )


def _measure(
    batch: list[Candidate], builder: Any, runner: Any, reference: Any, spec: TargetSpec, workdir: str
) -> Any:
    """Build the batch, then time what built; yield each candidate's outcome as soon as it is known."""
    built = dict(builder.build([c.mod for c in batch], spec.tvm_target, workdir))
    runnable = [i for i in range(len(batch)) if built[i].artifact is not None]
    for index in range(len(batch)):
        if built[index].artifact is None:
            yield batch[index], "build_error", (), built[index].error, built[index].seconds, None
    artifacts = [built[i].artifact for i in runnable]
    for position, result in runner.run(reference, artifacts, spec.tvm_target):
        index = runnable[position]
        yield batch[index], result.status, result.latencies, result.error, built[index].seconds, result.seconds
        Path(artifacts[position]).unlink(missing_ok=True)


def compile_best(
    workload: str | Workload | tvm.IRModule | tvm.tirx.PrimFunc,
    target: str | TargetSpec,
    database: str | Path,
    *,
    shape: Sequence[int] | str | None = None,
    dtype: str = "float32",
) -> Any:
    """Compile ``workload`` with the best schedule recorded for ``target`` in ``database``."""
    spec = resolve_target(target)
    work = resolve_workload(workload, shape, dtype, get_registry().workloads)
    with Database(database) as db:
        row = db.find_workload(work.mod)
        best = db.best(row.id, spec.name) if row else []
    if not best:
        raise LookupError(f"{database} holds no correct record of {work.key} on {spec.name}")
    space = generate_space(work, spec)
    program = space.program(Trace.from_json(best[0].trace_json))
    return tvm.compile(program, target=tvm.target.Target(spec.tvm_target))
