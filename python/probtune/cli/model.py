"""The model commands of ``probtune``: tune-model (tune, compile, check, export), run-model (time, compare), example-model."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from probtune import defaults
from probtune.cli.rpc import add_rpc_options, rpc_runner
from probtune.plugins import name_list

__all__ = ["add_model_commands"]


def add_model_commands(sub: Any, positive_int: Any, non_negative_int: Any, default_database: str) -> None:
    """Register ``tune-model`` and ``run-model`` on the ``probtune`` parser's subcommands."""
    tune_p = sub.add_parser("tune-model", help="tune every task of a model, compile it, check it, export it")
    tune_p.add_argument("model", help="an ONNX file")
    input_shape_option(tune_p)
    tune_p.add_argument("--target", default="host", help="target name (see 'probtune targets')")
    tune_p.add_argument("--trials", type=non_negative_int, default=defaults.MODEL_TRIALS,
                        help="new measurements over all tasks (0: compile from the database's records)")
    tune_p.add_argument("--batch-size", type=positive_int, default=defaults.BATCH_SIZE, help="candidates measured per round")
    tune_p.add_argument("--scheduler", default=defaults.SCHEDULER,
                        help="task scheduler: gradient, round-robin, or one a plugin registers (see 'probtune plugins')")
    tune_p.add_argument("--seed", type=int, default=0)
    tune_p.add_argument("--database", default=default_database)
    tune_p.add_argument("--confirm", type=non_negative_int, default=defaults.CONFIRM,
                        help="best records of each task timed again at the end (0: none)")
    tune_p.add_argument("--cache-flush", action=argparse.BooleanOptionalAction, default=None,
                        help="time tasks with their weights and outputs flushed from the caches (default: where the "
                             "model's weights outgrow this machine's last-level cache, or as the database's records "
                             "of the model were timed)")
    tune_p.add_argument("--output", help="write the compiled model here (a shared library; its inputs in OUTPUT.json)")
    tune_p.add_argument("--graph-rewrites", type=name_list, metavar="NAMES",
                        help="comma-separated graph rewrites to apply instead of the target's ('' for none; "
                             "see 'probtune plugins')")
    tune_p.add_argument("--precision", choices=defaults.PRECISIONS, default="fp32",
                        help="fp16 / bf16: a float32 model's products in float16 / bfloat16 with float32 sums, checked with "
                             "that precision's tolerance (bf16 where the target offers it: see 'probtune targets')")
    add_rpc_options(tune_p)
    tune_p.set_defaults(run=_cmd_tune_model)

    example_p = sub.add_parser("example-model", help="write a small example model built in code (an ONNX file)")
    example_p.add_argument("name", choices=["small-cnn", "encoder-layer"])
    example_p.add_argument("output", help="the ONNX file to write")
    example_p.set_defaults(run=_cmd_example_model)

    run_p = sub.add_parser("run-model", help="time a compiled model; with --compare-onnx, check it against onnxruntime")
    run_p.add_argument("compiled", help="a model written by 'probtune tune-model --output'")
    run_p.add_argument("--compare-onnx", help="the ONNX model it came from: outputs checked, onnxruntime timed too "
                       "(at the input shapes in COMPILED.json unless --input-shape is given)")
    input_shape_option(run_p)
    run_p.add_argument("--threads", type=positive_int,
                       help="threads of the compiled model and of onnxruntime beside it (default: the compiled model's "
                            "chosen count, in COMPILED.json, and all cores for onnxruntime)")
    run_p.add_argument("--repeat", type=positive_int, default=10)
    run_p.set_defaults(run=_cmd_run_model)


def input_shape_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME=DIMS",
                        help="an input's shape, e.g. input=1,3,224,224 (repeat for each input)")


def input_shapes(items: list[str]) -> dict[str, str]:
    from probtune.errors import ModelImportError

    shapes = {}
    for item in items:
        name, sep, dims = item.rpartition("=")
        if not sep or not name:
            raise ModelImportError(f"--input-shape {item!r}: expected NAME=DIMS, e.g. input=1,3,224,224")
        shapes[name] = dims
    return shapes


def model_runner(args: argparse.Namespace) -> Any:
    """The RPC runner of ``tune-model``'s options, or None (the target's own): it times with the caches flushed unless
    ``--no-cache-flush``, as the machine behind it has caches this machine cannot read (``MODEL_CACHE_FLUSH``)."""
    return rpc_runner(args, cache_flush=defaults.MODEL_CACHE_FLUSH if args.cache_flush is None else args.cache_flush)


def _cmd_tune_model(args: argparse.Namespace) -> int:
    from probtune.model import load_model, tune_model
    from probtune.targets import resolve_target

    target = resolve_target(args.target)
    model = load_model(args.model, input_shapes(args.input_shape))
    runner = model_runner(args)
    if args.output:
        _check_writable(Path(args.output))
    print(f"tuning model {model.name} on target {target.name}: {args.trials} trials, database {args.database}",
          flush=True)
    with _ProgressBar(args.trials) as bar:
        result = tune_model(
            model, target, args.trials, database=args.database, seed=args.seed,
            batch_size=args.batch_size, scheduler=args.scheduler, confirm=args.confirm, cache_flush=args.cache_flush,
            progress=bar.update, runner=runner, graph_rewrites=args.graph_rewrites, precision=args.precision,
        )
    for name, count in result.graph_rewrites.items():
        print(f"graph rewrite {name}: {count} operators rewritten")
    print(result.table())
    estimate = result.estimated_latency
    print(f"\n{result.trials} trials in {result.seconds:.1f} s ({result.search_seconds:.1f} s searching); "
          f"estimated model latency {'-' if estimate is None else f'{estimate * 1e3:.3f} ms'}")
    compiled = result.compile(on=runner)  # on a server of the RPC tracker, where the tasks were measured
    print(compiled.check)
    if compiled.prepacked:
        print(f"{compiled.prepacked} weight layout copies made once at compile time instead of on every call")
    if compiled.in_place:
        print(f"{compiled.in_place} calls write in place: over a residual they read, or into their stretch of a "
              "concatenation")
    choice = getattr(compiled, "thread_choice", None)  # made where it runs here, not on an RPC server
    if choice is not None:
        print(f"thread count: the compiled model {choice}")
    latency = float(np.median(compiled.time(model.random_inputs(0))))
    where = " of an RPC server" if runner is not None else ""
    print(f"compiled model: {latency * 1e3:.3f} ms per inference on {compiled.num_threads} threads{where}")
    if args.output:
        path = compiled.export_library(args.output)
        _write_inputs(path, model, compiled.num_threads, args.precision)
        print(f"written: {path} (inputs in {path}.json)")
    return 0


