"""probtune and TVM MetaSchedule tuning float16 GPU kernels measured through bundles on a GPU, against cuBLAS and cuDNN.

Nothing here needs a GPU: each round's candidates are built here and
measured elsewhere, as ``probtune bundle`` is meant to be used. probtune
writes its bundles with :func:`probtune.write_bundle` and learns from each
round's results (``import_results``); MetaSchedule runs its own tuner
(``tune_tir``: evolutionary search, XGBoost cost model) in a background
process per workload, its builder probtune's CUDA compiler (the same NVRTC
build and lint) and its runner a bundle writer that waits for the round's
results. Both use the same number of candidates per round. The rounds::

    python bench/cuda_gpu.py start --rounds 2              # here: MetaSchedule's tuners, in the background
    python bench/cuda_gpu.py prepare 1                     # here: probtune's bundles (waits for MetaSchedule's)
    python3 bench/gpu_measure.py .gpu/round1 --out OUT     # on the GPU machine: bundles, then PyTorch
    python bench/cuda_gpu.py collect 1 OUT/round1.tar.gz   # here: results in, probtune learns, MetaSchedule goes on
    ...                                                    # round 2, ...
    python bench/cuda_gpu.py report                        # bench/results/cuda_gpu.json

Everything lives under ``.gpu/`` (``--root``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import tvm
import tvm.s_tir.meta_schedule as ms
from common import cpu_model, program_kind
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerResult

from probtune import Trace
from probtune.measure import run_bundle, timing
from probtune.measure.bundle import import_results, write_bundle, write_manifest, write_reference
from probtune.measure.runner import prepare_reference
from probtune.space.space_generator import generate_space
from probtune.targets import resolve_target
from probtune.workloads.catalog import resolve_workload
from probtune.workloads.workload import Workload

ROOT = Path(__file__).resolve().parent.parent / ".gpu"
RESULTS = Path(__file__).resolve().parent / "results"
WORKLOADS = ("matmul:4096,4096,4096:float16", "dense_bias_gelu:128,3072,768:float16")
"""``name:shape:dtype``: the issue's two, an LLM-sized GEMM and BERT-base's feed-forward dense + GELU."""
DEVICE = "gpu"  # probtune's records are kept under TARGET@gpu
SYSTEMS = ("probtune", "metaschedule")
COLLECTED = "collected"  # marks a round's results as in: MetaSchedule's waiting runner reads them then
PREPARED = "prepared.json"  # beside a bundle's manifest: who wrote it, and what failed to build


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--target", default="cuda-sm90")
    parser.add_argument("--workload", dest="workloads", action="append",
                        help="name:shape:dtype, once per workload (default: the two of WORKLOADS)")
    parser.add_argument("--candidates", type=int, default=64, help="per round, per system and workload")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--systems", type=_systems, default=SYSTEMS,
                        help="who tunes, comma-separated (start, prepare, collect: default both); "
                             "the report shows every system's bundles it finds")
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="MetaSchedule's tuners, one background process per workload")
    start.add_argument("--rounds", type=int, default=2)
    tune = sub.add_parser("metaschedule", help="(started by 'start') MetaSchedule's tuner for one workload")
    tune.add_argument("workload")
    tune.add_argument("--rounds", type=int, default=2)
    prepare = sub.add_parser("prepare", help="probtune's bundles of a round")
    prepare.add_argument("round", type=int)
    collect = sub.add_parser("collect", help="a round's results, measured on the GPU")
    collect.add_argument("round", type=int)
    collect.add_argument("archive", type=Path, help="the ROUND.tar.gz gpu_measure.py wrote")
    report = sub.add_parser("report", help="every collected round, in a table and bench/results/cuda_gpu.json")
    report.add_argument("--output", type=Path, default=RESULTS / "cuda_gpu.json")
    args = parser.parse_args()
    args.workloads = args.workloads or list(WORKLOADS)
    warnings.simplefilter("ignore")
    return {"start": _start, "metaschedule": _metaschedule, "prepare": _prepare, "collect": _collect,
            "report": _report}[args.command](args)


def _systems(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names or set(names) - set(SYSTEMS):
        raise argparse.ArgumentTypeError(f"systems are {', '.join(SYSTEMS)}, comma-separated; got {text!r}")
    return names


def _workload(item: str) -> Workload:
    name, shape, dtype = item.split(":")
    return resolve_workload(name, shape, dtype)


def _slug(work: Workload) -> str:
    return f"{work.name}-{'x'.join(map(str, work.shape or ()))}-{work.dtype}"


def _round(root: Path, number: int) -> Path:
    return root / f"round{number}"


def _start(args: argparse.Namespace) -> int:
    (args.root / "state").mkdir(parents=True, exist_ok=True)
    for item in args.workloads if "metaschedule" in args.systems else []:
        log = _tuner_log(args.root, _workload(item))
        command = [sys.executable, __file__, "--root", str(args.root), "--target", args.target,
                   "--candidates", str(args.candidates), "--seed", str(args.seed),
                   "metaschedule", item, "--rounds", str(args.rounds)]
        with log.open("w") as out:
            tuner = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        log.with_suffix(".pid").write_text(str(tuner.pid))
        print(f"MetaSchedule tuning {item} in the background: {log}")
    return 0


def _prepare(args: argparse.Namespace) -> int:
    folder = _round(args.root, args.round)
    (args.root / "state").mkdir(parents=True, exist_ok=True)  # probtune's database; 'start' made it if MetaSchedule tunes
    for item in args.workloads if "probtune" in args.systems else []:
        work = _workload(item)
        out = folder / f"{_slug(work)}-probtune"
        if out.exists():  # a round prepared again: what was written stands
            continue
        started = time.perf_counter()
        written = write_bundle(work, out, device=DEVICE, target=args.target, database=args.root / "state" / "probtune.db",
                               candidates=args.candidates, seed=args.seed + args.round - 1)
        seconds = time.perf_counter() - started
        _prepared(out, "probtune", written.candidates, written.build_errors, seconds)
        print(f"{out.name}: {written.candidates} candidates, {written.build_errors} failed to build, {seconds:.0f} s")
    for item in args.workloads if "metaschedule" in args.systems else []:  # MetaSchedule's tuner writes its own
        work = _workload(item)
        out = folder / f"{_slug(work)}-metaschedule"
        while not (out / PREPARED).exists():
            if not _alive(int(_tuner_log(args.root, work).with_suffix(".pid").read_text())):
                raise SystemExit(f"MetaSchedule's tuner of {item} ended without writing round {args.round}: "
                                 f"see {_tuner_log(args.root, work)}")
            time.sleep(5)
        print(f"{out.name}: {json.loads((out / PREPARED).read_text())}")
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(f"{folder}: {size / 1e6:.1f} MB")
    return 0


def _tuner_log(root: Path, work: Workload) -> Path:
    return root / "state" / f"metaschedule-{_slug(work)}.log"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _prepared(out: Path, system: str, candidates: int, build_errors: int, seconds: float) -> None:
    (out / PREPARED).write_text(json.dumps({"system": system, "candidates": candidates, "build_errors": build_errors,
                                            "seconds": round(seconds, 1)}))


def _collect(args: argparse.Namespace) -> int:
    folder = _round(args.root, args.round)
    with tarfile.open(args.archive) as tar:
        tar.extractall(folder, filter="data")
    for item in args.workloads:
        slug = _slug(_workload(item))
        probtune = folder / f"{slug}-probtune"
        if "probtune" in args.systems:
            done = import_results(probtune, args.root / "state" / "probtune.db")
            print(f"{probtune.name}: {dict(done.statuses)}; best so far "
                  f"{done.best_latency * 1e3 if done.best_latency else float('nan'):.4f} ms")
        if "metaschedule" in args.systems:
            (folder / f"{slug}-metaschedule" / COLLECTED).write_text("")  # its waiting runner goes on
    return 0


def _metaschedule(args: argparse.Namespace) -> int:
    """MetaSchedule's tuner for one workload, measuring through bundles: it waits for each round's results."""
    work, spec = _workload(args.workload), resolve_target(args.target)
    failed = {"builds": 0}  # since the last round's bundle was written
    builder = _BundleBuilder(spec, failed)
    runner = _BundleRunner(args.root, work, spec, failed, args.seed)
    ms.tir_integration.tune_tir(
        work.mod, tvm.target.Target(dict(spec.tvm_target)), str(args.root / "state" / f"metaschedule-{_slug(work)}"),
        max_trials_global=args.rounds * args.candidates, num_trials_per_iter=args.candidates, builder=builder,
        runner=runner, seed=args.seed, num_tuning_cores=2,
    )
    print("MetaSchedule's tuning is done", flush=True)
    return 0


@derived_object
class _BundleBuilder(PyBuilder):
    """MetaSchedule's candidates built as probtune's: TVM's CUDA code, NVRTC's cubin, the lint, the launch table."""

    def __init__(self, spec: Any, failed: dict[str, int]) -> None:
        self.spec, self.failed = spec, failed

    def build(self, build_inputs: list[Any]) -> list[Any]:
        results = []
        for item in build_inputs:
            try:
                code = self.spec.compiler.device_code(item.mod, dict(self.spec.tvm_target))
            except Exception as error:  # noqa: BLE001 - a candidate that fails to build is MetaSchedule's result
                self.failed["builds"] += 1
                results.append(BuilderResult(None, timing.describe_error(error)))
                continue
            folder = Path(tempfile.mkdtemp(prefix="probtune-ms-"))  # MetaSchedule removes each artifact's folder
            (folder / "kernel.cubin").write_bytes(code.code)
            (folder / "table.json").write_text(json.dumps(code.table))
            results.append(BuilderResult(str(folder / "table.json"), None))
        return results


@derived_object
class _BundleRunner(PyRunner):
    """Each batch MetaSchedule sends is written as a bundle of the next round; its futures wait for the results."""

    def __init__(self, root: Path, work: Workload, spec: Any, failed: dict[str, int], seed: int) -> None:
        self.root, self.work, self.spec, self.failed, self.seed, self.rounds = root, work, spec, failed, seed, 0
        self.started = time.time()

    def run(self, runner_inputs: list[Any]) -> list[Any]:
        self.rounds += 1
        out = _round(self.root, self.rounds) / f"{_slug(self.work)}-metaschedule"
        (out / "candidates").mkdir(parents=True, exist_ok=True)
        entries = []
        for index, item in enumerate(runner_inputs):
            table_path = Path(str(item.artifact_path))
            shutil.copyfile(table_path.with_name("kernel.cubin"), out / "candidates" / f"{index}.cubin")
            cubin = f"candidates/{index}.cubin"
            entries.append({"id": index, "artifact": cubin,
                            "kernels": {"cubin": cubin, **json.loads(table_path.read_text())}})
        seed = self.seed + self.rounds - 1
        with tempfile.TemporaryDirectory() as scratch:
            reference = write_reference(prepare_reference(self.work, scratch, seed), out / "reference.npz", seed)
        write_manifest(out, self.work, self.spec, entries, reference, measured_on=f"{self.spec.name}@metaschedule",
                       device_code=self.spec.compiler.device_code_kind)
        # The round's time: its search and builds, from the start or the last round's results.
        previous = _round(self.root, self.rounds - 1) / out.name / COLLECTED
        begun = previous.stat().st_mtime if self.rounds > 1 else self.started
        _prepared(out, "metaschedule", len(entries), self.failed["builds"], time.time() - begun)
        self.failed["builds"] = 0
        print(f"round {self.rounds}: {len(entries)} candidates written to {out}", flush=True)
        return [_BundleFuture(out, index) for index in range(len(entries))]


@derived_object
class _BundleFuture(PyRunnerFuture):
    """One candidate's result, once the round's results are collected."""

    def __init__(self, out: Path, index: int) -> None:
        self.out, self.index = out, index

    def done(self) -> bool:
        return (self.out / COLLECTED).exists()

    def result(self) -> Any:
        while not self.done():
            time.sleep(5)
        _, results = run_bundle.read_results(self.out / run_bundle.RESULTS)
        row = results.get(self.index)
        if row is None:
            return RunnerResult(None, "not measured")
        if row["status"] != "ok":
            return RunnerResult(None, f"{row['status']}: {row.get('error')}")
        return RunnerResult([float(t) for t in row["latencies"]], None)


def _report(args: argparse.Namespace) -> int:
    rounds = sorted((p for p in args.root.glob("round*") if (p / "baselines.json").exists()),
                    key=lambda p: int(p.name[5:]))
    rows = []
    for item in args.workloads:
        work = _workload(item)
        row: dict[str, Any] = {"workload": work.key, "gflop": round((work.flops or 0) / 1e9, 3), "rounds": []}
        for folder in rounds:
            vendor, baseline = _baseline(folder, work)
            entry: dict[str, Any] = {"round": int(folder.name[5:]), "vendor": vendor, "vendor_ms": _ms(baseline)}
            for system in SYSTEMS:
                bundle = folder / f"{_slug(work)}-{system}"
                entry[system] = _system_round(bundle, work, baseline) if (bundle / PREPARED).exists() else None
            if entry["probtune"]:
                entry["probtune"]["best_ms_by_kind"] = _best_by_kind(folder / f"{_slug(work)}-probtune", work, args.target)
            row["rounds"].append(entry)
        row["best"] = {system: _best_so_far(row["rounds"], system) for system in SYSTEMS}
        rows.append(row)
        _print_row(row)
    device = json.loads((rounds[-1] / "baselines.json").read_text())["device"] if rounds else None
    report = {"here": cpu_model(), "gpu": device, "target": args.target, "seed": args.seed,
              "candidates_per_round": args.candidates, "workloads": rows}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1))
    print(f"written: {args.output}")
    return 0


def _baseline(folder: Path, work: Workload) -> tuple[str | None, float | None]:
    """The vendor library's name (cuBLAS, cuDNN, through PyTorch) and its median seconds per call for ``work`` this round."""
    for entry in json.loads((folder / "baselines.json").read_text())["baselines"]:
        if entry["workload"]["name"] == work.name and tuple(entry["workload"]["shape"]) == work.shape:
            return entry.get("system"), float(np.median(entry["graph"])) if "graph" in entry else None
    return None, None


