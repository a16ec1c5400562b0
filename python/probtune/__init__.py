"""probtune: automatic tensor-program optimization with probabilistic programs.

>>> import probtune
>>> result = probtune.tune("matmul", target="host", trials=64, shape=(512, 512, 512), database="tuning.db")
>>> result.best_latency, result.best_trace, result.build()
"""

from __future__ import annotations

from probtune._core import Rng, Trace
from probtune.catalog import WorkloadSpec
from probtune.database import Database, Record
from probtune.errors import (
    DatabaseError,
    DatabaseRowError,
    InvalidDecisionError,
    PluginError,
    ProbtuneError,
    ReplayError,
    SchemaVersionError,
    TraceFormatError,
    TuningConfigError,
    UnknownTargetError,
    UnknownWorkloadError,
    UnsupportedTargetError,
    WorkloadShapeError,
)
from probtune.hookspecs import hookimpl
from probtune.interfaces import SpaceContext, TargetSpec
from probtune.schedule import BlockRV, ExprRV, LoopRV, Schedule
from probtune.space import DesignSpace, generate_space
from probtune.tune import TrialOutcome, TuneResult, compile_best, tune
from probtune.workload import Workload

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "tune",
    "compile_best",
    "TuneResult",
    "TrialOutcome",
    "Schedule",
    "BlockRV",
    "LoopRV",
    "ExprRV",
    "Trace",
    "Rng",
    "DesignSpace",
    "generate_space",
    "Workload",
    "WorkloadSpec",
    "TargetSpec",
    "SpaceContext",
    "Database",
    "Record",
    "hookimpl",
    "ProbtuneError",
    "UnknownWorkloadError",
    "WorkloadShapeError",
    "UnknownTargetError",
    "UnsupportedTargetError",
    "DatabaseError",
    "SchemaVersionError",
    "DatabaseRowError",
    "PluginError",
    "TuningConfigError",
    "ReplayError",
    "InvalidDecisionError",
    "TraceFormatError",
]
