"""Measurement bundles: candidates built here, measured on a device that no runner reaches, recorded here.

:func:`write_bundle` draws a batch of new candidates of one workload (the
evolutionary search guided by the cost model, as :func:`probtune.tune` does),
builds them for the target and writes them into a folder with their
reference and the stand-alone script that measures them
(:mod:`probtune.measure.run_bundle`); candidates that fail to build are
recorded at once. On the device: ``python BUNDLE/run_bundle.py``. Then
:func:`import_results` records what the device measured, as a local run
records it, and trains the cost model on it: the next bundle goes on from
there. Records are kept under the target and the device named when the
bundle was written. Writing is a round of the one tuning loop
(:func:`probtune.task.driver.drive`) through a :class:`BundlePipeline`, whose
rounds are written into folders instead of timed; a model's round
(:mod:`probtune.model.rounds`) drives its tasks through one.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tvm

from probtune._core import Trace
from probtune.database.database import Database
from probtune.database.measure_key import MeasureKey
from probtune.defaults import BATCH_SIZE, BUILD_TIMEOUT, BUNDLE_REFERENCE_MB, COST_MODEL
from probtune.errors import NOT_REPLAYABLE, TuningConfigError
from probtune.interfaces import Builder, CostModel, DeviceCode, TargetSpec
from probtune.measure import bundle_runtimes, run_bundle, timing
from probtune.measure.codegen import device_type
from probtune.measure.pipeline import build, lent_workers, load_cost_model_state, make_builder, resolve_cost_model
from probtune.measure.results import MeasureReference, MeasureStatus
from probtune.measure.runner import CPU_DEVICE
from probtune.plugins import get_registry
from probtune.search.strategies import EVOLUTIONARY
from probtune.space.design_space import Candidate
from probtune.space.space_generator import generate_space
from probtune.targets import resolve_target
from probtune.task.driver import drive
from probtune.task.session import TaskSession
from probtune.task.task import Task
from probtune.task.task_scheduler import RoundRobinScheduler
from probtune.workloads.catalog import resolve_workload
from probtune.workloads.workload import Workload

__all__ = [
    "BundleImport",
    "BundlePipeline",
    "BundleWritten",
    "carry_runtimes",
    "device_code_of",
    "drive_bundles",
    "import_results",
    "new_folder",
    "open_bundle_pipeline",
    "write_bundle",
    "write_device_code",
    "write_manifest",
    "write_reference",
]

SAMPLED_POSITIONS = 1 << 18  # of each output of a reference too large to carry whole: a wrong 16x16 tile is
# missed with probability (1 - 2**18 / size)**256, 2% for a 4096x4096 output
REPEAT = 3  # timings per candidate, each lasting MIN_REPEAT_MS: the local runner's
MIN_REPEAT_MS = 50.0
WARMUP = 1
FILL_ROUNDS = 4  # further search rounds at most that fill a bundle the search offered too few candidates for


@dataclass(frozen=True)
class BundleWritten:
    """What :func:`write_bundle` wrote: the folder, the records' key, the candidates in it and those that failed to build."""

    path: Path
    measured_on: str
    candidates: int
    build_errors: int


@dataclass(frozen=True)
class BundleImport:
    """What :func:`import_results` recorded: by status, and the candidates left unmeasured (offered again later)."""

    measured_on: str
    device: str  # as the bundle's runner described it
    statuses: Counter[str]
    already_recorded: int
    unmeasured: int
    best_latency: float | None


def write_bundle(
    workload: str | Workload | tvm.IRModule,
    output: str | Path,
    *,
    device: str,
    target: str | TargetSpec = "host",
    database: str | Path,
    candidates: int = BATCH_SIZE,
    shape: Sequence[int] | str | None = None,
    dtype: str = "float32",
    seed: int = 0,
    cost_model: str | CostModel = COST_MODEL,
    cache_flush: bool = False,
    build_timeout: float = BUILD_TIMEOUT,
    reference_mb: float = BUNDLE_REFERENCE_MB,
) -> BundleWritten:
    """Write a bundle of up to ``candidates`` new candidates of ``workload`` into ``output`` (a new or empty folder).

    ``device`` names the device the bundle is for: records are kept under
    ``TARGET@DEVICE`` (with ``cache_flush``, ``TARGET+cold-llc@DEVICE``, timed
    cold). Import a bundle's results before writing the next: until then its
    candidates are not in the database, and would be drawn again. A reference
    larger than ``reference_mb`` travels as the seed of its inputs, which the
    device makes again (checked against their digests), and its outputs at
    ``SAMPLED_POSITIONS`` random positions each.
    """
    out = new_folder(output, "bundle")
    if candidates < 1:
        raise TuningConfigError(f"candidates must be at least 1, got {candidates}")
    spec = resolve_target(target)
    work = resolve_workload(workload, shape, dtype, get_registry().workloads)
    model = resolve_cost_model(cost_model, seed)
    with open_bundle_pipeline(spec, database, model, device=device, folders=lambda _: out, cache_flush=cache_flush,
                              seed=seed, build_timeout=build_timeout, reference_mb=reference_mb) as pipeline:
        drive_bundles(pipeline, [Task(work)], candidates, model, seed)
    if work.key in pipeline.refused:
        raise TuningConfigError(pipeline.refused[work.key])
    return pipeline.written[work.key]


