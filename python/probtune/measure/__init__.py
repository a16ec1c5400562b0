"""Measurement: build candidates in parallel worker processes, then check and time them one by one.

Every candidate gets a result, even one that fails to compile, crashes or hangs
its process, or computes a wrong answer; results are yielded as they arrive so
that the caller can record each at once.  The caller builds a batch, then runs
it: idle builder workers use no CPU, so compilation does not disturb timings.
"""

from probtune.measure.builder import BuildResult, LocalBuilder
from probtune.measure.runner import LocalRunner, MeasureReference, RunResult, prepare_reference

__all__ = [
    "BuildResult",
    "LocalBuilder",
    "LocalRunner",
    "MeasureReference",
    "RunResult",
    "prepare_reference",
]
