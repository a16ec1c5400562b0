"""Whether a model's tasks are timed with cold caches: as the model finds its data when it runs.

A model whose weights and largest activations fit in the last-level cache
finds them there at every inference after the first, and its tasks are timed
warm; timed with that cache flushed, they would pay memory reads the model
never makes, and the search would favour programs built for them. A larger
model reads its weights from memory, and its tasks are timed cold
(``MODEL_CACHE_FLUSH``). Only the local runner's machine has a cache this
module can read; another runner keeps ``MODEL_CACHE_FLUSH``. A database that
already holds records of the model's tasks in one of the two modes keeps to
it, so that a run resumes with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant

from probtune.database.database import Database
from probtune.defaults import LOCAL, MODEL_CACHE_FLUSH
from probtune.interfaces import TargetSpec
from probtune.measure.runner import local_device_name
from probtune.measure.timing import last_level_cache_bytes
from probtune.model.transposes import static_shape
from probtune.task.task import Task

__all__ = ["model_cache_flush", "model_footprint"]


def model_cache_flush(
    fused: tvm.IRModule, tasks: Sequence[Task], spec: TargetSpec, database: str | Path | None, runner: str | None
) -> tuple[bool, str]:
    """Whether ``fused``'s tasks are timed with cold caches when ``runner`` (None: the target's) measures them, and why."""
    if (runner or spec.runner) != LOCAL:
        return MODEL_CACHE_FLUSH, "the default where the measuring machine's caches are not known"
    recorded = _recorded_modes(tasks, spec, database)
    if len(recorded) == 1:
        return recorded.pop(), "as the database's records of the model's tasks were timed"
    footprint, cache = model_footprint(fused), last_level_cache_bytes()
    fits = "fit in" if footprint <= cache else "outgrow"
    return footprint > cache, f"its weights and largest tensors ({_mib(footprint)}) {fits} the last-level cache ({_mib(cache)})"


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def model_footprint(fused: tvm.IRModule) -> int:
    """Bytes a model's inference keeps in use: its constants (weights) and twice its largest tensor (a layer's input
    and output)."""
    constants: dict[Constant, int] = {}
    largest = 0

    def visit(expr: relax.Expr) -> None:
        nonlocal largest
        if isinstance(expr, Constant) and hasattr(expr.value, "numpy"):  # a tensor, not a scalar of the IR
            constants[expr] = expr.value.numpy().nbytes
        elif isinstance(expr, relax.Var):
            largest = max(largest, _tensor_bytes(expr.ty))

    for function in fused.functions.values():
        if isinstance(function, relax.Function):
            relax.analysis.post_order_visit(function, visit)
    return sum(constants.values()) + 2 * largest


def _tensor_bytes(ty: object) -> int:
    """A statically shaped tensor's bytes; 0 for anything else."""
    if not isinstance(ty, relax.TensorType):
        return 0
    shape = static_shape(ty.shape)
    return 0 if shape is None else int(np.prod(shape, dtype=np.int64)) * np.dtype(str(ty.dtype)).itemsize


def _recorded_modes(tasks: Sequence[Task], spec: TargetSpec, database: str | Path | None) -> set[bool]:
    """The timing modes (cold or not) under which ``database`` holds records of any of ``tasks`` on this machine."""
    if database is None or not Path(database).is_file():
        return set()
    device = local_device_name(spec)
    with Database(database) as db:
        keys = [m.key for m in db.measurements() if m.key.target == spec.name and m.device == device]
        ids = [row.id for row in (db.find_workload(task.workload.mod) for task in tasks) if row is not None]
        return {key.cold for key in keys if any(db.count(i, key) for i in ids)}
