"""Tune a whole model: its tasks share one trial budget, one measurement pipeline and one cost model."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm

from probtune.defaults import (
    BATCH_SIZE,
    BUILD_TIMEOUT,
    CONFIRM,
    COST_MODEL,
    MODEL_TRIALS,
    RUN_TIMEOUT,
    SCHEDULER,
)
from probtune.errors import ModelCompileError
from probtune.interfaces import Builder, CostModel, GraphRewrite, Runner, TargetSpec
from probtune.measure.pipeline import Progress, open_pipeline, resolve_cost_model
from probtune.model.cache_mode import model_cache_flush
from probtune.model.check import check_outputs
from probtune.model.compile import CompiledModel, compile_model, default_programs
from probtune.model.importer import Model, ShapeArg, load_model
from probtune.model.precision import check_precision, convert_precision
from probtune.model.remote import RemoteModel
from probtune.model.rewrites import rewrite_counts
from probtune.model.tasks import extract_tasks, fuse
from probtune.model.thread_count import candidate_counts, choose_threads
from probtune.space.space_generator import generate_space
from probtune.targets import resolve_target
from probtune.task.driver import Driven, drive, make_scheduler, strategy_kind
from probtune.task.task import Task
from probtune.task.task_scheduler import TaskScheduler
from probtune.task.tuning import check_tuning_options

__all__ = ["ModelTuneResult", "TaskRow", "tune_model"]

TUNED, DEFAULT = "tuned", "default"
log = logging.getLogger("probtune.model")
"""What a model's run is doing outside its trials (compiling, confirming, checking), at INFO; the CLI shows it."""


@dataclass(frozen=True)
class TaskRow:
    """One task in a model's tuning result.

    ``program`` is "tuned" (its best correct record) or "default" (no
    correct record: a valid draw of its space, never measured).
    ``best_latency`` is the record's mean in seconds (None for a default);
    ``share`` its weighted part of the model's estimated time.
    """

    name: str
    weight: int
    flops: float | None
    trials: int  # this run's
    total_trials: int  # in the database, this run's included
    best_latency: float | None
    share: float | None
    program: str


@dataclass
class ModelTuneResult:
    """What tuning a model found: a row per task, and the programs :meth:`compile` puts in the model."""

    model: Model
    target: TargetSpec
    database: Path
    fused: tvm.IRModule
    tasks: list[TaskRow]
    trials: int
    seconds: float
    search_seconds: float
    measure_seconds: float
    programs: dict[str, tvm.IRModule]  # fused PrimFunc name -> its program
    precompiled: tuple[Any, int, int] | None = None  # compile_model's result, where it was made of these programs
    precision: str = "fp32"  # what the model was compiled in (probtune.model.precision)

    @property
    def graph_rewrites(self) -> dict[str, int]:
        """Operators each of the target's graph rewrites changed in the model (none rewritten: absent)."""
        return rewrite_counts(self.fused)

    @property
    def estimated_latency(self) -> float | None:
        """Sum of weight x best latency over the tuned tasks; None if any task has no measured program."""
        total = 0.0
        for row in self.tasks:
            if row.best_latency is None:
                return None
            total += row.weight * row.best_latency
        return total

    def compile(
        self, *, check: bool = True, num_threads: int | None = None, seed: int = 0, on: Any = None
    ) -> CompiledModel | RemoteModel:
        """The model with every task's program in place, compiled, running on the target's cores.

        Run here with ``num_threads`` None, it is timed on fewer threads too and
        keeps the fastest count (:mod:`probtune.model.thread_count`): ``compiled.thread_choice``.

        With ``check``, its outputs on random inputs are compared with the
        reference's (onnxruntime for an ONNX model, else the untuned build): a
        mismatch raises :class:`~probtune.errors.ModelCheckError`; the report is ``compiled.check``.
        ``on`` a runner with ``request_session`` (an ``RPCRunner``): the model is
        uploaded to one of its servers and runs, is checked and timed there.
        A model TVM cannot compile raises :class:`~probtune.errors.ModelCompileError`;
        the tuned records stay in the database.
        """
        log.info("compiling the model with the programs of its %d tasks", len(self.tasks))
        try:
            executable, prepacked, in_place = self.precompiled or compile_model(self.fused, self.programs, self.target)
        except ModelCompileError as exc:
            raise ModelCompileError(
                f"{exc}. The tuned records are kept in {self.database}: to compile again without tuning, run "
                f"tune_model with trials=0 (probtune tune-model ... --trials 0 --database {self.database})"
            ) from exc
        threads = num_threads or self.target.num_cores
        compiled: CompiledModel | RemoteModel
        if on is not None:
            compiled = RemoteModel(executable, self.model.inputs, self.target, on.request_session(), threads)
        else:
            compiled = CompiledModel.linked(executable, self.model.inputs, threads, self.target.compiler)
        compiled.prepacked = prepacked
        compiled.in_place = in_place
        if check:
            log.info("checking the compiled model's outputs against %s",
                     "onnxruntime" if self.model.onnx_model is not None else "the untuned build")
        compiled.check = check_outputs(self.model, compiled, seed=seed, precision=self.precision) if check else None
        if num_threads is None and isinstance(compiled, CompiledModel) and len(candidate_counts(threads)) > 1:
            log.info("timing the compiled model on %s threads", " and ".join(map(str, candidate_counts(threads))))
            log.info("the compiled model %s", choose_threads(compiled, self.model.random_inputs(seed), threads))
        return compiled

    def table(self) -> str:
        """The per-task table, as MetaSchedule's task scheduler prints it."""
        head = f"{'#':>3}  {'task':<40} {'weight':>6} {'trials':>7} {'total':>6} {'latency (ms)':>13} {'share':>6}  program"
        lines = [head, "-" * len(head)]
        for index, row in enumerate(self.tasks):
            latency = "-" if row.best_latency is None else f"{row.best_latency * 1e3:.4f}"
            share = "-" if row.share is None else f"{row.share:.1%}"
            lines.append(
                f"{index:>3}  {row.name[:40]:<40} {row.weight:>6} {row.trials:>7} {row.total_trials:>6} "
                f"{latency:>13} {share:>6}  {row.program}"
            )
        return "\n".join(lines)


