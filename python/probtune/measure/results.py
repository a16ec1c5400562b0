"""What the builder and runner report, and the reference a runner checks against: plain data, no TVM.

Kept apart from the builder and runner so that the plugin interfaces can name
these types without importing the measurement machinery.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BuildResult", "MeasureReference", "RunResult"]


@dataclass(frozen=True)
class BuildResult:
    """One candidate's build: the shared library's path, or why there is none."""

    artifact: str | None
    error: str | None
    seconds: float  # compile and export time, or until the worker was found dead or too slow


@dataclass(frozen=True)
class RunResult:
    """One candidate's measurement.

    ``status`` is "ok", "build_error", "run_error", "timeout", "crash" or
    "wrong_result"; ``latencies`` (seconds per call, one per repeat) are given
    for "ok" only, ``error`` says what went wrong otherwise.
    """

    status: str
    latencies: tuple[float, ...]
    error: str | None
    seconds: float  # wall time spent on this candidate


@dataclass(frozen=True)
class MeasureReference:
    """Where the runner finds the inputs and expected outputs, and how close outputs must be."""

    path: str  # .npz with input_0.. and output_0..; its name carries a digest of its content
    num_inputs: int
    rtol: float
    atol: float
