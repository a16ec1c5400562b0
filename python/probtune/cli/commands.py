"""The ``probtune`` command: tune, tune-model, run-model, best, plugins, workloads, targets, rpc-servers, db."""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections.abc import Sequence

import numpy as np

from probtune import defaults
from probtune.cli.bundle import add_bundle_commands
from probtune.cli.db import add_db_commands
from probtune.cli.model import add_model_commands
from probtune.cli.rpc import add_rpc_command, add_rpc_options, rpc_runner

__all__ = ["main"]

DEFAULT_DATABASE = os.environ.get("PROBTUNE_DATABASE", "probtune.db")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _gflops(flops: float | None, seconds: float | None) -> str:
    return "-" if not flops or not seconds else f"{flops / seconds / 1e9:.1f} GFLOPS"


def _print_progress(outcome) -> None:  # type: ignore[no-untyped-def]
    width = len(str(outcome.trials))
    head = f"[{outcome.trial:>{width}}/{outcome.trials}]"
    if outcome.status == "ok":
        now = f"{_ms(outcome.latency):>12} {_gflops(outcome.flops, outcome.latency):>14}"
    else:
        now = f"{outcome.status:>12}  {(outcome.error or '')[:60]}"
    best = f"best {_ms(outcome.best_latency)} ({_gflops(outcome.flops, outcome.best_latency)})"
    print(f"{head} {now}   {best}", flush=True)


def _numpy_seconds(workload, repeat: int = 10) -> float | None:  # type: ignore[no-untyped-def]
    """Median time of the workload's numpy implementation on the same inputs (None if it has none)."""
    if workload.baseline is None:
        return None
    inputs = workload.random_inputs(0)
    workload.baseline(*inputs)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        workload.baseline(*inputs)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _cmd_tune(args: argparse.Namespace) -> int:
    from probtune import tune
    from probtune.plugins import get_registry
    from probtune.targets import resolve_target
    from probtune.task.driver import strategy_kind
    from probtune.workloads.catalog import resolve_workload

    # resolved before the header, so that a refused run shows only its error
    target = resolve_target(args.target)
    work = resolve_workload(args.workload, args.shape, args.dtype, get_registry().workloads)
    runner = rpc_runner(args)
    guided = strategy_kind(args.strategy).uses_cost_model
    search = f"{args.strategy} search" + (f", cost model {args.cost_model}" if guided else "")
    print(f"tuning {work.key} on target {target.name}: {args.trials} trials ({search}), "
          f"database {args.database}", flush=True)
    result = tune(
        work,
        target=target,
        trials=args.trials,
        database=args.database,
        seed=args.seed,
        batch_size=args.batch_size,
        strategy=args.strategy,
        cost_model=args.cost_model,
        modules=args.modules.split(",") if args.modules else None,
        confirm=args.confirm,
        progress=_print_progress,
        runner=runner,
    )
    failed = {k: v for k, v in result.statuses.items() if k != "ok"}
    print(f"\n{work.key} on {result.target.name}: measured {result.measured} candidates in {result.seconds:.1f} s, "
          f"{result.search_seconds:.1f} s of it searching"
          + (f" (failed: {failed})" if failed else ""))
    if result.rejections:
        print(f"rejected before measurement: {result.rejections}")
    if result.best is None:
        print("no correct program found")
        return 1
    print(f"best:  {_ms(result.best_latency)}  {_gflops(work.flops, result.best_latency)}  (record {result.best.id})")
    numpy_s = _numpy_seconds(work)
    if numpy_s is not None and result.best_latency is not None:
        print(f"numpy: {_ms(numpy_s)}  {_gflops(work.flops, numpy_s)}  "
              f"(probtune/numpy speed ratio {numpy_s / result.best_latency:.2f}x)")
    return 0


def _cmd_best(args: argparse.Namespace) -> int:
    from tvm.s_tir.analysis import estimate_tir_flops

    from probtune.database.database import Database

    if not os.path.exists(args.database):
        print(f"error: no database at {args.database}", file=sys.stderr)
        return 2
    with Database(args.database) as db:
        keys = [m.key.text for m in db.measurements(args.target)] if args.target else [None]
        rows = [row for key in keys for row in db.best_per_workload(key)]
        if not rows:
            print(f"{args.database}: no correct record yet")
            return 0
        print(f"{'workload':<40} {'measured on':<28} {'latency':>12} {'GFLOPS':>8} {'records':>8}  record")
        for workload, record in rows:
            flops = float(estimate_tir_flops(workload.mod))
            gflops = "-" if not record.mean_latency else f"{flops / record.mean_latency / 1e9:.1f}"
            print(f"{workload.key:<40} {record.target:<28} {_ms(record.mean_latency):>12} "
                  f"{gflops:>8} {db.count(workload.id, record.target):>8}  {record.id}")
    return 0


