"""Measurement bundles: written here, measured by their stand-alone script (here: the fake device), imported back."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tvm

import probtune.plugins
from probtune import Database, TuningConfigError, hookimpl
from probtune.cli import main
from probtune.database.measure_key import MeasureKey
from probtune.interfaces import DeviceCode
from probtune.measure.bundle import (
    FILL_ROUNDS,
    BundlePipeline,
    BundleWritten,
    _filled_batch,
    drive_bundles,
    import_results,
    open_bundle_pipeline,
    write_bundle,
)
from probtune.measure.pipeline import resolve_cost_model
from probtune.measure.run_bundle import BROKEN, DIED, MANIFEST, RESULTS, read_results
from probtune.plugins import get_registry, load_registry
from probtune.targets import resolve_target
from probtune.task.task import Task
from probtune.workloads.catalog import resolve_workload

FAKE_CUPY = Path(__file__).resolve().parent / "fake_cupy"  # stands for CuPy: PYTHONPATH=FAKE_CUPY
SHAPE = (32, 32, 32)
DEVICE = "lab-box"
KEY = f"host@{DEVICE}"

# The script must run where probtune is not installed: importing it fails in the child.
RUN_WITHOUT = "import runpy, sys; {hide}sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
RUN_WITHOUT_PROBTUNE = RUN_WITHOUT.format(hide="sys.modules['probtune'] = None; ")


def _run_script(bundle: Path) -> subprocess.CompletedProcess[str]:
    script = bundle / "run_bundle.py"
    return subprocess.run([sys.executable, "-c", RUN_WITHOUT_PROBTUNE, str(script)], capture_output=True, text=True,
                          timeout=300, check=False)


def _write(tmp_path: Path, name: str, db: Path, candidates: int = 4) -> BundleWritten:
    """A bundle of up to ``candidates`` (the search may offer fewer); at least two built."""
    written = write_bundle("matmul", tmp_path / name, device=DEVICE, shape=SHAPE, database=db, candidates=candidates)
    assert written.measured_on == KEY and 2 <= written.candidates + written.build_errors <= candidates
    assert written.candidates >= 2
    return written


def test_a_bundle_round_trip_records_what_the_device_measured_and_the_next_bundle_goes_on(tmp_path: Path) -> None:
    db = tmp_path / "tuning.db"
    written = _write(tmp_path, "b1", db)
    bundle, count = written.path, written.candidates
    assert {p.name for p in bundle.iterdir()} >= {MANIFEST, "reference.npz", "candidates", "run_bundle.py", "timing.py"}
    ran = _run_script(bundle)
    assert ran.returncode == 0, ran.stderr
    done = import_results(bundle, db)
    assert done.measured_on == KEY and done.statuses == {"ok": count} and done.unmeasured == 0
    assert done.best_latency is not None and done.best_latency > 0
    with Database(db) as database:
        [workload] = database.workloads()
        records = database.records(workload.id)
        measured = [r for r in records if r.status != "build_error"]
        assert {r.target for r in records} == {KEY} and len(measured) == count
        assert all(len(r.latencies) == 3 for r in measured)
        assert database.load_cost_model("xgb", KEY) is not None  # trained on the results
        first = database.seen_decision_hashes(workload.id, KEY)
    again = import_results(bundle, db)  # importing twice records nothing twice
    assert again.statuses == {} and again.already_recorded == count
    second = json.loads((_write(tmp_path, "b2", db).path / MANIFEST).read_text())
    assert not first & {entry["decision_hash"] for entry in second["candidates"]}


def test_the_script_resumes_a_run_that_died_and_records_the_candidate_it_died_on_as_a_crash(tmp_path: Path) -> None:
    db = tmp_path / "tuning.db"
    bundle = _write(tmp_path, "b", db).path
    header = {"format": 1, "device": "a GPU that went away", "started": 0.0}
    (bundle / RESULTS).write_text(json.dumps(header) + "\n" + json.dumps({"id": 0, "started": True}) + "\n")
    ran = _run_script(bundle)
    assert ran.returncode == 0, ran.stderr
    done = import_results(bundle, db)
    assert done.statuses["crash"] == 1 and done.statuses["ok"] >= 1 and set(done.statuses) == {"crash", "ok"}
    with Database(db) as database:
        [crash] = [r for r in database.records(database.workloads()[0].id) if r.status == "crash"]
    assert crash.error == DIED


def test_malformed_results_are_refused_before_anything_is_recorded(tmp_path: Path) -> None:
    db = tmp_path / "tuning.db"
    bundle = _write(tmp_path, "b", db).path
    with pytest.raises(TuningConfigError, match="no readable results"):
        import_results(bundle, db)
    rows = [{"format": 1, "device": "d"},
            {"id": 0, "status": "ok", "latencies": [1e-4], "error": None, "seconds": 0.1},
            {"id": 1, "status": "ok", "latencies": [-1.0], "error": None, "seconds": 0.1}]
    (bundle / RESULTS).write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(TuningConfigError, match="the result of candidate 1 is malformed"):
        import_results(bundle, db)
    (bundle / RESULTS).write_text("".join(json.dumps(row) + "\n" for row in rows[:2]) + '{"id": 7, "status": "ok"\n')
    with pytest.raises(TuningConfigError, match="line 3: not JSON"):
        import_results(bundle, db)
    rows[2] = {"id": 9, "status": "ok", "latencies": [1e-4], "error": None, "seconds": 0.1}
    (bundle / RESULTS).write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(TuningConfigError, match=r"results for candidates \[9\] that the bundle does not hold"):
        import_results(bundle, db)
    with Database(db) as database:
        assert all(r.status == "build_error" for r in database.records(database.workloads()[0].id))


def test_a_reference_too_large_to_carry_travels_as_a_seed_and_sampled_outputs(tmp_path: Path) -> None:
    """The script makes the inputs again from their seed and checks the outputs at the sampled positions."""
    db = tmp_path / "tuning.db"
    written = write_bundle("matmul", tmp_path / "b", device=DEVICE, shape=SHAPE, database=db, candidates=3,
                           reference_mb=0.001)
    manifest = json.loads((written.path / MANIFEST).read_text())
    seeded = manifest["reference"]["seeded"]
    assert seeded["inputs"] == [[[32, 32], "float32"]] * 2 and seeded["outputs"] == [[[32, 32], "float32"]]
    with np.load(written.path / "reference.npz") as arrays:
        assert set(arrays.files) == {"positions_0", "output_0"}  # no inputs
        sampled = dict(arrays)
    assert _run_script(written.path).returncode == 0
    assert import_results(written.path, db).statuses == {"ok": written.candidates}
    # Outputs that disagree at a sampled position are wrong; inputs made differently stop the run, named.
    (written.path / RESULTS).unlink()
    np.savez(written.path / "reference.npz", positions_0=sampled["positions_0"], output_0=sampled["output_0"] + 1)
    assert _run_script(written.path).returncode == 0
    rows = [json.loads(line) for line in (written.path / RESULTS).read_text().splitlines()[1:]]
    assert {row["status"] for row in rows if "status" in row} == {"wrong_result"}
    (written.path / RESULTS).unlink()
    seeded["seed"] += 1
    (written.path / MANIFEST).write_text(json.dumps(manifest))
    ran = _run_script(written.path)
    assert ran.returncode == 2 and "input 0 made from seed 1 differs" in ran.stderr


def test_a_seeded_reference_folds_an_index_input_as_the_workload_draws_it(tmp_path: Path) -> None:
    """A slice picked by an integer input: seed 3 draws 3 for it, out of the 3 slices, and both sides fold it to 0."""
    from tvm import te, topi

    from probtune.workloads.workload import Workload

    data = te.placeholder((3, 16, 8), "float32", name="data")
    index = te.placeholder((), "int64", name="index")
    work = Workload.from_module(te.create_prim_func([data, index, topi.take(data, index, axis=0)]), name="pick")
    db = tmp_path / "tuning.db"
    written = write_bundle(work, tmp_path / "b", device=DEVICE, database=db, candidates=2, seed=3, reference_mb=1e-6)
    seeded = json.loads((written.path / MANIFEST).read_text())["reference"]["seeded"]
    assert seeded["index_extents"] == [[1, 3]]
    assert _run_script(written.path).returncode == 0
    assert import_results(written.path, db).statuses == {"ok": written.candidates}


def test_bad_folders_are_named(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(TuningConfigError, match="is not an empty folder"):
        write_bundle("matmul", tmp_path / "full", device=DEVICE, shape=SHAPE, database=tmp_path / "t.db")
    with pytest.raises(TuningConfigError, match="is not a measurement bundle"):
        import_results(tmp_path / "full", tmp_path / "t.db")


def test_the_cli_writes_and_imports_a_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db, bundle = str(tmp_path / "t.db"), tmp_path / "b"
    assert main(["bundle", str(bundle), "--device", DEVICE, "--shape", "32,32,32", "--candidates", "2",
                 "--database", db]) == 0
    assert f"candidates for {KEY}" in capsys.readouterr().out
    assert _run_script(bundle).returncode == 0
    assert main(["import-results", str(bundle), "--database", db]) == 0
    assert f"recorded under {KEY}: " in capsys.readouterr().out


@pytest.mark.parametrize(
    "correct,target,dtype",
    [(False, "cuda-sm80", "float32"), (True, "cuda-sm80", "float32"), (True, "cuda-sm90", "float16")],
)
def test_a_cuda_bundle_carries_cubins_that_its_script_launches_without_tvm(
    tmp_path: Path, correct: bool, target: str, dtype: str
) -> None:
    """The GPU half is a fake CuPy (no GPU here): the launches, in order and shape, and the results file are checked.

    The float16 matmul's candidates run on the tensor cores, with shared memory allocated at launch.
    """
    db = tmp_path / "tuning.db"
    shape = SHAPE if dtype == "float32" else (64, 64, 64)
    written = write_bundle("matmul", tmp_path / "b", device="h100", target=target, shape=shape, dtype=dtype,
                           database=db, candidates=3)
    assert written.measured_on == f"{target}@h100" and written.candidates >= 1
    manifest = json.loads((written.path / MANIFEST).read_text())
    log = tmp_path / "launches.jsonl"
    env = {**os.environ, "PYTHONPATH": str(FAKE_CUPY), "FAKE_CUPY_LOG": str(log)}
    if correct:
        env["FAKE_CUPY_ANSWERS"] = str(written.path / "reference.npz")
    script = RUN_WITHOUT.format(hide="sys.modules['probtune'] = sys.modules['tvm'] = None; ")  # no TVM either
    ran = subprocess.run([sys.executable, "-c", script, str(written.path / "run_bundle.py"), "--runtime", "cupy"],
                         capture_output=True, text=True, timeout=300, check=False, env=env)
    assert ran.returncode == 0, ran.stderr
    launched = [json.loads(line) for line in log.read_text().splitlines()]
    first = manifest["candidates"][0]["kernels"]["launches"]
    assert launched[: len(first)] == [
        {"kernel": k["kernel"], "grid": k["grid"], "block": k["block"], "args": len(k["args"]), "shared": k["shared"]}
        for k in first
    ]
    assert all(k["shared"] > 0 for k in first)  # the operands' tiles, in launch-time shared memory
    done = import_results(written.path, db)
    assert done.device == "Fake GPU"
    if correct:  # each repeat: 0.5 ms over the calls it made
        assert done.statuses == {"ok": written.candidates} and done.best_latency is not None
    else:
        assert done.statuses == {"wrong_result": written.candidates}


def test_a_candidate_that_breaks_the_cuda_context_stops_the_run_and_the_next_run_goes_on(tmp_path: Path) -> None:
    """After a fault every later call in the process fails: those candidates must not be recorded as errors too."""
    written = write_bundle("matmul", tmp_path / "b", device="h100", target="cuda-sm80", shape=SHAPE,
                           database=tmp_path / "t.db", candidates=3)
    assert written.candidates >= 2
    (tmp_path / "fault").write_text("")
    env = {**os.environ, "PYTHONPATH": str(FAKE_CUPY), "FAKE_CUPY_LOG": str(tmp_path / "log"),
           "FAKE_CUPY_ANSWERS": str(written.path / "reference.npz"), "FAKE_CUPY_FAULT": str(tmp_path / "fault")}
    command = [sys.executable, str(written.path / "run_bundle.py"), "--runtime", "cupy"]
    first = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False, env=env)
    assert first.returncode == BROKEN and "unusable after candidate 0" in first.stderr
    again = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False, env=env)
    assert again.returncode == 0, again.stderr
    _, results = read_results(written.path / RESULTS)
    assert results[0]["status"] == "run_error" and "cudaErrorIllegalAddress" in results[0]["error"]
    assert {results[i]["status"] for i in range(1, written.candidates)} == {"ok"}


def test_kernels_asking_for_more_than_48_kb_of_shared_memory_opt_in(tmp_path: Path) -> None:
    """A CUDA kernel launched with more than 48 KB of shared memory must raise its limit first, or the launch fails."""
    from probtune_cuda import cupy_runtime

    made: dict[str, types.SimpleNamespace] = {}

    def get_function(name: str) -> types.SimpleNamespace:
        made[name] = types.SimpleNamespace(name=name)
        return made[name]

    module = types.SimpleNamespace(get_function=get_function)
    fake = types.SimpleNamespace(RawModule=lambda path: module, asarray=np.asarray, zeros=np.zeros)
    launch = {"grid": [1, 1, 1], "block": [32, 1, 1], "args": []}
    table = {"cubin": "k.cubin", "scratch": [], "launches": [
        {**launch, "kernel": "small", "shared": 16384}, {**launch, "kernel": "large", "shared": 100000}
    ]}
    cupy_runtime.candidate_program(fake, tmp_path, table, [], [])
    assert not hasattr(made["small"], "max_dynamic_shared_size_bytes")
    assert made["large"].max_dynamic_shared_size_bytes == 100000


ECHO_RUNTIME = """
\"\"\"A test plugin's bundle runtime: it reads each candidate's device code, launches nothing, reports fixed times.\"\"\"
from pathlib import Path