def new_folder(output: str | Path, what: str) -> Path:
    """``output`` as a path, refused if it exists and is not an empty folder: a ``what`` is written into a new one."""
    out = Path(output)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TuningConfigError(f"{out} exists and is not an empty folder: a {what} is written into a new one")
    return out


def drive_bundles(pipeline: BundlePipeline, tasks: Sequence[Task], candidates: int, model: CostModel, seed: int) -> None:
    """One bundle of up to ``candidates`` for each of ``tasks`` in turn: the one tuning loop, rounds written, not timed."""
    # A round trip to the device costs more than a search round here: the first bundle is filled too, and a
    # task's one round is its whole bundle (its first round takes all of its share of the budget).
    drive(pipeline, tasks, candidates * len(tasks), RoundRobinScheduler(), strategy=EVOLUTIONARY, cost_model=model,
          batch_size=candidates, confirm=0, seed=seed, search_options={"untrained_share": 1.0}, first_rounds_share=1.0)


@contextlib.contextmanager
def open_bundle_pipeline(
    spec: TargetSpec,
    database: str | Path,
    model: CostModel,
    *,
    device: str,
    folders: Callable[[TaskSession], Path],
    cache_flush: bool = False,
    seed: int = 0,
    build_timeout: float = BUILD_TIMEOUT,
    reference_mb: float = BUNDLE_REFERENCE_MB,
) -> Iterator[BundlePipeline]:
    """A :class:`BundlePipeline` for ``spec`` on ``device``, recording into ``database``; the cost model's state loaded."""
    if cache_flush and device_type(spec) != CPU_DEVICE:
        raise TuningConfigError(f"cache_flush flushes CPU caches; target {spec.name!r} runs on another device")
    with contextlib.ExitStack() as stack:
        db = stack.enter_context(Database(database))
        key = db.measured_on(MeasureKey(spec.name, device, cache_flush), spec.tvm_target)
        load_cost_model_state(model, db, key)
        builder = make_builder(None, spec, build_timeout, stack)
        scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="probtune-bundle-"))
        yield BundlePipeline(db, spec, key, builder, scratch, folders, seed=seed, reference_mb=reference_mb)


class BundlePipeline:
    """A pipeline (:class:`~probtune.measure.pipeline.Pipeline`) whose rounds are written as bundles, not timed.

    A task's round draws candidates as a local round does, builds them,
    records those that fail to build, and writes the rest with the task's
    reference and the stand-alone script into the task's folder
    (``folders(session)``); :func:`import_results` later records what the
    device measured. A task gets one bundle: a later round of it takes nothing.
    """

    def __init__(
        self, db: Database, target: TargetSpec, key: MeasureKey, builder: Builder, workdir: str,
        folders: Callable[[TaskSession], Path], *, seed: int, reference_mb: float,
    ) -> None:
        self.db = db
        self.target = target
        self.key = key
        self.builder = builder
        self.workdir = workdir
        self.folders = folders
        self.seed = seed
        self.reference_mb = reference_mb
        self.written: dict[str, BundleWritten] = {}  # by workload key, in the order written
        self.refused: dict[str, str] = {}  # by workload key: why the task has no bundle

    @property
    def realize_helpers(self) -> Any:
        return lent_workers(self.builder)

    def round(self, session: TaskSession, size: int) -> int:
        if session.name in self.written or session.name in self.refused:
            return 0
        batch = _filled_batch(session, size)
        if not batch:
            self.refused[session.name] = f"the space of {session.name} has no candidate left that {self.key} has not measured"
            return 0
        self.written[session.name] = self._write(session, batch, new_folder(self.folders(session), "bundle"))
        return len(batch)

    def confirm(self, session: TaskSession, top: int) -> None:
        raise TuningConfigError("a bundle round times nothing here: its records are timed again on the device")

    def _write(self, session: TaskSession, batch: list[Candidate], out: Path) -> BundleWritten:
        """Build ``batch``, record what fails to build, write the rest as a bundle into ``out``."""
        spec, key = self.target, self.key
        programs = [session.form(c.program)[0] for c in batch]
        built, runnable = build(programs, self.builder, spec, self.workdir)
        kind, codes, failed = _device_codes(spec, programs, runnable)
        for index in sorted(set(range(len(batch))) - set(runnable) | set(failed)):
            candidate = batch[index]
            self.db.add_record(session.workload_id, key, candidate.trace.to_json(), candidate.decision_hash,
                               MeasureStatus.BUILD_ERROR, (), failed.get(index, built[index].error),
                               program_hash=candidate.program_hash, build_seconds=built[index].seconds)
        runnable = [i for i in runnable if i not in failed]
        entries = _write_candidates(out, [(batch[i], built[i], codes.get(i)) for i in runnable], kind)
        reference = write_reference(session.form.reference, out / "reference.npz", self.seed, self.reference_mb,
                                    session.workload.index_extents)
        write_manifest(out, session.workload, spec, entries, reference, measured_on=key.text,
                       cache_flush=key.cold, device_code=kind)
        return BundleWritten(out, key.text, len(entries), len(batch) - len(entries))