def _cmd_example_model(args: argparse.Namespace) -> int:
    import onnx

    from probtune.model.examples import EXAMPLES

    onnx.save(EXAMPLES[args.name](), args.output)
    print(f"written: {args.output}")
    return 0


def _cmd_run_model(args: argparse.Namespace) -> int:
    from probtune.model import CompiledModel, InputSpec, check_outputs, load_model

    shapes = input_shapes(args.input_shape)
    if args.compare_onnx and not shapes and Path(f"{args.compiled}.json").is_file():  # the shapes it was tuned at
        shapes = {spec.name: spec.shape for spec in _read_inputs(Path(args.compiled), InputSpec)}
    model = load_model(args.compare_onnx, shapes) if args.compare_onnx else None
    inputs = model.inputs if model else _read_inputs(Path(args.compiled), InputSpec)
    threads = args.threads or _read_threads(Path(args.compiled)) or os.cpu_count() or 1
    compiled = CompiledModel.load(args.compiled, inputs, threads)
    arrays = [spec.random(np.random.default_rng(0)) for spec in inputs] if model is None else model.random_inputs(0)
    latency = float(np.median(compiled.time(arrays, repeat=args.repeat)))
    print(f"{args.compiled}: {latency * 1e3:.3f} ms per inference on {threads} threads")
    if model is not None:
        print(check_outputs(model, compiled, precision=_read_precision(Path(args.compiled))))
        reference_threads = args.threads or os.cpu_count() or 1
        reference = _onnxruntime_seconds(model, arrays, args.repeat, reference_threads)
        print(f"onnxruntime: {reference * 1e3:.3f} ms on {reference_threads} threads "
              f"(probtune/onnxruntime speed ratio {reference / latency:.2f}x)")
    return 0


def _onnxruntime_seconds(model: Any, arrays: list[np.ndarray], repeat: int, threads: int) -> float:
    import time

    from probtune.model.check import onnxruntime_runner

    run = onnxruntime_runner(model, threads)
    run(*arrays)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run(*arrays)
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def _check_writable(path: Path) -> None:
    """Refuse, before any trial is spent, an output the compiled model could not be written to."""
    from probtune.errors import TuningConfigError

    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
        raise TuningConfigError(f"--output {path}: cannot write there (no such folder, not writable, or a folder)")


def _write_inputs(path: Path, model: Any, threads: int, precision: str) -> None:
    specs = [{"name": s.name, "shape": list(s.shape), "dtype": s.dtype}
             | ({"table_rows": s.table_rows} if s.table_rows is not None else {}) for s in model.inputs]
    sidecar = {"model": model.name, "inputs": specs, "threads": threads, "precision": precision}
    Path(f"{path}.json").write_text(json.dumps(sidecar, indent=1))


def _read_sidecar(path: Path, key: str) -> Any:
    """What tune-model wrote under ``key`` beside the compiled model at ``path`` (in PATH.json), or None."""
    try:
        return json.loads(Path(f"{path}.json").read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None


def _read_threads(path: Path) -> int | None:
    """The thread count tune-model chose for the compiled model at ``path``, if it wrote one."""
    threads = _read_sidecar(path, "threads")
    return threads if isinstance(threads, int) and threads > 0 else None


def _read_precision(path: Path) -> str:
    """The precision the compiled model at ``path`` was tuned in (fp32 where its sidecar names none it knows)."""
    from probtune.defaults import PRECISIONS

    precision = _read_sidecar(path, "precision")
    return precision if precision in PRECISIONS else "fp32"


def _read_inputs(path: Path, spec_type: Any) -> tuple[Any, ...]:
    from probtune.errors import ModelImportError

    sidecar = Path(f"{path}.json")
    if not sidecar.is_file():
        raise ModelImportError(f"{sidecar} is missing: give the model's inputs with --compare-onnx MODEL.onnx")
    try:
        specs = json.loads(sidecar.read_text())["inputs"]
        return tuple(spec_type(s["name"], tuple(int(d) for d in s["shape"]), str(s["dtype"]),
                               int(s["table_rows"]) if s.get("table_rows") is not None else None) for s in specs)
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelImportError(f"{sidecar}: not a probtune inputs file ({exc})") from None


class _ProgressBar:
    """One bar over the run's trials (rich), naming the task being measured and its best latency."""

    def __init__(self, trials: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            transient=False,
        )
        self._bar = self._progress.add_task("tuning", total=trials)

    def __enter__(self) -> _ProgressBar:
        self._progress.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._progress.stop()

    def update(self, outcome: Any) -> None:
        best = "-" if outcome.best_latency is None else f"{outcome.best_latency * 1e3:.4f} ms"
        self._progress.update(self._bar, completed=outcome.trial,
                              description=f"{outcome.task.split(':')[0][:32]:<32} best {best:>12}")
