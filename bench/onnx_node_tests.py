"""ONNX's own backend node tests, run through TVM's ONNX frontend (untuned) and through probtune, side by side.

The ``onnx`` package generates its node tests in memory
(``onnx.backend.test.loader.load_model_tests(kind="node")``): each case is a
small model (a ``ModelProto``: one node, or the node's function expanded into
several for the ``*_expanded*`` cases) with one data set of inputs and
expected outputs, and a tolerance (``rtol``, ``atol``). Each selected case
goes through two paths, each in a child process of its own with a time limit,
so that a crash, a hang or a slow compile is recorded and the run goes on:

- ``tvm``: ``tvm.relax.frontend.onnx.from_onnx``, ``tvm.compile`` for a plain
  ``{"kind": "llvm"}`` target, run on ``relax.VirtualMachine``;
- ``probtune``: the model written to a file, ``probtune.load_model``,
  ``probtune.tune_model(target="host", trials=T, seed=0)`` with a fresh
  database, ``result.compile(check=False)``, ``compiled(*inputs)``; then
  ``result.compile(check=True)`` for what probtune's own check (onnxruntime
  on random inputs) says, a column of its own.

Outputs are compared with the expected ones as ONNX's backend runner does:
same count, shape and dtype, then ``|got - want| <= atol + rtol * |want|``
element-wise, NaN where NaN is expected counting as a match.

Outcomes, per case and path: ``pass``; ``mismatch`` (with the largest absolute
error, or what differs); ``import-unsupported`` (the model has an operator
that TVM's ONNX frontend has no converter for; on the TVM path also any
error ``from_onnx`` raises); ``probtune-error`` (a subclass of
``probtune.errors.ProbtuneError``: class and first line); ``exception`` (any
other exception: class and last line; on the probtune path these are the bugs
to hunt, a user should never see one); ``timeout``; ``crash`` (the child
died: signal or exit status).

Selection: a case's operator is the op type of its node, with the node's
domain before it outside the default domain (``ai.onnx.ml.Binarizer``); an
``*_expanded*`` case takes the operator of the case it expands (the function
body's first node is often a helper such as ``Constant`` or ``CastLike``).
Only cases whose every graph input and output is float32 are kept (tensors,
and sequences or optionals of float32 tensors). By default the first such
case per operator is run, sorted by name, a case of the operator itself
before an expanded one; ``--all`` runs every float32 case; ``--only SUBSTR``
keeps the cases whose name contains SUBSTR (a comma-separated list: any of
them), before one is picked per operator.

``--trials`` defaults to 0 (every task compiled with its default program);
where probtune refuses ``trials=0`` the case is tuned with 8 trials instead
and says so (``trials`` and ``trials_note`` in its record, a note under the
table). Run with ``make bench-node-tests`` (or
``.venv/bin/python bench/onnx_node_tests.py``); the report goes to
``bench/results/onnx_node_tests.json`` (``--out``) and a markdown table is
printed at the end (``--report JSON`` prints it again from a saved report).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_OUT = RESULTS / "onnx_node_tests.json"
DEFAULT_TIMEOUT = 120.0
FALLBACK_TRIALS = 8
PATHS = ("tvm", "probtune")
OUTCOMES = ("pass", "mismatch", "import-unsupported", "probtune-error", "exception", "timeout", "crash")
FAILURES = frozenset(OUTCOMES) - {"pass"}
EXPANDED = "_expanded"
DEFAULT_DOMAINS = ("", "ai.onnx")
HELPER_OPS = frozenset({"Constant", "Cast", "CastLike", "Shape", "Identity", "Reshape", "Unsqueeze", "Squeeze"})
"""Op types skipped when an expanded case's own operator must be guessed from its function body."""


@dataclass(frozen=True)
class NodeCase:
    """One ONNX node test: its model, data set and tolerance, and the operator it tests."""

    name: str
    operator: str
    expanded: bool
    model: Any
    inputs: list[Any]
    outputs: list[Any]
    rtol: float
    atol: float


# ---------------------------------------------------------------------------------------------------------------
# Selection


def load_cases() -> list[NodeCase]:
    """Every node test that ONNX ships, sorted by name, with its operator."""
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # generating the expected outputs overflows and divides by zero on purpose
        raw = sorted(load_model_tests(kind="node"), key=lambda case: case.name)
    by_name = {case.name: case for case in raw}
    cases = []
    for case in raw:
        inputs, outputs = case.data_sets[0]
        cases.append(NodeCase(case.name, operator_of(case, by_name), EXPANDED in case.name, case.model,
                              list(inputs), list(outputs), float(case.rtol), float(case.atol)))
    return cases