def _system_round(bundle: Path, work: Workload, vendor: float | None) -> dict[str, Any]:
    """What one system's bundle of a round gave: statuses, its best correct candidate, against the vendor library."""
    prepared = json.loads((bundle / PREPARED).read_text())
    _, results = run_bundle.read_results(bundle / run_bundle.RESULTS)
    statuses: dict[str, int] = {}
    for row in results.values():
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    means = [float(np.mean(row["latencies"])) for row in results.values() if row["status"] == "ok"]
    best = min(means, default=None)
    return {"built": prepared["candidates"], "build_errors": prepared["build_errors"],
            "build_seconds": prepared["seconds"], "statuses": statuses, "best_ms": _ms(best),
            "correct_ms": sorted(_ms(t) for t in means),
            "tflops": round(work.flops / best / 1e12, 1) if best and work.flops else None,
            "vs_vendor": round(vendor / best, 3) if best and vendor else None}


def _best_by_kind(bundle: Path, work: Workload, target: str) -> dict[str, list[float]]:
    """For each kind of program in probtune's bundle (``mma.sync``, a pipeline, ...), its correct candidates' best and
    median milliseconds, from their traces replayed here."""
    space = generate_space(work, resolve_target(target))
    _, results = run_bundle.read_results(bundle / run_bundle.RESULTS)
    times: dict[str, list[float]] = {}
    for candidate in json.loads((bundle / "manifest.json").read_text())["candidates"]:
        row = results.get(candidate["id"])
        if row is not None and row["status"] == "ok":
            kind = program_kind(space.program(Trace.from_json(candidate["trace"])).script())
            times.setdefault(kind, []).append(float(np.mean(row["latencies"])))
    return {kind: [_ms(min(t)), _ms(float(np.median(t)))] for kind, t in sorted(times.items())}


def _best_so_far(rounds: list[dict[str, Any]], system: str) -> dict[str, Any]:
    found = [(entry[system]["best_ms"], entry) for entry in rounds if entry[system] and entry[system]["best_ms"]]
    if not found:
        return {}
    best_ms, entry = min(found, key=lambda pair: pair[0])
    return {"best_ms": best_ms, "tflops": entry[system]["tflops"], "vs_vendor_same_round": entry[system]["vs_vendor"],
            "trials": sum(e[system]["built"] + e[system]["build_errors"] for e in rounds if e[system])}


def _print_row(row: dict[str, Any]) -> None:
    for entry in row["rounds"]:
        for system in SYSTEMS:
            if (got := entry[system]) is None:
                continue
            print(f"{row['workload']} round {entry['round']} {system}: built {got['built']} "
                  f"(+{got['build_errors']} failed), {got['statuses']}, best {got['best_ms']} ms, "
                  f"{got['tflops']} TFLOPS, {got['vs_vendor']}x {entry['vendor']} ({entry['vendor_ms']} ms)")


def _ms(seconds: float | None) -> float | None:
    return round(seconds * 1e3, 4) if seconds else None


if __name__ == "__main__":
    sys.exit(main())