def tune_model(
    model: Model | str | os.PathLike[str] | tvm.IRModule,
    target: str | TargetSpec = "host",
    trials: int = MODEL_TRIALS,
    *,
    input_shapes: ShapeArg | None = None,
    database: str | Path | None = None,
    seed: int = 0,
    batch_size: int = BATCH_SIZE,
    scheduler: str | TaskScheduler = SCHEDULER,
    strategy: str = "evolutionary",
    cost_model: str | CostModel = COST_MODEL,
    search_options: dict[str, Any] | None = None,
    build_timeout: float = BUILD_TIMEOUT,
    run_timeout: float = RUN_TIMEOUT,
    confirm: int = CONFIRM,
    cache_flush: bool | None = None,
    progress: Progress | None = None,
    builder: str | Builder | None = None,
    runner: str | Runner | None = None,
    graph_rewrites: Sequence[str | GraphRewrite] | None = None,
    precision: str = "fp32",
) -> ModelTuneResult:
    """Tune every task of ``model`` for ``target`` with ``trials`` new measurements in all, recorded in ``database``.

    ``model`` is a :class:`Model`, an ONNX file's path (``input_shapes`` as
    for :func:`load_model`) or a Relax module. Each task first gets a round
    (when ``trials`` allows; a task that gets none is compiled with a default
    program, with a warning), then ``scheduler`` ("gradient" or
    "round-robin") gives the rest where it cuts the model's latency most. A
    database that already holds records of a task (from this model or
    another) is continued, and its cost model goes on learning. With
    ``cache_flush``, tasks are timed with cold caches (records apart from warm
    ones: :func:`~probtune.measure.pipeline.open_pipeline`); None times them as
    the model finds its data, cold where its weights outgrow the last-level cache
    (:func:`~probtune.model.cache_mode.model_cache_flush`), or takes a runner object's own setting.
    ``builder`` and ``runner`` are as for :func:`probtune.tune`.
    ``graph_rewrites`` names the graph rewrites applied to the model before it
    is fused into tasks (registered names or rewrite objects); None is the
    target's (``TargetSpec.graph_rewrites``). ``precision`` "fp16" or "bf16"
    computes a float32 model's products in float16 or bfloat16 with float32 sums
    (:mod:`probtune.model.precision`; bf16 where the target offers it, ``TargetSpec.precisions``);
    its outputs are then checked with that precision's tolerance.

    Before the first trial the model is compiled once with each task's
    default program, so that a model TVM cannot compile raises
    :class:`~probtune.errors.ModelCompileError` before the budget is spent.
    ``trials=0`` tunes nothing: the model takes the database's best programs.
    """
    check_tuning_options(trials, batch_size, confirm, strategy, minimum_trials=0)
    started = time.perf_counter()
    if not isinstance(model, Model):
        model = load_model(model, input_shapes)
    spec = resolve_target(target)
    check_precision(precision, spec)
    chooser = make_scheduler(scheduler)
    fused = fuse(dataclasses.replace(model, mod=convert_precision(model.mod, precision)), spec, graph_rewrites)
    tasks = extract_tasks(fused)
    fallback, precompiled = _compile_before_tuning(fused, tasks, spec, seed)
    kind = strategy_kind(strategy)
    cost = resolve_cost_model(cost_model, seed) if kind.uses_cost_model else None
    if cache_flush is None and (runner is None or isinstance(runner, str)):
        cache_flush, why = model_cache_flush(fused, tasks, spec, database, runner)
        log.info("timing tasks %s: %s", "with the caches flushed" if cache_flush else "warm", why)
    with open_pipeline(spec, database, cost, trials=trials, build_timeout=build_timeout, run_timeout=run_timeout,
                       progress=progress, cache_flush=cache_flush, builder=builder, runner=runner) as pipeline:
        driven = drive(pipeline, tasks, trials, chooser, strategy=kind, cost_model=cost, batch_size=batch_size,
                       confirm=confirm, seed=seed, search_options=search_options)
    rows, programs = _results(driven, fallback)
    search_seconds = sum(outcome.search_seconds for outcome in driven.outcomes)
    untuned = all(programs[name] is fallback[name] for name in programs)  # the model compiled before tuning
    return ModelTuneResult(
        model, spec, pipeline.db.path, fused, rows, driven.spent, time.perf_counter() - started,
        search_seconds, pipeline.measure_seconds, programs, precompiled if untuned else None, precision,
    )


