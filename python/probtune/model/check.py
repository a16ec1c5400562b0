"""Check a compiled model against a reference: onnxruntime for an ONNX model, else the untuned Relax build.

A mismatch is an error (:class:`~probtune.errors.ModelCheckError`), never a
warning: a fast model that computes something else is worth nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax

from probtune.errors import ModelCheckError, summary
from probtune.model.importer import Model
from probtune.model.precision import TOLERANCES

__all__ = ["CheckReport", "check_outputs", "onnxruntime_runner", "outputs_to_numpy", "reference_outputs"]

RTOL, ATOL_SCALE = TOLERANCES["fp32"]
"""Outputs agree when ``|got - want| <= RTOL * |want| + ATOL_SCALE * rms(want)``, per output.

Tuned kernels reorder floating-point sums, and a model chains many of them
(onnxslim also folds batch norms into convolutions): errors of 1e-5 relative
per layer add up over tens of layers. A wrong program is off by far more.
A model compiled in float16 is checked with that precision's tolerance."""


@dataclass(frozen=True)
class CheckReport:
    """How close the compiled model's outputs came to the reference's, and against what."""

    reference: str  # "onnxruntime" or "untuned build"
    max_abs_error: float
    max_rel_error: float  # largest error relative to the output's root-mean-square magnitude
    rtol: float
    atol_scale: float

    def __str__(self) -> str:
        return (
            f"outputs match {self.reference}: max abs error {self.max_abs_error:.3g}, "
            f"{self.max_rel_error:.3g} of the output's RMS (tolerance rtol {self.rtol:g}, "
            f"atol {self.atol_scale:g} x RMS)"
        )


def reference_outputs(model: Model, inputs: Sequence[np.ndarray]) -> tuple[str, list[np.ndarray]]:
    """What the model should compute on ``inputs``, and what computed it.

    An ONNX model that onnxruntime cannot load or run (an operator it lacks at
    the model's opset, say) is computed by TVM's untuned build instead, and the
    name says so.
    """
    if model.onnx_model is not None:
        try:
            return "onnxruntime", onnxruntime_runner(model)(*inputs)
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own Fail, InvalidGraph, NotImplemented...
            return f"untuned build (onnxruntime cannot run the model: {summary(exc, 200)})", _untuned_outputs(model, inputs)
    return "untuned build", _untuned_outputs(model, inputs)


def check_outputs(
    model: Model, run: Callable[..., list[np.ndarray]], seed: int = 0, tolerance: tuple[float, float] = (RTOL, ATOL_SCALE)
) -> CheckReport:
    """Run ``run`` (a compiled model) and the reference on random inputs; raise if any output differs.

    ``tolerance`` is (rtol, atol as a share of the output's RMS): a precision's ``TOLERANCES``.
    NaNs must come where the reference has them (random inputs may leave a
    function's domain, as a square root's), infinities equal; the rest is
    compared within the tolerance, scaled by the finite outputs' RMS.
    """
    rtol, atol_scale = tolerance
    inputs = model.random_inputs(seed)
    reference, want = reference_outputs(model, inputs)
    got = run(*inputs)
    if len(got) != len(want):
        raise ModelCheckError(f"the compiled model gives {len(got)} outputs, {reference} gives {len(want)}")
    worst_abs = worst_rel = 0.0
    for index, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape:
            raise ModelCheckError(f"output {index} has shape {g.shape}, {reference}'s has {w.shape}")
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        finite = np.isfinite(w64)
        scale = math.sqrt(float(np.mean(np.square(w64[finite])))) if finite.any() else 0.0
        with np.errstate(invalid="ignore"):
            error = np.where(finite, np.abs(g64 - w64), 0.0)
        bad = (error > rtol * np.abs(np.where(finite, w64, 0.0)) + atol_scale * scale) | np.isnan(error)
        bad |= ~finite & ~((g64 == w64) | (np.isnan(g64) & np.isnan(w64)))
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ModelCheckError(
                f"output {index} of the compiled model differs from {reference}'s in {int(bad.sum())} of {w.size} "
                f"elements (first at {where}: {g[where]!r} against {w[where]!r}; tolerance rtol {rtol:g}, "
                f"atol {atol_scale:g} x RMS {scale:.3g})"
            )
        worst_abs = max(worst_abs, float(error.max(initial=0.0)))
        worst_rel = max(worst_rel, float(error.max(initial=0.0)) / scale if scale else 0.0)
    return CheckReport(reference, worst_abs, worst_rel, rtol, atol_scale)


def onnxruntime_runner(model: Model, threads: int | None = None) -> Callable[..., list[np.ndarray]]:
    """The ONNX model the ``model`` came from, run by onnxruntime on its CPU: ``run(*inputs) -> outputs``.

    ``threads`` sets onnxruntime's intra-op threads (None: its own default).
    """
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    if threads is not None:
        options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(
        model.onnx_model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    names = [spec.name for spec in model.inputs]
    return lambda *inputs: [np.asarray(out) for out in session.run(None, dict(zip(names, inputs)))]


def _untuned_outputs(model: Model, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    executable = tvm.compile(model.mod, target=tvm.target.Target({"kind": "llvm"}))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return outputs_to_numpy(vm["main"](*[tvm.runtime.tensor(np.asarray(a, order="C")) for a in inputs]))


def outputs_to_numpy(out: Any) -> list[np.ndarray]:
    """A VM's result (a tensor, or nested tuples of them) as a flat list of arrays."""
    if isinstance(out, tvm.runtime.Tensor):
        return [out.numpy()]
    return [array for item in out for array in outputs_to_numpy(item)]