def _filled_batch(session: TaskSession, size: int) -> list[Candidate]:
    """Up to ``size`` new candidates: the search is asked again while it offers some but fewer than asked.

    A search round may offer fewer (mutants that are programs met before): a
    round trip to the device costs more than another search round here.
    """
    batch = session.next_batch(size)
    for _ in range(FILL_ROUNDS):
        if not batch or len(batch) >= size or not (more := session.next_batch(size - len(batch))):
            break
        batch += more
    return batch


def import_results(bundle: str | Path, database: str | Path, *, cost_model: str | CostModel = COST_MODEL, seed: int = 0) -> BundleImport:
    """Record the results that the bundle's runner wrote in ``database``, and train the cost model on them.

    Importing twice records nothing twice. A malformed results file is refused
    before anything is recorded.
    """
    folder = Path(bundle)
    manifest = _read_manifest(folder)
    try:
        header, results = run_bundle.read_results(folder / run_bundle.RESULTS)
    except (OSError, ValueError, KeyError) as exc:
        raise TuningConfigError(f"{folder}: no readable results ({exc}); run run_bundle.py in it on the device first") from exc
    entries = {entry["id"]: entry for entry in manifest["candidates"]}
    unknown = sorted(set(results) - set(entries))
    if unknown:
        raise TuningConfigError(f"{folder / run_bundle.RESULTS}: results for candidates {unknown} that the bundle does not hold")
    for row in results.values():
        _check_result(folder, row)
    spec = resolve_target(manifest["target"])
    work = _workload(manifest["workload"])
    key = MeasureKey.parse(manifest["measured_on"])
    model = resolve_cost_model(cost_model, seed)
    statuses: Counter[str] = Counter()
    with Database(database) as db:
        workload_id = db.commit_workload(work.key, work.mod)
        seen = db.seen_decision_hashes(workload_id, key)
        fresh = [(entries[i], results[i]) for i in sorted(results) if entries[i]["decision_hash"] not in seen]
        for entry, row in fresh:
            db.add_record(workload_id, key, entry["trace"], entry["decision_hash"], row["status"],
                          tuple(row["latencies"]), row.get("error"), program_hash=entry["program_hash"],
                          build_seconds=entry["build_seconds"], run_seconds=row.get("seconds"))
            statuses[row["status"]] += 1
        _train(model, db, spec, key, work, fresh)
        best = db.best(workload_id, key)
    return BundleImport(key.text, str(header["device"]), statuses, len(results) - len(fresh),
                        len(entries) - len(results), best[0].mean_latency if best else None)