def _compile_before_tuning(
    fused: tvm.IRModule, tasks: list[Task], spec: TargetSpec, seed: int
) -> tuple[dict[str, tvm.IRModule], tuple[Any, int, int]]:
    """Each task's default program, and the model compiled with them: what cannot compile fails before any trial.

    Where the model does not compile, each default program is made again from
    draws that compile alone (or TVM's unscheduled loops), and the model once more.
    """
    log.info("compiling the model once with default programs (%d tasks), to find what cannot compile before tuning",
             len(tasks))
    entries = [(task.functions, generate_space(task.workload, spec, seed=seed), task.workload.mod) for task in tasks]
    fallback = default_programs(entries, seed)
    try:
        return fallback, compile_model(fused, fallback, spec)
    except ModelCompileError:
        log.info("the model did not compile with them: drawing default programs that compile alone")
    fallback = default_programs(entries, seed, spec)
    try:
        return fallback, compile_model(fused, fallback, spec)
    except ModelCompileError as exc:
        raise ModelCompileError(
            f"{exc}. Found by compiling the model with default programs before tuning: no trial was spent. Replace "
            "the operator it names in the model (or report it), or try another target"
        ) from exc


def _results(driven: Driven, fallback: dict[str, tvm.IRModule]) -> tuple[list[TaskRow], dict[str, tvm.IRModule]]:
    """A row per task and the program of each fused PrimFunc: its best correct record's, or its ``fallback``."""
    programs: dict[str, tvm.IRModule] = {}
    latencies: list[float | None] = []
    for outcome in driven.outcomes:
        best = outcome.best
        programs.update({name: best.program if best else fallback[name] for name in outcome.task.functions})
        latencies.append(best.record.mean_latency if best else None)
    total = sum(o.task.weight * t for o, t in zip(driven.outcomes, latencies) if t is not None)
    rows = [
        TaskRow(
            o.task.name, o.task.weight, o.task.workload.flops, o.trials, o.total_trials, latency,
            o.task.weight * latency / total if latency is not None and total else None,
            TUNED if latency is not None else DEFAULT,
        )
        for o, latency in zip(driven.outcomes, latencies)
    ]
    return rows, programs
