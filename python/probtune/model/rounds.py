"""A model tuned on a device reached only by files, in rounds: each round one folder, brought back and imported.

:func:`write_model_round` fuses the model for the target (in its precision),
writes a model bundle of it compiled with each task's best record measured on
the device so far (a default program where none is), and, with
``candidates``, a bundle of that many new candidates of every task, each
model's heaviest tasks first: a round of the one tuning loop through a bundle
pipeline (:class:`probtune.measure.bundle.BundlePipeline`), one builder and
cost model for all the tasks. On the device, each task bundle's
``run_bundle.py`` and the model's ``run_model_bundle.py`` run; back here
:func:`import_model_round` records the tasks' results, and the next round goes
on from there.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tvm

from probtune.database.database import Database
from probtune.database.measure_key import MeasureKey
from probtune.defaults import COST_MODEL, MODEL_ROUND_CANDIDATES
from probtune.interfaces import TargetSpec
from probtune.measure import run_bundle
from probtune.measure.bundle import BundleImport, drive_bundles, import_results, new_folder, open_bundle_pipeline
from probtune.measure.pipeline import resolve_cost_model
from probtune.model.bundle import ModelBundleWritten, Tolerance, write_model_bundle
from probtune.model.compile import default_programs
from probtune.model.importer import Model, ShapeArg, load_model
from probtune.model.precision import TOLERANCES, check_precision, convert_precision
from probtune.model.tasks import extract_tasks, fuse
from probtune.space.space_generator import generate_space
from probtune.targets import resolve_target
from probtune.task.session import best_replayable
from probtune.task.task import Task

__all__ = ["ModelRound", "import_model_round", "model_programs", "write_model_round"]

MODEL, TASKS = "model", "tasks"  # a round's folders


@dataclass
class ModelRound:
    """What :func:`write_model_round` wrote: the model bundle, the tasks tuned so far, and the task bundles by folder."""

    path: Path
    model: ModelBundleWritten
    tasks: int
    tuned_tasks: int
    task_bundles: dict[str, int] = field(default_factory=dict)  # folder name -> candidates in it
    refused: dict[str, str] = field(default_factory=dict)  # task -> why it has no bundle this round


def model_programs(
    fused: tvm.IRModule, tasks: list[Task], target: TargetSpec, database: str | Path, device: str, seed: int = 0
) -> tuple[dict[str, tvm.IRModule], int]:
    """Each fused function's program: its task's best record measured on ``device``, else a default program that
    compiles; and how many tasks have such a record."""
    spaces = [(task.functions, generate_space(task.workload, target, seed=seed), task.workload.mod) for task in tasks]
    programs = default_programs(spaces, seed, target)
    tuned = 0
    with Database(database) as db:
        key = db.measured_on(MeasureKey(target.name, device), target.tvm_target)
        for task, (functions, space, _) in zip(tasks, spaces):
            best = best_replayable(db, db.commit_workload(task.workload.key, task.workload.mod), key, space)
            if best is not None:
                programs.update({function: best.program for function in functions})
                tuned += 1
    return programs, tuned


def write_model_round(
    model: Model | str | os.PathLike[str],
    output: str | Path,
    *,
    device: str,
    target: str | TargetSpec,
    database: str | Path,
    candidates: int = MODEL_ROUND_CANDIDATES,
    precision: str = "fp32",
    input_shapes: ShapeArg | None = None,
    seed: int = 0,
) -> ModelRound:
    """Write one round of ``model`` for ``device`` into the new folder ``output`` (see the module's docstring)."""
    out = new_folder(output, "round")
    if not isinstance(model, Model):
        model = load_model(model, input_shapes)
    spec = resolve_target(target)
    check_precision(precision, spec)
    fused = fuse(dataclasses.replace(model, mod=convert_precision(model.mod, precision)), spec)
    tasks = extract_tasks(fused)
    programs, tuned = model_programs(fused, tasks, spec, database, device, seed)
    written = write_model_bundle(fused, programs, spec, out / MODEL, name=model.name, inputs=model.inputs,
                                 tolerance=Tolerance(*TOLERANCES[precision]), seed=seed)
    done = ModelRound(out, written, len(tasks), tuned)
    if candidates:
        _write_task_bundles(done, tasks, spec, database, device, candidates, seed)
    return done


def _write_task_bundles(
    done: ModelRound, tasks: list[Task], spec: TargetSpec, database: str | Path, device: str, candidates: int, seed: int
) -> None:
    """A bundle of up to ``candidates`` for each task, in one bundle pipeline; a task whose space the device has
    measured through is refused and the rest go on."""
    folders = {task.workload.key: done.path / TASKS / f"{index:03d}_{task.name[:60]}" for index, task in enumerate(tasks)}
    names = {task.workload.key: task.name for task in tasks}
    cost_model = resolve_cost_model(COST_MODEL, seed)
    with open_bundle_pipeline(spec, database, cost_model, device=device, folders=lambda s: folders[s.name],
                              seed=seed) as pipeline:
        drive_bundles(pipeline, tasks, candidates, cost_model, seed)
    done.task_bundles = {folders[key].name: bundle.candidates for key, bundle in pipeline.written.items()}
    done.refused = {names[key]: why for key, why in pipeline.refused.items()}


def import_model_round(output: str | Path, database: str | Path, **options: Any) -> dict[str, BundleImport]:
    """Record the results of every task bundle of a round that its device measured; by folder name.

    A task bundle without results (the device did not reach it) is left out:
    its candidates are drawn again in a later round.
    """
    found = {}
    for folder in sorted((Path(output) / TASKS).glob("*/")):
        if (folder / run_bundle.RESULTS).is_file():
            found[folder.name] = import_results(folder, database, **options)
    return found
