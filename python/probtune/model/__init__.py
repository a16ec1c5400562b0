"""Whole models: import (ONNX or Relax), tasks, tuning under a task scheduler, compile, check.

Imported on first use (PEP 562), as probtune's own facade.
"""

from typing import TYPE_CHECKING

from probtune._lazy import lazy_attributes

if TYPE_CHECKING:
    from probtune.model.check import CheckReport, check_outputs
    from probtune.model.compile import CompiledModel
    from probtune.model.importer import InputSpec, Model, load_model
    from probtune.model.tasks import extract_tasks, fuse
    from probtune.model.tuning import ModelTuneResult, TaskRow, tune_model

__all__ = [
    "CheckReport",
    "CompiledModel",
    "InputSpec",
    "Model",
    "ModelTuneResult",
    "TaskRow",
    "check_outputs",
    "extract_tasks",
    "fuse",
    "load_model",
    "tune_model",
]

_SOURCE_OF = {
    "CheckReport": "probtune.model.check",
    "check_outputs": "probtune.model.check",
    "CompiledModel": "probtune.model.compile",
    "InputSpec": "probtune.model.importer",
    "Model": "probtune.model.importer",
    "load_model": "probtune.model.importer",
    "extract_tasks": "probtune.model.tasks",
    "fuse": "probtune.model.tasks",
    "ModelTuneResult": "probtune.model.tuning",
    "TaskRow": "probtune.model.tuning",
    "tune_model": "probtune.model.tuning",
}

__getattr__, __dir__ = lazy_attributes(__name__, _SOURCE_OF, __all__)