def write_manifest(
    out: Path,
    work: Workload,
    spec: TargetSpec,
    candidates: list[dict[str, Any]],
    reference: dict[str, Any],
    *,
    measured_on: str,
    cache_flush: bool = False,
    device_code: str | None = None,
) -> None:
    """Write a bundle's manifest and its stand-alone script into ``out``, beside its candidates and reference.

    ``candidates`` are the manifest's entries (``id``, ``artifact``, and where
    the candidates carry device code, ``kernels``: its launch table, with its
    file under the key of its kind) and ``reference`` :func:`write_reference`'s.
    ``device_code`` is that code's kind: the bundle runtimes that launch it
    are carried too. Another tuner's candidates (the benchmarks write
    MetaSchedule's) are bundled so too.
    """
    manifest = {
        "format": run_bundle.FORMAT, "measured_on": measured_on, "target": spec.name, "cache_flush": cache_flush,
        "workload": _describe_workload(work), "device_type": device_type(spec),
        "num_threads": spec.tvm_target.get("num-cores"), "repeat": REPEAT, "min_repeat_ms": MIN_REPEAT_MS,
        "warmup": WARMUP, "candidates": candidates, "reference": reference,
        "runtimes": carry_runtimes(out, device_code),
    }
    (out / run_bundle.MANIFEST).write_text(json.dumps(manifest, indent=1))
    for module in (run_bundle, timing, bundle_runtimes):
        shutil.copyfile(str(module.__file__), out / Path(str(module.__file__)).name)


def carry_runtimes(out: Path, kind: str | None) -> dict[str, str]:
    """Copy into ``out`` the file of every registered bundle runtime that launches device code of ``kind``;
    the manifest's ``runtimes`` (name -> file)."""
    carried = {}
    for name, runtime in sorted(get_registry().bundle_runtimes.items()):
        if kind is not None and kind in runtime.kinds:
            carried[name] = f"runtime_{name}.py"
            shutil.copyfile(runtime.source, out / carried[name])
    return carried


def write_reference(
    reference: MeasureReference, path: Path, seed: int, limit_mb: float = BUNDLE_REFERENCE_MB,
    index_extents: Mapping[int, int] | None = None,
) -> dict[str, Any]:
    """Write a bundle's reference to ``path``, whole or seeded (inputs by seed, outputs sampled); its manifest entry.

    ``reference`` is a task's reference (:func:`~probtune.measure.runner.prepare_reference`),
    computed from the inputs of ``seed`` (integer inputs folded below ``index_extents``, as the workload draws them).
    """
    entry: dict[str, Any] = {"path": path.name, "num_inputs": reference.num_inputs, "rtol": reference.rtol,
                             "atol": reference.atol}
    if Path(reference.path).stat().st_size <= limit_mb * 1e6:
        shutil.copyfile(reference.path, path)
        return entry
    inputs, outputs = timing.read_reference(reference.path, reference.num_inputs)
    specs = [(list(array.shape), array.dtype.name) for array in inputs]
    digests = [timing.sha256(array) for array in inputs]
    extents = dict(index_extents or {})
    if digests != [timing.sha256(array) for array in timing.random_inputs(seed, specs, extents)]:
        raise TuningConfigError(
            f"the reference is {Path(reference.path).stat().st_size / 1e6:.0f} MB, over the bundle's limit of "
            f"{limit_mb:g} MB, and its inputs are not made from a seed: raise the limit to carry it whole"
        )
    rng = np.random.default_rng(seed)
    arrays: dict[str, Any] = {}  # numpy's stub reads a key as its allow_pickle flag
    for index, array in enumerate(outputs):
        positions = np.sort(rng.choice(array.size, min(array.size, SAMPLED_POSITIONS), replace=False))
        arrays[f"positions_{index}"], arrays[f"output_{index}"] = positions, array.reshape(-1)[positions]
    timing.save_arrays(path, arrays)
    entry["seeded"] = {"seed": seed, "inputs": specs, "sha256": digests, "index_extents": sorted(extents.items()),
                       "outputs": [(list(array.shape), array.dtype.name) for array in outputs]}
    return entry


def device_code_of(spec: TargetSpec) -> tuple[Callable[[tvm.IRModule, dict[str, Any]], DeviceCode], str] | None:
    """The target's compiler's ``device_code`` and the kind of code it gives (``device_code_kind``); None where
    it gives none."""
    make: Callable[[tvm.IRModule, dict[str, Any]], DeviceCode] | None = getattr(spec.compiler, "device_code", None)
    if make is None:
        return None
    kind = getattr(spec.compiler, "device_code_kind", None)
    if not isinstance(kind, str) or not kind:
        raise TuningConfigError(f"the compiler of target {spec.name!r} gives device code but names no device_code_kind")
    return make, kind


