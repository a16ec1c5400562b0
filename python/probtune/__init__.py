"""probtune: automatic tensor-program optimization with probabilistic programs.

>>> import probtune
>>> result = probtune.tune("matmul", target="host", trials=64, shape=(512, 512, 512), database="tuning.db")
>>> result.best_latency, result.best_trace, result.build()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from probtune._lazy import lazy_attributes

if TYPE_CHECKING:
    from probtune._core import Rng, Trace
    from probtune.database.database import Database, Record
    from probtune.errors import (
        DatabaseError,
        DatabaseRowError,
        DeviceError,
        InvalidDecisionError,
        ModelCheckError,
        ModelCompileError,
        ModelImportError,
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
    from probtune.measure import LocalBuilder, LocalRunner, MeasureStatus, RPCRunner
    from probtune.model import CompiledModel, Model, ModelTuneResult, load_model, tune_model
    from probtune.schedule.schedule import BlockRV, ExprRV, InstructionKind, LoopRV, Schedule
    from probtune.space.design_space import DesignSpace
    from probtune.space.space_generator import generate_space
    from probtune.task.task import Task
    from probtune.task.tuning import TrialOutcome, TuneResult, compile_best, tune
    from probtune.workloads.catalog import WorkloadSpec
    from probtune.workloads.workload import Workload

__version__ = "0.1.0"

__all__ = [
    "BlockRV",
    "CompiledModel",
    "Database",
    "DatabaseError",
    "DatabaseRowError",
    "DesignSpace",
    "DeviceError",
    "ExprRV",
    "InstructionKind",
    "InvalidDecisionError",
    "LocalBuilder",
    "LocalRunner",
    "LoopRV",
    "MeasureStatus",
    "Model",
    "ModelCheckError",
    "ModelCompileError",
    "ModelImportError",
    "ModelTuneResult",
    "PluginError",
    "ProbtuneError",
    "RPCRunner",
    "Record",
    "ReplayError",
    "Rng",
    "Schedule",
    "SchemaVersionError",
    "SpaceContext",
    "TargetSpec",
    "Task",
    "Trace",
    "TraceFormatError",
    "TrialOutcome",
    "TuneResult",
    "TuningConfigError",
    "UnknownTargetError",
    "UnknownWorkloadError",
    "UnsupportedTargetError",
    "Workload",
    "WorkloadShapeError",
    "WorkloadSpec",
    "__version__",
    "compile_best",
    "generate_space",
    "hookimpl",
    "load_model",
    "tune",
    "tune_model",
]

# What each public name is imported from, on first use (PEP 562): importing
# probtune itself loads neither TVM nor the compiled core, so a measurement child
# that only needs TVM's runtime (or a CLI asked for --help) does not pay for them.
_SOURCE_OF = {
    "tune": "probtune.task.tuning",
    "compile_best": "probtune.task.tuning",
    "TuneResult": "probtune.task.tuning",
    "TrialOutcome": "probtune.measure.pipeline",
    "load_model": "probtune.model",
    "tune_model": "probtune.model",
    "Model": "probtune.model",
    "ModelTuneResult": "probtune.model",
    "CompiledModel": "probtune.model",
    "Schedule": "probtune.schedule.schedule",
    "BlockRV": "probtune.schedule.schedule",
    "LoopRV": "probtune.schedule.schedule",
    "ExprRV": "probtune.schedule.schedule",
    "InstructionKind": "probtune.schedule.schedule",
    "Trace": "probtune._core",
    "Rng": "probtune._core",
    "DesignSpace": "probtune.space.design_space",
    "generate_space": "probtune.space.space_generator",
    "Workload": "probtune.workloads.workload",
    "Task": "probtune.task.task",
    "WorkloadSpec": "probtune.workloads.catalog",
    "TargetSpec": "probtune.interfaces",
    "SpaceContext": "probtune.interfaces",
    "Database": "probtune.database.database",
    "LocalBuilder": "probtune.measure",
    "LocalRunner": "probtune.measure",
    "MeasureStatus": "probtune.measure",
    "RPCRunner": "probtune.measure",
    "Record": "probtune.database.database",
    "hookimpl": "probtune.hookspecs",
    **{name: "probtune.errors" for name in __all__ if name.endswith("Error")},
}


__getattr__, __dir__ = lazy_attributes(__name__, _SOURCE_OF, __all__)
