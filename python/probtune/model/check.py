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
from probtune.model.rounded_reference import rounded_operands

__all__ = ["CheckReport", "check_outputs", "flat_outputs", "onnxruntime_runner", "outputs_to_numpy", "reference_outputs"]

RTOL, ATOL_SCALE = TOLERANCES["fp32"]
"""Outputs agree when ``|got - want| <= RTOL * |want| + ATOL_SCALE * rms(want)``, per output.

Tuned kernels reorder floating-point sums, and a model chains many of them
(onnxslim also folds batch norms into convolutions): errors of 1e-5 relative
per layer add up over tens of layers. A wrong program is off by far more.
A model compiled in float16 or bfloat16 is checked with that precision's tolerance."""

QUANTIZATION_STEPS = 1
"""An output a quantized model dequantizes from 8 bits may differ by this many of its steps (its scale).

onnxruntime adds quantized tensors in fixed point (``QLinearAdd``) and
probtune in float32, so a sum that falls within a rounding of a half lands
one step apart in a few elements; a wrong program is off by many steps."""

SPREAD_MARGIN = 2.0
"""A quantized model's output may differ from onnxruntime's by this many times as much as onnxruntime's own
unoptimized and optimized graphs differ from each other on the same inputs (an output dequantized from 8 bits, by its
steps' allowance where that is more).

A model that quantizes its activations (at run time, as dynamically
quantized ones do, or statically) rounds each to 8 bits: a float difference
in the last bit, from fused operators, flips a rounding, and the flip
carries on to the output. How far onnxruntime's own two graphs fall apart
on the same inputs is what such flips legitimately cost; a wrong program
differs by about the whole output. An output that is not dequantized from 8
bits may also differ by this many times as much as onnxruntime's own output
moves when its float inputs move by a couple of ulps (``INPUT_NOISE``): where
both of its graphs run the same kernels (a dynamically quantized speech
encoder's), they agree to the last bit, and only this shows what a float
difference in the last bit costs."""

INPUT_NOISE = 2.0**-22
"""The relative change put on a quantizing model's float inputs to see how far onnxruntime's outputs move for a
difference in the last bits (``SPREAD_MARGIN``)."""

ROUNDING_MARGIN = 2.0
"""A model compiled in fp16 or bf16 may differ from onnxruntime's float32 by this many times as much as onnxruntime
itself does when its products read their operands rounded to that type (:mod:`probtune.model.rounded_reference`),
where that is more than the precision's tolerance; a wrong program differs by about the whole output."""

_QUANTIZING_OPS = ("QuantizeLinear", "DynamicQuantizeLinear")