def available():
    return True


def device_name():
    return "echo device"


def healthy():
    return True


def measure(timing):
    def run(task, candidate, bundle, inputs, expected):
        table = candidate["kernels"]
        if "T.prim_func" not in (Path(bundle) / table["tir"]).read_text() or table["launches"] != [{"kernel": "main"}]:
            return timing.RunReply("run_error", (), "not the program's text")
        return timing.RunReply("ok", (1e-3 * (1 + candidate["id"]),) * task.repeat, None)

    return run
"""


@dataclasses.dataclass(frozen=True)
class TextCompiler:
    """A target's compiler whose device code is the program's TVMScript, of kind ``tir``."""

    device_code_kind = "tir"

    def __call__(self, mod: tvm.IRModule, tvm_target: dict[str, Any]) -> Any:
        return tvm.compile(mod, target=tvm.target.Target(tvm_target))

    def device_code(self, mod: tvm.IRModule, tvm_target: dict[str, Any]) -> DeviceCode:
        return DeviceCode(mod.script().encode(), {"launches": [{"kernel": "main"}]})


@dataclasses.dataclass(frozen=True)
class RuntimeFile:
    name: str
    kinds: tuple[str, ...]
    source: str


class EchoPlugin:
    """A plugin with a target whose compiler gives device code, and the bundle runtime that launches that code."""

    __name__ = "echo"

    def __init__(self, source: Path) -> None:
        self.source = source

    @hookimpl
    def probtune_register_targets(self, register: Any) -> None:
        register(dataclasses.replace(resolve_target("host"), name="host-text", compiler=TextCompiler()))

    @hookimpl
    def probtune_register_bundle_runtimes(self, register: Any) -> None:
        register(RuntimeFile("echo", ("tir",), str(self.source)))


def test_a_bundle_carries_the_runtime_a_plugin_registers_for_its_code_and_the_script_measures_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "echo_runtime.py"
    source.write_text(ECHO_RUNTIME)
    monkeypatch.setattr(probtune.plugins, "_registry", load_registry(extra_plugins=[EchoPlugin(source)]))
    db = tmp_path / "t.db"
    written = write_bundle("matmul", tmp_path / "b", device=DEVICE, target="host-text", shape=SHAPE, database=db,
                           candidates=3)
    manifest = json.loads((written.path / MANIFEST).read_text())
    assert manifest["runtimes"] == {"echo": "runtime_echo.py"} and written.candidates >= 1
    assert (written.path / "runtime_echo.py").read_text() == ECHO_RUNTIME
    assert [c["kernels"]["tir"] for c in manifest["candidates"]] == [f"candidates/{i}.tir" for i in range(written.candidates)]
    ran = _run_script(written.path)  # the carried runtime, by default
    assert ran.returncode == 0, ran.stderr
    done = import_results(written.path, db)
    assert done.device == "echo device" and done.statuses == {"ok": written.candidates} and done.best_latency == 1e-3
    refused = subprocess.run([sys.executable, str(written.path / "run_bundle.py"), "--runtime", "cupy"],
                             capture_output=True, text=True, timeout=300, check=False)
    assert refused.returncode == 2 and "carries no device code for runtime 'cupy' (it carries echo)" in refused.stderr
    plain = json.loads((_write(tmp_path, "host", db).path / MANIFEST).read_text())
    assert plain["runtimes"] == {}  # no device code: TVM's runtime measures it


def test_a_carried_runtime_that_does_not_load_on_the_device_is_named_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "echo_runtime.py"
    source.write_text(ECHO_RUNTIME)
    monkeypatch.setattr(probtune.plugins, "_registry", load_registry(extra_plugins=[EchoPlugin(source)]))
    written = write_bundle("matmul", tmp_path / "b", device=DEVICE, target="host-text", shape=SHAPE,
                           database=tmp_path / "t.db", candidates=2)
    carried = written.path / "runtime_echo.py"
    carried.write_text("import a_module_the_device_lacks\n" + ECHO_RUNTIME)  # as a runtime whose library is missing
    asked = subprocess.run([sys.executable, str(written.path / "run_bundle.py"), "--runtime", "echo"],
                           capture_output=True, text=True, timeout=300, check=False)
    assert asked.returncode == 2 and "Traceback" not in asked.stderr
    assert "runtime 'echo' (runtime_echo.py) does not load here: ModuleNotFoundError" in asked.stderr
    assert "--runtime tvm measures" in asked.stderr
    default = _run_script(written.path)  # passed over: TVM's runtime measures the candidates' libraries
    assert default.returncode == 0, default.stderr
    assert "note: passing over runtime 'echo'" in default.stderr and "Traceback" not in default.stderr
    header, results = read_results(written.path / RESULTS)
    assert header["device"] != "echo device" and len(results) == written.candidates


def test_cold_timings_are_refused_for_a_gpu_bundle(tmp_path: Path) -> None:
    with pytest.raises(TuningConfigError, match="cache_flush flushes CPU caches; target 'cuda-sm80'"):
        write_bundle("matmul", tmp_path / "b", device="h100", target="cuda-sm80", shape=SHAPE,
                     database=tmp_path / "t.db", cache_flush=True)


class _Offers:
    """Stands for a task session whose search offers the given batches, in turn, cut to the size asked."""

    def __init__(self, *offers: list[int]) -> None:
        self.offers, self.asked = list(offers), []

    def next_batch(self, size: int) -> list[int]:
        self.asked.append(size)
        return self.offers.pop(0)[:size] if self.offers else []


def test_a_bundle_asks_the_search_again_until_it_is_full_or_the_search_runs_dry() -> None:
    """A round trip to the device costs more than a search round: a short batch is filled by asking again."""
    search = _Offers([1, 2, 3], [4, 5], [6, 7, 8, 9])
    assert _filled_batch(search, 8) == [1, 2, 3, 4, 5, 6, 7, 8] and search.asked == [8, 5, 3]
    dry = _Offers([1], [])
    assert _filled_batch(dry, 4) == [1] and dry.asked == [4, 3]
    assert _filled_batch(_Offers([]), 4) == []
    stingy = _Offers(*[[n] for n in range(10)])
    assert len(_filled_batch(stingy, 10)) == 1 + FILL_ROUNDS


def test_a_round_of_many_tasks_is_one_driver_writing_one_bundle_per_task(tmp_path: Path) -> None:
    """A model's round: the one tuning loop through a bundle pipeline, each task's bundle in its own folder."""
    works = [resolve_workload("matmul", shape, "float32", get_registry().workloads) for shape in ((16, 16, 16), SHAPE)]
    model = resolve_cost_model("xgb", 0)
    folders = {work.key: tmp_path / f"task{i}" for i, work in enumerate(works)}
    with open_bundle_pipeline(resolve_target("host"), tmp_path / "t.db", model, device=DEVICE,
                              folders=lambda session: folders[session.name]) as pipeline:
        drive_bundles(pipeline, [Task(work) for work in works], 2, model, seed=0)
        assert list(pipeline.written) == [work.key for work in works] and not pipeline.refused
        assert pipeline.round(_Named(works[0].key), 2) == 0  # one bundle per task
    for work in works:
        manifest = json.loads((folders[work.key] / MANIFEST).read_text())
        assert manifest["measured_on"] == KEY and manifest["workload"]["shape"] == list(work.shape)
        assert len(manifest["candidates"]) == pipeline.written[work.key].candidates >= 1


class _Named(_Offers):
    def __init__(self, name: str, *offers: list[int]) -> None:
        super().__init__(*offers)
        self.name = name


def test_a_task_whose_space_the_device_has_measured_through_is_named_and_gets_no_bundle(tmp_path: Path) -> None:
    pipeline = BundlePipeline(None, resolve_target("host"), MeasureKey("host", DEVICE), None, str(tmp_path),
                              lambda session: tmp_path / "never", seed=0, reference_mb=1.0)
    dry = _Named("matmul_1x1x1")
    assert pipeline.round(dry, 4) == 0 and not (tmp_path / "never").exists()
    assert pipeline.refused == {"matmul_1x1x1": f"the space of matmul_1x1x1 has no candidate left that {KEY} has not measured"}
    assert pipeline.round(dry, 4) == 0 and dry.asked == [4]