def _cmd_plugins(args: argparse.Namespace) -> int:
    from probtune.plugins import get_registry

    for info in get_registry().plugins.values():
        print(f"{info.name}  ({info.distribution} {info.version})")
        for kind, names in info.registered.items():
            print(f"    {kind}: {', '.join(names)}")
        if info.error:
            print(f"    FAILED: {info.error}")
    return 0


def _cmd_workloads(args: argparse.Namespace) -> int:
    from probtune.plugins import get_registry

    for spec in get_registry().workloads.values():
        params = ",".join(spec.shape_params)
        default = ",".join(map(str, spec.default_shape))
        print(f"{spec.name:<24} shape ({params}) default {default}\n    {spec.description}")
    return 0


def _cmd_targets(args: argparse.Namespace) -> int:
    from probtune.plugins import get_registry

    for spec in get_registry().targets.values():
        print(f"{spec.name:<12} {spec.description}\n    modules: {', '.join(spec.modules)}\n"
              f"    precisions: {', '.join(spec.precisions)}")
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="probtune", description="Automatic tensor-program optimization.")
    sub = parser.add_subparsers(dest="command", required=True)

    tune_p = sub.add_parser("tune", help="tune a workload and record every measurement in the database")
    tune_p.add_argument("--workload", default="matmul", help="catalog name (see 'probtune workloads')")
    tune_p.add_argument("--shape", default=None, help="shape parameters, e.g. 512,512,512 (default: the workload's)")
    tune_p.add_argument("--dtype", default="float32")
    tune_p.add_argument("--target", default="host", help="target name (see 'probtune targets')")
    tune_p.add_argument("--trials", type=_positive_int, default=defaults.OPERATOR_TRIALS)
    tune_p.add_argument("--batch-size", type=_positive_int, default=defaults.BATCH_SIZE,
                        help="candidates measured per search round")
    tune_p.add_argument("--strategy", default="evolutionary",
                        help="search strategy: evolutionary, random, or one a plugin registers (see 'probtune plugins')")
    tune_p.add_argument("--cost-model", default=defaults.COST_MODEL, help="cost model of the evolutionary search (xgb, random)")
    tune_p.add_argument("--seed", type=int, default=0)
    tune_p.add_argument("--modules", default=None, help="comma-separated design-space modules (default: the target's)")
    tune_p.add_argument("--database", default=DEFAULT_DATABASE)
    tune_p.add_argument("--confirm", type=_non_negative_int, default=defaults.CONFIRM,
                        help="best records timed again at the end, to rank them on more than one pass (0: none)")
    add_rpc_options(tune_p)
    tune_p.set_defaults(run=_cmd_tune)

    add_model_commands(sub, _positive_int, _non_negative_int, DEFAULT_DATABASE)
    add_bundle_commands(sub, _non_negative_int, DEFAULT_DATABASE)

    best_p = sub.add_parser("best", help="show the best record per workload and target")
    best_p.add_argument("--database", default=DEFAULT_DATABASE)
    best_p.add_argument("--target", default=None)
    best_p.set_defaults(run=_cmd_best)

    sub.add_parser("plugins", help="list loaded plugins and what they registered").set_defaults(run=_cmd_plugins)
    sub.add_parser("workloads", help="list the workload catalog").set_defaults(run=_cmd_workloads)
    sub.add_parser("targets", help="list the registered targets").set_defaults(run=_cmd_targets)
    add_rpc_command(sub)
    add_db_commands(sub, DEFAULT_DATABASE)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from probtune.errors import ProbtuneError, summary

    _show_stages()
    formatwarning = warnings.formatwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.formatwarning = lambda message, category, *rest: f"warning: {message}\n"  # type: ignore[assignment]
        try:
            return int(args.run(args))
        except ProbtuneError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except Exception as exc:  # a user sees a sentence, not a traceback (PROBTUNE_TRACEBACK=1 shows it)
            if os.environ.get("PROBTUNE_TRACEBACK"):
                raise
            print(f"error: probtune failed unexpectedly ({summary(exc)}); this is a bug in probtune: please report it "
                  "with the command and the model (PROBTUNE_TRACEBACK=1 shows where it failed)", file=sys.stderr)
            return 3
        finally:
            warnings.formatwarning = formatwarning  # main() may be called from a program (or a test) that goes on


def _show_stages() -> None:
    """Print what a run does between and after its trials (``probtune.model``'s and ``probtune.tuning``'s INFO log), once."""
    import logging

    class ToStderr(logging.StreamHandler):  # type: ignore[type-arg]
        """Writes to whatever ``sys.stderr`` is at the time (a test or a caller may have replaced it)."""

        @property  # type: ignore[override]
        def stream(self) -> object:
            return sys.stderr

        @stream.setter
        def stream(self, value: object) -> None:
            pass

    for name in ("probtune.model", "probtune.tuning"):
        stages = logging.getLogger(name)
        if not stages.handlers:
            handler = ToStderr()
            handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
            stages.addHandler(handler)
            stages.setLevel(logging.INFO)