@dataclass(frozen=True)
class CheckReport:
    """How close the compiled model's outputs came to the reference's, and against what."""

    reference: str  # "onnxruntime" or "untuned build"
    max_abs_error: float
    max_rel_error: float  # largest error relative to the output's root-mean-square magnitude
    rtol: float
    atol_scale: float
    stepped: tuple[int, int] | None = None  # quantized outputs: elements a step apart, of how many
    spread: float | None = None  # a quantizing model's outputs: onnxruntime's own spread, as a share of RMS
    precision: str = "fp32"  # what the model was compiled in, whose tolerance applies
    rounding: float | None = None  # fp16 or bf16: onnxruntime's spread from rounding operands, as a share of RMS

    def __str__(self) -> str:
        text = (
            f"outputs match {self.reference}: max abs error {self.max_abs_error:.3g}, "
            f"{self.max_rel_error:.3g} of the output's RMS (tolerance rtol {self.rtol:g}, "
            f"atol {self.atol_scale:g} x RMS{'' if self.precision == 'fp32' else ', for ' + self.precision})"
        )
        if self.stepped is not None:
            text += (
                f"; quantized outputs: {self.stepped[0]} of {self.stepped[1]} elements a quantization step or more "
                f"apart ({QUANTIZATION_STEPS} allowed, more where onnxruntime's own graphs differ more), the rest equal"
            )
        if self.spread is not None:
            text += (
                f"; a quantizing model: onnxruntime's own spread (its unoptimized against its optimized graph, and "
                f"where the output is float, for inputs a few ulps apart) is up to {self.spread:.3g} of the RMS, "
                f"{SPREAD_MARGIN:g}x that allowed"
            )
        if self.rounding is not None:
            text += (
                f"; onnxruntime with its products' operands rounded to {self.precision} differs from its float32 "
                f"by up to {self.rounding:.3g} of the RMS, {ROUNDING_MARGIN:g}x that allowed"
            )
        return text


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
    model: Model, run: Callable[..., list[np.ndarray]], seed: int = 0, precision: str = "fp32"
) -> CheckReport:
    """Run ``run`` (a compiled model) and the reference on random inputs; raise if any output differs.

    The tolerance is (rtol, atol as a share of the output's RMS) of the precision the model was compiled in
    (``TOLERANCES``).
    NaNs must come where the reference has them (random inputs may leave a
    function's domain, as a square root's), infinities equal; the rest is
    compared within the tolerance, scaled by the finite outputs' RMS.
    """
    rtol, atol_scale = TOLERANCES[precision]
    inputs = model.random_inputs(seed)
    reference, want = reference_outputs(model, inputs)
    got = run(*inputs)
    if len(got) != len(want):
        raise ModelCheckError(f"the compiled model gives {len(got)} outputs, {reference} gives {len(want)}")
    worst_abs = worst_rel = 0.0
    quantized = _QuantizedAllowance.of(model, reference, inputs, want)
    rounding = _rounding_spreads(model, reference, inputs, want, precision)
    worst_rounding: float | None = None
    for index, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape:
            raise ModelCheckError(f"output {index} has shape {g.shape}, {reference}'s has {w.shape}")
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        finite = np.isfinite(w64)
        scale = math.sqrt(float(np.mean(np.square(w64[finite])))) if finite.any() else 0.0
        with np.errstate(invalid="ignore"):
            error = np.where(finite, np.abs(g64 - w64), 0.0)
        allowed = quantized.widen(index, rtol * np.abs(np.where(finite, w64, 0.0)) + atol_scale * scale, error, scale)
        if index in rounding:
            allowed = np.maximum(allowed, ROUNDING_MARGIN * rounding[index])
            worst_rounding = max(worst_rounding or 0.0, rounding[index] / scale if scale else 0.0)
        bad = (error > allowed) | np.isnan(error)
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
    stepped = quantized.stepped if quantized.stepped[1] else None
    return CheckReport(
        reference, worst_abs, worst_rel, rtol, atol_scale, stepped, quantized.worst_spread, precision, worst_rounding
    )


@dataclass
class _QuantizedAllowance:
    """A quantized model's wider tolerances: a step on outputs dequantized from 8 bits, onnxruntime's own spread
    on all of them; and what the outputs used of them."""

    steps: dict[int, float]
    spreads: dict[int, float]
    noise: dict[int, float]
    stepped: tuple[int, int] = (0, 0)
    worst_spread: float | None = None

    @classmethod
    def of(
        cls, model: Model, reference: str, inputs: Sequence[np.ndarray], want: list[np.ndarray]
    ) -> _QuantizedAllowance:
        if not (reference == "onnxruntime" and _quantizes(model)):
            return cls(_quantization_steps(model), {}, {})
        return cls(_quantization_steps(model), _reference_spread(model, inputs, want), _noise_spread(model, inputs, want))

    def widen(self, index: int, allowed: np.ndarray, error: np.ndarray, scale: float) -> np.ndarray:
        """Output ``index``'s allowed errors, widened where the model quantizes it."""
        step = self.steps.get(index)
        spread = self.spreads.get(index)
        if step:
            self.stepped = (self.stepped[0] + int(np.count_nonzero(error > step / 2)), self.stepped[1] + error.size)
            allowed = np.maximum(allowed, (QUANTIZATION_STEPS + 0.5) * step)  # the outputs are whole steps apart
        elif index in self.noise:  # a float output: a flip in the last bits moves it this far too
            spread = max(spread or 0.0, self.noise[index])
        if spread is not None:
            self.worst_spread = max(self.worst_spread or 0.0, spread / scale if scale else 0.0)
            allowed = np.maximum(allowed, SPREAD_MARGIN * spread)
        return allowed


def _quantizes(model: Model) -> bool:
    """Whether the ONNX model rounds any tensor to integers (statically or at run time)."""
    return model.onnx_model is not None and any(node.op_type in _QUANTIZING_OPS for node in model.onnx_model.graph.node)


def _reference_spread(model: Model, inputs: Sequence[np.ndarray], optimized: list[np.ndarray]) -> dict[int, float]:
    """How far onnxruntime's unoptimized graph's outputs lie from its optimized graph's (``optimized``), by output."""
    return _largest_differences(onnxruntime_runner(model, optimize=False)(*inputs), optimized)


