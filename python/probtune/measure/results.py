"""What the builder and runner report, and the reference a runner checks against: plain data, no TVM.

Kept apart from the builder and runner so that the plugin interfaces can name
these types without importing the measurement machinery.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["BuildResult", "MeasureReference", "MeasureStatus", "RunResult", "not_built"]


class MeasureStatus(str, Enum):
    """What became of a candidate: the one status type of builders, runners and database records alike."""

    OK = "ok"
    BUILD_ERROR = "build_error"
    RUN_ERROR = "run_error"  # it loaded or ran with an error
    TIMEOUT = "timeout"
    CRASH = "crash"  # it took the process that ran it down
    WRONG_RESULT = "wrong_result"
    INVALID = "invalid"  # rejected before measurement
    DEVICE_LOST = "device_lost"  # the remote device went away while it held the candidate

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class BuildResult:
    """One candidate's build: the shared library's path, or why there is none."""

    artifact: str | None
    error: str | None
    seconds: float  # compile and export time, or until the worker was found dead or too slow

    @property
    def status(self) -> MeasureStatus:
        return MeasureStatus.OK if self.artifact is not None else MeasureStatus.BUILD_ERROR


@dataclass(frozen=True)
class RunResult:
    """One candidate's measurement.

    ``latencies`` (seconds per call, one per repeat) are given for
    ``MeasureStatus.OK`` only, ``error`` says what went wrong otherwise.
    """

    status: MeasureStatus
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


def not_built(item: str | BuildResult | None) -> RunResult | None:
    """What a runner reports for an item of its ``artifacts`` that is no artifact (a failed build), else None."""
    artifact, error = (item.artifact, item.error) if isinstance(item, BuildResult) else (item, None)
    if artifact is not None:
        return None
    return RunResult(MeasureStatus.BUILD_ERROR, (), error or "the candidate did not build", 0.0)