def operator_of(case: Any, by_name: dict[str, Any]) -> str:
    """The operator a case tests: its node's, or for an expanded case the operator of the case it expands."""
    source = by_name.get(case.name.split(EXPANDED)[0], case)
    nodes = list(source.model.graph.node)
    node = nodes[0] if len(nodes) == 1 else next((n for n in nodes if n.op_type not in HELPER_OPS), nodes[0])
    return node.op_type if node.domain in DEFAULT_DOMAINS else f"{node.domain}.{node.op_type}"


def leaf_types(type_proto: Any) -> list[int]:
    """The element types of the tensors a value holds (through sequences and optionals); -1 for anything else."""
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        return [type_proto.tensor_type.elem_type]
    if kind == "sequence_type":
        return leaf_types(type_proto.sequence_type.elem_type)
    if kind == "optional_type":
        return leaf_types(type_proto.optional_type.elem_type)
    return [-1]


def is_float32(model: Any) -> bool:
    """Whether every graph input (weights aside) and output of the model holds float32 tensors only."""
    from onnx import TensorProto

    weights = {init.name for init in model.graph.initializer}
    values = [v for v in model.graph.input if v.name not in weights] + list(model.graph.output)
    return all(t == TensorProto.FLOAT for value in values for t in leaf_types(value.type))


def select(cases: Sequence[NodeCase], every: bool, only: str | None) -> list[NodeCase]:
    """The float32 cases to run: all of them, or the first per operator (the operator's own case first)."""
    wanted = [part for part in (only or "").split(",") if part]
    kept = [case for case in cases if is_float32(case.model) and (not wanted or any(w in case.name for w in wanted))]
    if every:
        return kept
    first: dict[str, NodeCase] = {}
    for case in sorted(kept, key=lambda c: (c.expanded, c.name)):
        first.setdefault(case.operator, case)
    return sorted(first.values(), key=lambda c: c.name)


# ---------------------------------------------------------------------------------------------------------------
# Comparison


def compare(want: Sequence[Any], got: Sequence[Any], rtol: float, atol: float) -> tuple[str, str, float | None]:
    """Outcome, detail and largest absolute error of ``got`` against ``want``, as ONNX's backend runner compares."""
    if len(got) != len(want):
        return "mismatch", f"{len(got)} outputs, expected {len(want)}", None
    worst = 0.0
    for index, (w, g) in enumerate(zip(want, got)):
        problem, error = compare_value(w, g, rtol, atol)
        if problem:
            return "mismatch", f"output {index}: {problem}", error
        worst = max(worst, error or 0.0)
    return "pass", "", worst


def compare_value(want: Any, got: Any, rtol: float, atol: float) -> tuple[str, float | None]:
    """What differs between one expected value and the one computed ("" if nothing) and the largest abs error."""
    if want is None or got is None:
        return ("" if want is None and got is None else f"{type(got).__name__}, expected {type(want).__name__}"), None
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            return f"{type(got).__name__} of {len(got) if isinstance(got, (list, tuple)) else '-'}, expected a " \
                   f"sequence of {len(want)}", None
        worst = 0.0
        for index, (w, g) in enumerate(zip(want, got)):
            problem, error = compare_value(w, g, rtol, atol)
            if problem:
                return f"element {index}: {problem}", error
            worst = max(worst, error or 0.0)
        return "", worst
    w, g = np.asarray(want), np.asarray(got)
    if g.shape != w.shape:
        return f"shape {g.shape}, expected {w.shape}", None
    if g.dtype != w.dtype:
        return f"dtype {g.dtype}, expected {w.dtype}", None
    error = max_abs_error(w, g)
    close = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
    if close.all():
        return "", error
    first = tuple(int(i) for i in np.argwhere(~close)[0])
    return (f"{int((~close).sum())} of {w.size} elements differ (first at {first}: {g[first]!r}, expected "
            f"{w[first]!r}; max abs err {error:.3g})"), error


def max_abs_error(want: np.ndarray, got: np.ndarray) -> float:
    """The largest absolute difference where both values are finite (0 for none); inf where NaNs disagree."""
    w, g = want.astype(np.float64), got.astype(np.float64)
    if (np.isnan(w) != np.isnan(g)).any():
        return float("inf")
    finite = np.isfinite(w) & np.isfinite(g)
    return float(np.abs(w[finite] - g[finite]).max(initial=0.0))


