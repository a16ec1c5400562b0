"""Measurement: build candidates in parallel worker processes, then check and time them one by one.

Every candidate gets a result, even one that fails to compile, crashes or hangs
its process, or computes a wrong answer; results are yielded as they arrive so
that the caller can record each at once.  The caller builds a batch, then runs
it: idle builder workers use no CPU, so compilation does not disturb timings.

Also here, imported by their own paths: the pipeline a run's tasks share
(``pipeline``), how a finished program is compiled (``codegen``), the form a
candidate is timed in (``constant_layouts``) and measurement bundles
(``bundle``, with the files copied into them: ``run_bundle``, ``run_model_bundle``,
``bundle_runtimes``, ``timing``).
"""

from typing import TYPE_CHECKING

from probtune._lazy import lazy_attributes

if TYPE_CHECKING:
    from probtune.measure.builder import LocalBuilder
    from probtune.measure.results import BuildResult, MeasureReference, MeasureStatus, RunResult
    from probtune.measure.rpc import RPCRunner
    from probtune.measure.runner import LocalRunner, prepare_reference, save_reference

__all__ = [
    "BuildResult",
    "LocalBuilder",
    "LocalRunner",
    "MeasureReference",
    "MeasureStatus",
    "RPCRunner",
    "RunResult",
    "prepare_reference",
    "save_reference",
]

# Imported on first use (PEP 562), as in probtune's own facade: a measurement
# child imports probtune.measure._worker, and with it this package, but not TVM.
_SOURCE_OF = {
    "BuildResult": "probtune.measure.results",
    "LocalBuilder": "probtune.measure.builder",
    "LocalRunner": "probtune.measure.runner",
    "MeasureReference": "probtune.measure.results",
    "MeasureStatus": "probtune.measure.results",
    "RPCRunner": "probtune.measure.rpc",
    "RunResult": "probtune.measure.results",
    "prepare_reference": "probtune.measure.runner",
    "save_reference": "probtune.measure.runner",
}


__getattr__, __dir__ = lazy_attributes(__name__, _SOURCE_OF, __all__)
