"""``probtune bundle`` and ``probtune import-results``: measuring on a device that no runner reaches."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from probtune.cli.model import input_shape_option, input_shapes
from probtune.defaults import BATCH_SIZE, BUNDLE_REFERENCE_MB, COST_MODEL, MODEL_ROUND_CANDIDATES, PRECISIONS
from probtune.errors import TuningConfigError

__all__ = ["add_bundle_commands"]


def add_bundle_commands(sub: Any, non_negative_int: Callable[[str], int], default_database: str) -> None:
    bundle_p = sub.add_parser(
        "bundle", help="write new candidates of a workload, built, with a script that measures them on another machine"
    )
    bundle_p.add_argument("output", help="the bundle's folder (new or empty)")
    bundle_p.add_argument("--device", required=True, help="the device it is for: records are kept under TARGET@DEVICE")
    bundle_p.add_argument("--workload", default="matmul", help="catalog name (see 'probtune workloads')")
    bundle_p.add_argument("--model", help="an ONNX model instead of a workload: one round of it (a model bundle, and "
                                          "with --candidates new candidates of each task)")
    input_shape_option(bundle_p)
    bundle_p.add_argument("--precision", choices=PRECISIONS, default="fp32", help="a model's precision (see tune-model)")
    bundle_p.add_argument("--shape", default=None, help="shape parameters, e.g. 512,512,512 (default: the workload's)")
    bundle_p.add_argument("--dtype", default="float32")
    bundle_p.add_argument("--target", default="host", help="target name (see 'probtune targets')")
    bundle_p.add_argument("--candidates", type=non_negative_int, default=None,
                          help=f"how many (default: one search round's); of a model, per task (default "
                               f"{MODEL_ROUND_CANDIDATES}; 0: the model bundle alone)")
    bundle_p.add_argument("--cost-model", default=COST_MODEL)
    bundle_p.add_argument("--seed", type=int, default=0)
    bundle_p.add_argument("--cache-flush", action="store_true", help="time each call with cold caches")
    bundle_p.add_argument("--reference-mb", type=float, default=BUNDLE_REFERENCE_MB,
                          help="a larger reference travels as its inputs' seed and sampled outputs "
                               f"(default: {BUNDLE_REFERENCE_MB:g})")
    bundle_p.add_argument("--database", default=default_database)
    bundle_p.set_defaults(run=_cmd_bundle)
    import_p = sub.add_parser("import-results", help="record what a bundle's script measured, and learn from it")
    import_p.add_argument("bundle", help="the bundle's folder, with the results.jsonl its script wrote")
    import_p.add_argument("--cost-model", default=COST_MODEL)
    import_p.add_argument("--database", default=default_database)
    import_p.set_defaults(run=_cmd_import)


def _cmd_bundle(args: argparse.Namespace) -> int:
    from probtune.measure.bundle import write_bundle

    if args.model:
        return _model_round(args)
    if args.candidates is not None and args.candidates < 1:
        raise TuningConfigError(f"candidates must be at least 1, got {args.candidates}")
    written = write_bundle(
        args.workload, args.output, device=args.device, target=args.target, database=args.database,
        candidates=args.candidates or BATCH_SIZE, shape=args.shape, dtype=args.dtype, seed=args.seed,
        cost_model=args.cost_model, cache_flush=args.cache_flush, reference_mb=args.reference_mb,
    )
    failed = f"; {written.build_errors} failed to build (recorded)" if written.build_errors else ""
    print(f"{written.path}: {written.candidates} candidates for {written.measured_on}{failed}")
    print(f"on the device: python {written.path}/run_bundle.py   then here: probtune import-results {written.path}")
    return 0


def _model_round(args: argparse.Namespace) -> int:
    from probtune.model.rounds import write_model_round

    done = write_model_round(args.model, args.output, device=args.device, target=args.target, database=args.database,
                             candidates=MODEL_ROUND_CANDIDATES if args.candidates is None else args.candidates,
                             precision=args.precision, input_shapes=input_shapes(args.input_shape), seed=args.seed)
    print(f"{done.path}: the model ({done.model.functions} functions, {done.model.launches} launches; "
          f"{done.tuned_tasks} of {done.tasks} tasks tuned on {args.device})"
          + (f", and {sum(done.task_bundles.values())} candidates of {len(done.task_bundles)} tasks" if done.task_bundles else ""))
    for task, why in done.refused.items():
        print(f"no candidates of {task}: {why}")
    print(f"on the device: python {done.path}/model/run_model_bundle.py, and python run_bundle.py in each of "
          f"{done.path}/tasks/*; then here: probtune import-results {done.path}")
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from probtune.measure.bundle import import_results

    if Path(args.bundle, "tasks").is_dir() or Path(args.bundle, "model").is_dir():
        return _import_round(args)
    done = import_results(args.bundle, args.database, cost_model=args.cost_model)
    counts = ", ".join(f"{count} {status}" for status, count in sorted(done.statuses.items())) or "nothing new"
    print(f"{args.bundle}: measured on {done.device}; recorded under {done.measured_on}: {counts}"
          + (f" ({done.already_recorded} recorded before)" if done.already_recorded else "")
          + (f"; {done.unmeasured} not measured" if done.unmeasured else ""))
    if done.best_latency is not None:
        print(f"best so far: {done.best_latency * 1e3:.4f} ms")
    return 0


def _import_round(args: argparse.Namespace) -> int:
    from probtune.model.rounds import import_model_round

    found = import_model_round(args.bundle, args.database, cost_model=args.cost_model)
    for name, done in found.items():
        counts = ", ".join(f"{count} {status}" for status, count in sorted(done.statuses.items())) or "nothing new"
        print(f"{name}: {counts}")
    print(f"{args.bundle}: {len(found)} task bundles recorded" if found else f"{args.bundle}: no task bundle has results")
    return 0