# ---------------------------------------------------------------------------------------------------------------
# The child process: one case, one path


class Recorder:
    """A path's result as the child builds it, rewritten to its file at every step so a dying child leaves it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {}

    def update(self, **fields: Any) -> None:
        """Merge ``fields`` into the result and write it (atomically)."""
        self.data.update(fields)
        scratch = self.path.with_suffix(".tmp")
        scratch.write_text(json.dumps(self.data, default=str))
        os.replace(scratch, self.path)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def last_line(exc: BaseException) -> str:
    """The last line of an exception's message: TVM's long messages end with the cause."""
    text = str(exc).strip()
    return text.splitlines()[-1] if text else ""


def classify(exc: BaseException, own: tuple[type[BaseException], ...]) -> tuple[str, str]:
    """Outcome and detail of an exception: a probtune error (``own``) by its first line, any other by its last."""
    if own and isinstance(exc, own):
        return "probtune-error", f"{type(exc).__name__}: {first_line(exc)}"
    return "exception", f"{type(exc).__name__}: {last_line(exc)}"


def origin(exc: BaseException) -> str:
    """Where an exception was raised: the innermost frame, and the innermost of probtune's if that is another."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    ours = [frame for frame in frames if "probtune" in frame.filename]
    shown = [frames[-1]] + ([ours[-1]] if ours and ours[-1] is not frames[-1] else [])
    return " < ".join(f"{short_path(frame.filename)}:{frame.lineno} {short_name(frame.name)}" for frame in shown)


def short_name(function: str) -> str:
    """A frame's function without its parameter list and return type (C++ frames carry both)."""
    head = function.split("(")[0].strip()
    return head.split()[-1] if head else function


def short_path(filename: str) -> str:
    """A source file's path from its package on (after site-packages/ or python/), or as it is."""
    for marker in ("site-packages/", "/python/", "/plugins/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


def unsupported_operators(model: Any) -> list[str]:
    """The model's op types that TVM's ONNX frontend has no converter for."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    supported = _get_convert_map()
    return sorted({node.op_type for node in model.graph.node if node.op_type not in supported})


def graph_inputs(model: Any) -> list[str]:
    """The names of the model's inputs that are not weights, in order."""
    weights = {init.name for init in model.graph.initializer}
    return [value.name for value in model.graph.input if value.name not in weights]


def to_tvm(value: Any, device: Any) -> Any:
    """An input for TVM's VM: a tensor, a list of them (a sequence), or None (an empty optional)."""
    import tvm

    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [to_tvm(item, device) for item in value]
    return tvm.runtime.tensor(np.asarray(value), device)


def to_numpy(value: Any) -> Any:
    """A VM result as numpy: tensors become arrays, TVM arrays and tuples become lists."""
    if value is None:
        return None
    if hasattr(value, "numpy"):
        return value.numpy()
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [to_numpy(item) for item in value]
    return np.asarray(value)


def vm_outputs(result: Any, count: int) -> list[Any]:
    """The VM's result as a list of ``count`` outputs (a single output is returned bare)."""
    converted = to_numpy(result)
    if count == 1:
        return [converted]
    return converted if isinstance(converted, list) else [converted]


def run_tvm(case: dict[str, Any], model_path: Path, record: Recorder) -> None:
    """The TVM path: import with Relax's ONNX frontend, compile untuned for llvm, run on the VM, compare."""
    import onnx
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    model = onnx.load(str(model_path))
    missing = unsupported_operators(model)
    if missing:
        record.update(outcome="import-unsupported", detail=f"no converter for {', '.join(missing)}")
        return
    names = graph_inputs(model)
    shapes = {name: list(np.shape(value)) for name, value in zip(names, case["inputs"]) if isinstance(value, np.ndarray)}
    try:
        mod = from_onnx(model, shape_dict=shapes, dtype_dict=dict.fromkeys(shapes, "float32"), keep_params_in_input=False)
    except Exception as exc:  # noqa: BLE001 - whatever the frontend raises means it cannot import the model
        record.update(outcome="import-unsupported", detail=f"{type(exc).__name__}: {last_line(exc)}")
        return
    record.update(stage="compile")
    executable = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))
    record.update(stage="run")
    device = tvm.cpu()
    vm = relax.VirtualMachine(executable, device)
    got = vm_outputs(vm["main"](*[to_tvm(value, device) for value in case["inputs"]]), len(case["outputs"]))
    record.update(stage="compare")
    outcome, detail, error = compare(case["outputs"], got, case["rtol"], case["atol"])
    record.update(outcome=outcome, detail=detail, max_abs_err=error)