def _noise_spread(model: Model, inputs: Sequence[np.ndarray], want: list[np.ndarray]) -> dict[int, float]:
    """How far onnxruntime's outputs (``want``) move when the float inputs move by ``INPUT_NOISE`` of themselves, by
    output; none for a model without float inputs."""
    rng = np.random.default_rng(1)
    floats = [np.issubdtype(x.dtype, np.floating) for x in inputs]
    if not any(floats):
        return {}
    moved = [(x * (1.0 + INPUT_NOISE * rng.standard_normal(x.shape))).astype(x.dtype) if is_float else x
             for x, is_float in zip(inputs, floats)]
    return _largest_differences(onnxruntime_runner(model)(*moved), want)


def _rounding_spreads(
    model: Model, reference: str, inputs: Sequence[np.ndarray], want: list[np.ndarray], precision: str
) -> dict[int, float]:
    """For fp16 and bf16, how far onnxruntime's outputs move (from ``want``) when its products read their operands
    rounded to that type, by output; none where onnxruntime is not the reference or cannot run the rounded model."""
    if precision == "fp32" or reference != "onnxruntime":
        return {}
    rounded = rounded_operands(model.onnx_model, precision)
    if rounded is None:
        return {}
    try:
        outputs = onnxruntime_runner(model, onnx_model=rounded)(*inputs)
    except Exception:  # noqa: BLE001 - onnxruntime refuses a cast its opset lacks (bfloat16 before opset 13)
        return {}
    return _largest_differences(outputs, want)


def _largest_differences(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> dict[int, float]:
    spreads = {}
    for index, (a, b) in enumerate(zip(got, want)):
        with np.errstate(invalid="ignore"):
            difference = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
        spreads[index] = float(np.nanmax(difference, initial=0.0))
    return spreads


def _quantization_steps(model: Model) -> dict[int, float]:
    """The step of each ONNX output that a per-tensor ``DequantizeLinear`` makes from 8-bit integers, by index."""
    if model.onnx_model is None:
        return {}
    from onnx import numpy_helper

    graph = model.onnx_model.graph
    constants = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    producers = {out: node for node in graph.node for out in node.output}
    steps = {}
    for index, output in enumerate(graph.output):
        node = producers.get(output.name)
        if node is None or node.op_type != "DequantizeLinear" or len(node.input) < 2:
            continue
        scale = constants.get(node.input[1])
        if scale is not None and scale.size == 1:
            steps[index] = float(scale.reshape(()))
    return steps


def onnxruntime_runner(
    model: Model, threads: int | None = None, optimize: bool = True, onnx_model: Any = None
) -> Callable[..., list[np.ndarray]]:
    """The ONNX model the ``model`` came from (or ``onnx_model``, with its inputs), run by onnxruntime on its CPU:
    ``run(*inputs) -> outputs``.

    ``threads`` sets onnxruntime's intra-op threads (None: its own default);
    ``optimize`` False runs the graph as written, without onnxruntime's fusions.
    """
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    if threads is not None:
        options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(
        (onnx_model or model.onnx_model).SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    names = [spec.name for spec in model.inputs]
    return lambda *inputs: flat_outputs(session.run(None, dict(zip(names, inputs))))


def flat_outputs(values: Sequence[Any]) -> list[np.ndarray]:
    """ONNX outputs as a compiled model gives them: a flat list of arrays, a sequence output's tensors in its place."""
    flat = []
    for value in values:
        flat.extend(flat_outputs(value) if isinstance(value, (list, tuple)) else [np.asarray(value)])
    return flat


def _untuned_outputs(model: Model, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    executable = tvm.compile(model.mod, target=tvm.target.Target({"kind": "llvm"}))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return outputs_to_numpy(vm["main"](*[tvm.runtime.tensor(np.asarray(a, order="C")) for a in inputs]))


def outputs_to_numpy(out: Any) -> list[np.ndarray]:
    """A VM's result (a tensor, or nested tuples of them) as a flat list of arrays (copies)."""
    if isinstance(out, tvm.runtime.Tensor):
        return [_copied(out)]
    return [array for item in out for array in outputs_to_numpy(item)]


def _copied(tensor: tvm.runtime.Tensor) -> np.ndarray:
    """A copy of a tensor: through DLPack (a few times faster than ``.numpy()``, a per-call cost of a small model)
    where numpy can view it, else ``.numpy()`` (a tensor on another device, a dtype numpy lacks)."""
    try:
        view = np.from_dlpack(tensor)
    except Exception:  # noqa: BLE001 - numpy refuses with BufferError, TypeError or RuntimeError as the case may be
        return tensor.numpy()
    return view.copy() if str(view.dtype) == str(tensor.dtype) else tensor.numpy()
