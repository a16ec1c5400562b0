"""Errors raised by probtune: each names the problem so the user can fix the input."""

from __future__ import annotations

import contextlib
import os
import sys
import types
import warnings

from probtune._core import InvalidDecisionError, TraceFormatError

__all__ = [
    "NOT_REPLAYABLE",
    "DatabaseError",
    "DatabaseRowError",
    "DeviceError",
    "InvalidDecisionError",
    "ModelCheckError",
    "ModelCompileError",
    "ModelImportError",
    "PluginError",
    "ProbtuneError",
    "ReplayError",
    "SchemaVersionError",
    "TraceFormatError",
    "TuningConfigError",
    "UnknownTargetError",
    "UnknownWorkloadError",
    "UnsupportedTargetError",
    "WorkloadShapeError",
    "warn_caller",
]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_CONTEXTLIB = os.path.abspath(contextlib.__file__)  # probtune's context managers are entered through it


def _inside_probtune(filename: str) -> bool:
    path = os.path.abspath(filename)
    return path.startswith(_PACKAGE_DIR) or path == _CONTEXTLIB


def warn_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """Warn at the line that called into probtune: the first frame outside this package.

    A counted ``stacklevel`` is right for one call path only; the same warning
    is often reached from ``tune``, ``compile_best`` and helpers at different depths.
    """
    frame: types.FrameType | None = sys._getframe(1)
    level = 2  # the caller of this function
    while frame is not None and _inside_probtune(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


class ProbtuneError(Exception):
    """Base class of probtune's own errors."""


class UnknownWorkloadError(ProbtuneError, KeyError):
    """A workload name that no catalog entry (built-in or plugin) provides."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class WorkloadShapeError(ProbtuneError, ValueError):
    """A shape that does not fit the workload (wrong arity, non-positive sizes...)."""


class UnknownTargetError(ProbtuneError, ValueError):
    """A target name that no target plugin registered."""


class UnsupportedTargetError(ProbtuneError, RuntimeError):
    """A target whose code this machine cannot run (an instruction set or a device it lacks)."""


class DeviceError(ProbtuneError, RuntimeError):
    """A measuring device, or the RPC tracker in front of it, that cannot be reached or is gone."""


class DatabaseError(ProbtuneError):
    """A tuning database that cannot be opened or used."""


class SchemaVersionError(DatabaseError):
    """A database written by another schema version of probtune."""


class DatabaseRowError(DatabaseError):
    """A database row whose content does not parse."""


class PluginError(ProbtuneError):
    """A plugin that registered something malformed or conflicting."""


class TuningConfigError(ProbtuneError, ValueError):
    """Bad tuning parameters, e.g. trials <= 0."""


class ReplayError(ProbtuneError):
    """A trace instruction that TVM refused while replaying (the program it names is illegal)."""


class ModelImportError(ProbtuneError, ValueError):
    """A model that cannot be imported: not a file, not ONNX, an unsupported operator, an input without a shape."""


class ModelCompileError(ProbtuneError):
    """A model that TVM cannot compile for the target: an operator with no lowering in the layout it was given, say."""


class ModelCheckError(ProbtuneError):
    """A compiled model whose outputs differ from the reference's (onnxruntime, or the untuned build)."""


NOT_REPLAYABLE = (ReplayError, InvalidDecisionError, TraceFormatError)
"""What replaying a trace raises when the trace cannot be followed: TVM refused an
instruction, a decision does not fit, or the trace itself is malformed (a bad
database row). Whoever replays traces it did not just make catches all three."""


def summary(exc: BaseException, limit: int = 600) -> str:
    """An error's class and message on one line, without TVM's printer notes ('# Metadata omitted...').

    A message longer than ``limit`` loses its middle: TVM says what failed
    first, onnxruntime last (after the source location).
    """
    lines = [line.strip() for line in str(exc).splitlines()]
    text = " ".join(line for line in lines if line and not line.startswith("#")) or type(exc).__name__
    text = f"{type(exc).__name__}: {text}"
    head = (limit - 5) * 2 // 5
    return text if len(text) <= limit else f"{text[:head]} ... {text[len(text) - (limit - 5 - head):]}"


def last_line(exc: BaseException) -> str:
    """The last line of an error's message: TVM's long messages end with the cause."""
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__