def run_probtune(case: dict[str, Any], model_path: Path, trials: int, record: Recorder) -> None:
    """The probtune path: load, tune (or compile default programs), compile unchecked, run, compare; then its check."""
    import probtune
    from probtune.errors import ModelImportError, ProbtuneError

    own = (ProbtuneError,)
    try:
        model = probtune.load_model(model_path)
    except ModelImportError as exc:
        import onnx

        missing = unsupported_operators(onnx.load(str(model_path)))
        outcome = "import-unsupported" if missing else "probtune-error"
        detail = first_line(exc).replace(f"{model_path}: ", "")
        record.update(outcome=outcome, detail=f"{type(exc).__name__}: {detail}")
        return
    record.update(stage="tune", trials=trials)
    result = tune(model, model_path.parent / "db.sqlite", trials, record)
    record.update(stage="compile", tasks=len(result.tasks))
    try:
        compiled = result.compile(check=False)
        record.update(stage="run")
        got = list(compiled(*case["inputs"]))
        record.update(stage="compare")
        want = [item for value in case["outputs"] for item in (value if isinstance(value, list) else [value])]
        outcome, detail, error = compare(want, got, case["rtol"], case["atol"])  # a sequence output comes flat
        record.update(outcome=outcome, detail=detail, max_abs_err=error)
    except Exception as exc:  # noqa: BLE001 - recorded; the check below still says what probtune's own check finds
        outcome, detail = classify(exc, own)
        record.update(outcome=outcome, detail=detail, where=origin(exc))
    record.update(check={"outcome": "running"})
    try:
        result.compile(check=True)
        record.update(check={"outcome": "pass", "detail": ""})
    except Exception as exc:  # noqa: BLE001 - recorded as the check's outcome
        check, detail = classify(exc, own)
        record.update(check={"outcome": check, "detail": detail, "where": origin(exc)})


def tune(model: Any, database: Path, trials: int, record: Recorder) -> Any:
    """``probtune.tune_model`` on the host; ``trials=0`` that probtune refuses is retried with FALLBACK_TRIALS."""
    import probtune
    from probtune.errors import TuningConfigError

    try:
        return probtune.tune_model(model, target="host", trials=trials, database=database, seed=0)
    except TuningConfigError as exc:
        if trials != 0 or "trials" not in str(exc):
            raise
        record.update(trials=FALLBACK_TRIALS, trials_note=f"trials=0 refused ({exc})")
        return probtune.tune_model(model, target="host", trials=FALLBACK_TRIALS, database=database, seed=0)


def worker(path: str, case_dir: Path, trials: int) -> int:
    """Run one case through one path in this (child) process, its result written to ``case_dir/<path>.json``."""
    record = Recorder(case_dir / f"{path}.json")
    record.update(stage="import")
    with open(case_dir / "data.pkl", "rb") as handle:
        case = pickle.load(handle)
    own: tuple[type[BaseException], ...] = ()
    try:
        if path == "tvm":
            run_tvm(case, case_dir / "model.onnx", record)
        else:
            from probtune.errors import ProbtuneError

            own = (ProbtuneError,)
            run_probtune(case, case_dir / "model.onnx", trials, record)
    except Exception as exc:  # noqa: BLE001 - the outcome of the stage recorded last
        outcome, detail = classify(exc, own)
        record.update(outcome=outcome, detail=detail, where=origin(exc))
    record.update(done=True)
    return 0


# ---------------------------------------------------------------------------------------------------------------
# The parent: one child per case and path


def write_case(case: NodeCase, case_dir: Path) -> None:
    """Write a case's model and data set where its children read them."""
    import onnx

    case_dir.mkdir(parents=True, exist_ok=True)
    onnx.save(case.model, str(case_dir / "model.onnx"))
    with open(case_dir / "data.pkl", "wb") as handle:
        pickle.dump({"inputs": case.inputs, "outputs": case.outputs, "rtol": case.rtol, "atol": case.atol}, handle)