def _device_codes(
    spec: TargetSpec, programs: list[tvm.IRModule | str], runnable: list[int]
) -> tuple[str | None, dict[int, DeviceCode], dict[int, str]]:
    """Where the target's compiler gives it, the kind of its device code and each candidate's code and launch
    table, for a device without TVM; and why a candidate has none (it stays out of the bundle)."""
    made: dict[int, DeviceCode] = {}
    failed: dict[int, str] = {}
    coded = device_code_of(spec)
    if coded is None:
        return None, made, failed
    device_code, kind = coded
    for index in runnable:
        program = programs[index]
        try:
            made[index] = device_code(tvm.ir.load_json(program) if isinstance(program, str) else program, spec.tvm_target)
        except Exception as exc:  # noqa: BLE001 - a candidate that cannot be carried is a result, recorded
            failed[index] = f"not carried by the bundle: {timing.describe_error(exc)}"
    return kind, made, failed


def _write_candidates(out: Path, built: list[tuple[Any, Any, DeviceCode | None]], kind: str | None) -> list[dict[str, Any]]:
    """Copy the built candidates (and their device code, of ``kind``) into ``out/candidates``; their manifest entries."""
    (out / "candidates").mkdir(parents=True, exist_ok=True)
    entries = []
    for index, (candidate, result, code) in enumerate(built):
        artifact = Path("candidates") / f"{index}{Path(str(result.artifact)).suffix}"
        shutil.copyfile(result.artifact, out / artifact)
        entry = {"id": index, "artifact": str(artifact), "trace": candidate.trace.to_json(),
                 "decision_hash": candidate.decision_hash, "program_hash": candidate.program_hash,
                 "build_seconds": result.seconds}
        if code is not None and kind is not None:
            entry["kernels"] = write_device_code(code, kind, out, Path("candidates") / str(index))
        entries.append(entry)
    return entries


def write_device_code(code: DeviceCode, kind: str, out: Path, stem: Path) -> dict[str, Any]:
    """Write ``code`` to ``out/STEM.KIND``; its launch table, naming that file (relative to ``out``) under ``kind``."""
    path = stem.with_name(f"{stem.name}.{kind}")
    (out / path).write_bytes(code.code)
    return {kind: path.as_posix(), **code.table}


def _describe_workload(work: Workload) -> dict[str, Any]:
    """How the importing process finds the workload again: its catalog entry, or its program."""
    if work.shape is not None:
        return {"name": work.name, "shape": list(work.shape), "dtype": work.dtype}
    return {"name": work.name, "program": tvm.ir.save_json(work.mod)}


def _workload(described: dict[str, Any]) -> Workload:
    if "program" in described:
        return Workload.from_module(tvm.ir.load_json(described["program"]), name=described["name"])
    return resolve_workload(described["name"], described["shape"], described["dtype"], get_registry().workloads)


def _read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / run_bundle.MANIFEST
    if not path.is_file():
        raise TuningConfigError(f"{folder} is not a measurement bundle: it has no {run_bundle.MANIFEST}")
    try:
        manifest: dict[str, Any] = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise TuningConfigError(f"{path}: not JSON ({exc.msg})") from None
    if manifest.get("format") != run_bundle.FORMAT:
        raise TuningConfigError(f"{path}: format {manifest.get('format')!r}, this probtune reads {run_bundle.FORMAT}")
    return manifest


def _check_result(folder: Path, row: dict[str, Any]) -> None:
    """Refuse a result row that the database would not take, naming it."""
    status, latencies = row.get("status"), row.get("latencies")
    statuses = {MeasureStatus.OK, MeasureStatus.WRONG_RESULT, MeasureStatus.RUN_ERROR, MeasureStatus.CRASH}
    good = status in statuses and isinstance(latencies, list) and all(
        isinstance(t, (int, float)) and t > 0 for t in latencies
    )
    if not good or (status == MeasureStatus.OK) != bool(latencies):
        raise TuningConfigError(
            f"{folder / run_bundle.RESULTS}: the result of candidate {row.get('id')} is malformed "
            f"(status {status!r}, latencies {latencies!r}); nothing was recorded"
        )


def _train(
    model: CostModel, db: Database, spec: TargetSpec, key: MeasureKey, work: Workload,
    fresh: list[tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    """Update the cost model (its saved state under ``key``) with the new results on ``spec``, as a search round does."""
    load_cost_model_state(model, db, key)
    space = generate_space(work, spec)
    programs, latencies = [], []
    for entry, row in fresh:
        try:
            programs.append(space.program(Trace.from_json(entry["trace"])))
        except NOT_REPLAYABLE:  # a space changed since the bundle was written: recorded, not learned from
            continue
        ok = row["status"] == MeasureStatus.OK
        latencies.append(sum(row["latencies"]) / len(row["latencies"]) if ok else None)
    if programs:
        model.update(model.featurize(programs), latencies, [work.key] * len(programs))
        db.save_cost_model(model.name, key, model.save())