def log_tail(log: Path) -> str:
    """The last non-empty line a child printed."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.exists() else []
    return lines[-1].strip()[:300] if lines else ""


def kill_group(pid: int) -> None:
    """Kill what is left of a child's process group (it and the worker processes it started)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def exit_reason(code: int) -> str:
    """A child's exit status in words."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def run_path(path: str, case_dir: Path, trials: int, timeout: float) -> dict[str, Any]:
    """Run one path of one case in a child process and return its record, with timeouts and crashes named."""
    log = case_dir / f"{path}.log"
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", path, str(case_dir), "--trials", str(trials)]
    started = time.perf_counter()
    with open(log, "wb") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        code: int | None = None
        try:
            code = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            kill_group(child.pid)
            child.wait()
    seconds = round(time.perf_counter() - started, 2)
    result_file = case_dir / f"{path}.json"
    record: dict[str, Any] = json.loads(result_file.read_text()) if result_file.exists() else {}
    record["seconds"] = seconds
    return settle(record, path, code, timeout, log_tail(log))


def settle(record: dict[str, Any], path: str, code: int | None, timeout: float, tail: str) -> dict[str, Any]:
    """Fill in the outcome of a child that timed out or died before it recorded one (and its check's)."""
    ending = "timeout" if code is None else "crash"

    def detail(stage: str) -> str:
        if code is None:
            return f"over {timeout:g} s (in {stage})"
        return f"{exit_reason(code)} in {stage}" + (f": {tail}" if tail else "")

    if "outcome" not in record:
        record.update(outcome=ending, detail=detail(record.get("stage", "start")))
    if path == "probtune" and record.get("check", {}).get("outcome") in (None, "running"):
        reached = "check" in record
        record["check"] = {"outcome": ending if reached else "not-run", "detail": detail("check") if reached else ""}
    if code not in (None, 0) and record.get("done"):
        record["exit"] = exit_reason(code)
    record.pop("done", None)
    return record


def commit() -> str:
    """The repository's commit, with "-dirty" when its tracked files differ from it (probtune is installed editable)."""
    try:
        described = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                                   cwd=Path(__file__).resolve().parent, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return "-"
    return described.stdout.strip()


def versions() -> dict[str, str]:
    """The versions of what the two paths run on."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("onnx", "apache-tvm", "onnxruntime", "probtune"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "-"
    found["python"] = platform.python_version()
    return found


def run_all(cases: Sequence[NodeCase], args: argparse.Namespace, meta: dict[str, Any]) -> dict[str, Any]:
    """Run every case through both paths, writing the report after each case."""
    report: dict[str, Any] = {"meta": meta, "cases": []}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="onnx_node_tests_") as temporary:
        scratch = args.workdir or temporary
        for number, case in enumerate(cases, 1):
            case_dir = Path(scratch) / case.name
            write_case(case, case_dir)
            entry: dict[str, Any] = {"name": case.name, "operator": case.operator}
            for path in PATHS:
                entry[path] = run_path(path, case_dir, args.trials, args.timeout)
            report["cases"].append(entry)
            report["meta"]["seconds"] = round(time.perf_counter() - started, 1)
            report["meta"]["commit_end"] = commit()
            save(report, Path(args.out))
            say(f"[{number}/{len(cases)}] {case.name}: tvm {cell(entry['tvm'])}, probtune {cell(entry['probtune'])} "
                f"({entry['tvm']['seconds']:.1f} s, {entry['probtune']['seconds']:.1f} s)")
    return report


def save(report: dict[str, Any], out: Path) -> None:
    """Write the report as JSON."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")


def say(message: str) -> None:
    """Progress, on stderr."""
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# The markdown report


def cell(result: dict[str, Any]) -> str:
    """A path's outcome for the table: a mismatch with its largest absolute error."""
    outcome = str(result.get("outcome", "-"))
    error = result.get("max_abs_err")
    if outcome == "mismatch" and error is not None:
        return f"mismatch ({error:.2g})"
    return outcome


def escape(text: str, limit: int = 300) -> str:
    """Text made safe for a markdown list or table, cut at ``limit`` characters (the JSON keeps it whole)."""
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."



def fails(entry: dict[str, Any], path: str) -> bool:
    """Whether the path did not pass the case."""
    return entry[path].get("outcome") in FAILURES


def counts(entries: Iterable[dict[str, Any]], pick: Any) -> str:
    """Outcome counts, most common first."""
    counter = Counter(pick(entry) for entry in entries)
    return ", ".join(f"{outcome} {count}" for outcome, count in counter.most_common())


def markdown(report: dict[str, Any]) -> str:
    """The report as markdown: one row per case, the summary counts and the lists that matter."""
    entries, meta = report["cases"], report["meta"]
    lines = ["| case | operator | TVM | probtune | probtune check | TVM s | probtune s |", "|---|---|---|---|---|---:|---:|"]
    for e in entries:
        check = e["probtune"].get("check", {}).get("outcome", "-")
        lines.append(f"| {e['name']} | {e['operator']} | {cell(e['tvm'])} | {cell(e['probtune'])} | {check} "
                     f"| {e['tvm']['seconds']:.1f} | {e['probtune']['seconds']:.1f} |")
    total = len(entries)
    tvm_pass = sum(not fails(e, "tvm") for e in entries)
    ours_pass = sum(not fails(e, "probtune") for e in entries)
    used = Counter(e["probtune"].get("trials") for e in entries if "trials" in e["probtune"])
    fallback = f" (probtune refused trials=0: tuned with {FALLBACK_TRIALS})" if FALLBACK_TRIALS in used and meta["trials"] == 0 else ""
    start, end = meta.get("commit", "-"), meta.get("commit_end", meta.get("commit", "-"))
    commits = start if end == start else f"{start} to {end}"
    lines += ["", f"trials {meta['trials']}{fallback}; {total} cases, {meta.get('seconds', 0):.0f} s; commit {commits}", "",
              f"- TVM pass: {tvm_pass}/{total} ({counts(entries, lambda e: e['tvm']['outcome'])})",
              f"- probtune pass: {ours_pass}/{total} ({counts(entries, lambda e: e['probtune']['outcome'])})",
              f"- probtune check: {counts(entries, lambda e: e['probtune'].get('check', {}).get('outcome', '-'))}"]
    lost = [e for e in entries if not fails(e, "tvm") and fails(e, "probtune")]
    lines += ["", f"TVM passes, probtune fails ({len(lost)}):"]
    lines += [f"- {e['name']}: {cell(e['probtune'])} in {e['probtune'].get('stage', '-')}: "
              f"{escape(str(e['probtune'].get('detail', '')))}" for e in lost]
    lines += ["", "Non-probtune exceptions on the probtune path (run or check):"]
    for e in entries:
        for where, result in (("run", e["probtune"]), ("check", e["probtune"].get("check", {}))):
            if result.get("outcome") == "exception":
                lines.append(f"- {e['name']} ({where}, in {e['probtune'].get('stage', '-')}): {escape(str(result['detail']))}"
                             f" [{escape(str(result.get('where', '')), 200)}]")
    tvm_errors = [e for e in entries if e["tvm"]["outcome"] in ("exception", "crash", "timeout")]
    lines += ["", f"TVM path exceptions, crashes and timeouts ({len(tvm_errors)}):"]
    lines += [f"- {e['name']} ({e['tvm']['outcome']}, in {e['tvm'].get('stage', '-')}): {escape(str(e['tvm'].get('detail', '')))}"
              for e in tvm_errors]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------


def main() -> int:
    """Parse the options, then run a worker, print a saved report, list the selection or run it."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=0, help="probtune's trials per case (0: default programs)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per case and path")
    parser.add_argument("--all", action="store_true", help="every float32 case, not one per operator")
    parser.add_argument("--only", metavar="SUBSTR[,SUBSTR...]", help="only cases whose name contains one of these")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="the JSON report")
    parser.add_argument("--workdir", help="keep each case's model, data, children's logs and database here")
    parser.add_argument("--list", action="store_true", help="print the selected cases and stop")
    parser.add_argument("--report", metavar="JSON", help="print the markdown table of a saved report and stop")
    parser.add_argument("--worker", nargs=2, metavar=("PATH", "CASE_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker[0], Path(args.worker[1]), args.trials)
    if args.report:
        print(markdown(json.loads(Path(args.report).read_text())))
        return 0
    cases = select(load_cases(), args.all, args.only)
    if args.list:
        print("\n".join(f"{case.name}  {case.operator}" for case in cases))
        return 0
    if not cases:
        say("no case selected")
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the running child's group is killed too
    meta = {"trials": args.trials, "timeout": args.timeout,
            "selection": "all" if args.all else "one per operator", "only": args.only, "versions": versions(),
            "commit": commit(), "machine": platform.node(), "cpus": os.cpu_count(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    report = run_all(cases, args, meta)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
