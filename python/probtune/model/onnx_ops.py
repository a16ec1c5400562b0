"""ONNX operators that TVM 0.27's Relax frontend has no converter for, converted here: LSTM, GRU, RNN, Celu, Swish
and LpNormalization.

A converter takes ``(bb, inputs, attrs, opset)`` as the frontend gives them
(absent optional inputs are None, string attributes bytes) and returns a
Relax expression, or a ``relax.Tuple`` for several outputs. Shapes are
static, so a recurrent layer is unrolled over its sequence: the input
projections of every step are one matrix product up front (the biases added
to them), split into runs of a few steps, and each run is one kernel
(:mod:`probtune.model.recurrent_cells`): each step's recurrent product and
gates, as onnxruntime computes them (ONNX's default activations), its steps'
hidden states stacked (an LSTM's cell state after them). A bidirectional
layer steps both directions at once (the backward one walking its sequence
from the end). The runs' hidden states are concatenated into the output Y,
and the final states taken from the last run, by calls of their own
(:meth:`_Layer.opaque`). A GRU without ``linear_before_reset`` keeps a
form of its own, in Relax operators, a direction at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tvm
from tvm import relax, te, topi

from probtune.errors import ModelImportError
from probtune.interfaces import OnnxConverter
from probtune.model.recurrent_cells import STEPS_PER_KERNEL, gru_steps, lstm_steps, rnn_steps, state_at

__all__ = ["ONNX_CONVERTERS", "celu", "gru", "lp_normalization", "lstm", "rnn", "swish"]

_OPAQUE = 8
"""TVM's ``OpPatternKind.kOpaque``: a function fusion leaves alone."""

_DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _check_supported(op: str, inputs: Sequence[Any], attrs: dict[str, Any], sequence_lens: int) -> None:
    """Refuse, by name, what the unrolled form does not compute: other activations, clipping, ragged batches."""
    activations = tuple(_text(a) for a in attrs.get("activations", ()))
    if activations and activations != _DEFAULT_ACTIVATIONS[op] * (len(activations) // len(_DEFAULT_ACTIVATIONS[op])):
        raise ModelImportError(f"{op} with activations {activations} is not supported (only ONNX's defaults)")
    if "clip" in attrs:
        raise ModelImportError(f"{op} with a cell clip is not supported")
    lengths = inputs[sequence_lens] if len(inputs) > sequence_lens else None
    steps = int(inputs[0].ty.shape[1 if int(attrs.get("layout", 0)) == 1 else 0])
    if lengths is not None and not (isinstance(lengths, tvm.ir.expr.Constant) and (lengths.value.numpy() == steps).all()):
        raise ModelImportError(
            f"{op} with sequence_lens given at run time is not supported (only every sequence at full length, "
            "{steps} steps): export the model without sequence_lens, or with them constant"
        )


class _Layer:
    """What the LSTM and GRU converters share: the layout, directions and the unrolled steps' indexing."""

    def __init__(self, bb: relax.BlockBuilder, x: relax.Expr, attrs: dict[str, Any]) -> None:
        self.bb = bb
        self.batch_first = int(attrs.get("layout", 0)) == 1
        self.x = bb.emit(relax.op.permute_dims(x, [1, 0, 2])) if self.batch_first else x
        self.steps = int(self.x.ty.shape[0])
        self.batch = int(self.x.ty.shape[1])
        self.hidden = int(attrs["hidden_size"])
        direction = _text(attrs.get("direction", "forward"))
        self.reverse = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]

    @property
    def directions(self) -> int:
        return len(self.reverse)

    def emit(self, expr: relax.Expr) -> relax.Expr:
        return self.bb.emit(expr)

    def take(self, tensor: relax.Expr, index: int, axis: int = 0) -> relax.Expr:
        """``tensor[index]`` along ``axis``, that axis removed."""
        part = relax.op.strided_slice(tensor, axes=[axis], begin=[index], end=[index + 1])
        return self.emit(relax.op.squeeze(self.emit(part), axis=[axis]))

    def projections(self, weight: relax.Expr, direction: int) -> relax.Expr:
        """Every step's input times the direction's ``weight`` transposed: (steps, batch, gates x hidden)."""
        return self.emit(relax.op.matmul(self.x, self.emit(relax.op.permute_dims(self.take(weight, direction)))))

    def initial(self, state: relax.Expr | None, direction: int) -> relax.Expr:
        """The direction's initial state, zeros where the node has none: (batch, hidden)."""
        return self.take(self.initial_states(state), direction)

    def runs_of(self, projected: relax.Expr) -> list[relax.Expr]:
        """The input projections in runs of at most :data:`STEPS_PER_KERNEL` steps, (run, ...) each: one split
        into runs as even as they can be, so that the runs' kernels are one function (two where the steps do not
        divide evenly)."""
        runs = -(-self.steps // STEPS_PER_KERNEL)
        if runs == 1:
            return [projected]
        length = -(-self.steps // runs)
        sections = runs if self.steps % runs == 0 else list(range(length, self.steps, length))
        pieces = self.emit(relax.op.split(projected, sections, axis=0))
        return [self.emit(relax.TupleGetItem(pieces, run)) for run in range(-(-self.steps // length))]

    def opaque(self, compute: Any, *args: Any, name: str) -> relax.Expr:
        """``compute`` (a TE function) of ``args`` (Relax tensors, lists of them, constants), a call that fusion
        leaves alone: a run's kernel that took in what reads its output would no longer be the same function (the
        same task) as the other runs'."""
        call = self.bb.emit_te(compute, *args, primfunc_name_hint=name)
        func = self.bb.lookup_binding(call).args[0]
        self.bb.update_func(func, self.bb.get()[func].with_attr("op_pattern", _OPAQUE))
        return call

    def order(self, direction: int) -> range:
        return range(self.steps - 1, -1, -1) if self.reverse[direction] else range(self.steps)

    def outputs(self, per_direction: list[list[relax.Expr]], finals: list[list[relax.Expr]]) -> list[relax.Expr]:
        """Y (steps, directions, batch, hidden) in step order, then each final state (directions, batch, hidden)."""
        directions = []
        for direction, states in enumerate(per_direction):
            in_order = states[::-1] if self.reverse[direction] else states
            directions.append(self.emit(relax.op.stack(in_order, axis=0)))
        y = self.emit(relax.op.stack(directions, axis=1))
        if self.batch_first:
            y = self.emit(relax.op.permute_dims(y, [2, 0, 1, 3]))
        results = [y]
        for kind in zip(*finals):
            final = self.emit(relax.op.stack(list(kind), axis=0))
            results.append(self.emit(relax.op.permute_dims(final, [1, 0, 2])) if self.batch_first else final)
        return results

    def cell_inputs(
        self, weight: relax.Expr, recurrent: relax.Expr, biases: relax.Expr | None, folded: int | None = None,
    ) -> tuple[list[relax.Expr], relax.Expr, relax.Expr | None]:
        """What the kernels read, every direction at once: the input projections with the biases added, in runs of
        steps (:meth:`runs_of`), (run, directions, batch, gates x hidden), in the order each direction walks its
        sequence; the recurrent weights transposed, (directions, hidden, gates x hidden); and what is left of the
        recurrent biases: None, or, given ``folded``, their entries from ``folded`` on, (directions, 1, rest), which
        are not added to the projections (a GRU's h gate applies its own after the reset gate)."""
        walked, rests = [], []
        for direction in range(self.directions):
            projected, rest = self._projected(weight, biases, direction, folded)
            walked.append(self.emit(relax.op.flip(projected, axis=0)) if self.reverse[direction] else projected)
            rests.append(rest)
        stacked = self.emit(relax.op.stack(walked, axis=1))  # (steps, directions, batch, gates x hidden)
        transposed = self.emit(relax.op.permute_dims(recurrent, [0, 2, 1]))
        rest = None
        if rests[0] is not None:
            rest = self.emit(relax.op.expand_dims(self.emit(relax.op.stack(rests, axis=0)), axis=1))
        return self.runs_of(stacked), transposed, rest

    def _projected(
        self, weight: relax.Expr, biases: relax.Expr | None, direction: int, folded: int | None
    ) -> tuple[relax.Expr, relax.Expr | None]:
        """The direction's input projections with its biases added (those of the recurrent bias below ``folded``),
        and the rest of its recurrent bias (None without ``folded`` or biases)."""
        projected = self.projections(weight, direction)
        wb, rb = self.bias(biases, direction)
        rest = None
        if wb is not None and rb is not None:
            if folded is not None:
                width = int(rb.ty.shape[0])
                rest = self.emit(relax.op.strided_slice(rb, axes=[0], begin=[folded], end=[width]))
                kept = self.emit(relax.op.strided_slice(rb, axes=[0], begin=[0], end=[folded]))
                zeros = relax.const(np.zeros(width - folded, str(self.x.ty.dtype)))
                rb = self.emit(relax.op.concat([kept, zeros]))
            projected = self.emit(relax.op.add(projected, self.emit(relax.op.add(wb, rb))))
        return projected, rest

    def initial_states(self, state: relax.Expr | None) -> relax.Expr:
        """Every direction's initial state, zeros where the node has none: (directions, batch, hidden)."""
        if state is None:
            return self.emit(relax.op.zeros((self.directions, self.batch, self.hidden), self.x.ty.dtype))
        return self.emit(relax.op.permute_dims(state, [1, 0, 2])) if self.batch_first else state

    def start_of(self, state: relax.Expr | None, runs: list[relax.Expr]) -> relax.Expr:
        """What the first run starts from, in the form every run reads the run before it: the initial state
        (zeros where the node has none) repeated, (first run's steps, directions, batch, hidden)."""
        shape = (int(runs[0].ty.shape[0]), self.directions, self.batch, self.hidden)
        if state is None:
            return self.emit(relax.op.zeros(shape, self.x.ty.dtype))
        return self.emit(relax.op.broadcast_to(self.emit(relax.op.expand_dims(self.initial_states(state), 0)), shape))

    def walked_outputs(self, runs: list[relax.Expr], cell: bool = False) -> list[relax.Expr]:
        """Y (steps, directions, batch, hidden) in step order from the hidden states of every run (``cell``: each
        run's output ends with a cell state), each direction's as it walked its sequence (a backward direction's
        put back in step order), then the final hidden state (and cell state)."""
        ends = (-2, -1) if cell else (-1,)
        finals = [self.opaque(state_at, runs[-1], at, name="final_state") for at in ends]
        walked = self.opaque(_hidden_states, runs, int(cell), name="hidden_states")
        if any(self.reverse):
            parts = []
            for direction, reverse in enumerate(self.reverse):
                part = walked if self.directions == 1 else self.emit(
                    relax.op.strided_slice(walked, axes=[1], begin=[direction], end=[direction + 1]))
                parts.append(self.emit(relax.op.flip(part, axis=0)) if reverse else part)
            walked = parts[0] if len(parts) == 1 else self.emit(relax.op.concat(parts, axis=1))
        if self.batch_first:
            walked = self.emit(relax.op.permute_dims(walked, [2, 0, 1, 3]))
            finals = [self.emit(relax.op.permute_dims(final, [1, 0, 2])) for final in finals]
        return [walked, *finals]

    def bias(self, biases: relax.Expr | None, direction: int) -> tuple[relax.Expr | None, relax.Expr | None]:
        """The direction's input bias and recurrent bias, None where the node has none."""
        if biases is None:
            return None, None
        both = self.take(biases, direction)
        halves = self.emit(relax.op.split(both, 2, axis=-1))
        return self.emit(relax.TupleGetItem(halves, 0)), self.emit(relax.TupleGetItem(halves, 1))


def _hidden_states(runs: Sequence[te.Tensor], trailing: int) -> te.Tensor:
    """The runs' outputs concatenated, each without its last ``trailing`` entries (an LSTM run's cell state)."""
    return topi.concatenate([_head(run, int(run.shape[0]) - trailing) for run in runs], 0)


def _head(run: te.Tensor, count: int) -> te.Tensor:
    """The first ``count`` entries of ``run``."""
    return te.compute((count, *run.shape[1:]), lambda s, d, b, j: run[s, d, b, j], name="head")


def lstm(bb: relax.BlockBuilder, inputs: Sequence[Any], attrs: dict[str, Any], opset: int) -> relax.Expr:
    """ONNX LSTM (gates i, o, f, c; optional biases, initial states and peepholes): (Y, Y_h, Y_c)."""
    _check_supported("LSTM", inputs, attrs, 4)
    if int(attrs.get("input_forget", 0)):
        raise ModelImportError("LSTM with input_forget is not supported")
    x, w, r = inputs[:3]
    b, h0, c0, p = (inputs[i] if len(inputs) > i else None for i in (3, 5, 6, 7))
    layer = _Layer(bb, x, attrs)
    runs, recurrent, _ = layer.cell_inputs(w, r, b)
    peepholes = () if p is None else (p,)
    cell = layer.emit(relax.op.expand_dims(layer.initial_states(c0), 0))
    start, states = layer.emit(relax.op.concat([layer.start_of(h0, runs), cell], axis=0)), []
    for run in runs:
        start = bb.emit_te(lstm_steps, run, start, recurrent, *peepholes, primfunc_name_hint="lstm_steps")
        states.append(start)
    return relax.Tuple(layer.walked_outputs(states, cell=True))


def gru(bb: relax.BlockBuilder, inputs: Sequence[Any], attrs: dict[str, Any], opset: int) -> relax.Expr:
    """ONNX GRU (gates z, r, h; ``linear_before_reset`` either way, as PyTorch exports it): (Y, Y_h)."""
    _check_supported("GRU", inputs, attrs, 4)
    x, w, r = inputs[:3]
    b, h0 = (inputs[i] if len(inputs) > i else None for i in (3, 5))
    layer = _Layer(bb, x, attrs)
    linear_before_reset = bool(int(attrs.get("linear_before_reset", 0)))
    if linear_before_reset:
        return relax.Tuple(layer.walked_outputs(_gru_steps(layer, w, r, b, h0)))
    per_direction, finals = [], []
    for d in range(len(layer.reverse)):
        projected = layer.projections(w, d)
        if b is not None:
            wb, rb = layer.bias(b, d)
            projected = layer.emit(relax.op.add(projected, wb))
        else:
            rb = None
        recurrent = layer.take(r, d)  # (3 x hidden, hidden): z, r and h rows
        split = layer.emit(relax.op.split(recurrent, 3, axis=0))
        rz_rr = layer.emit(relax.op.permute_dims(layer.emit(relax.op.concat(
            [layer.emit(relax.TupleGetItem(split, 0)), layer.emit(relax.TupleGetItem(split, 1))], axis=0))))
        rh = layer.emit(relax.op.permute_dims(layer.emit(relax.TupleGetItem(split, 2))))
        rb_parts = None if rb is None else layer.emit(relax.op.split(rb, [2 * layer.hidden], axis=-1))
        hidden, states = layer.initial(h0, d), []
        for step in layer.order(d):
            xz, xr, xh = (layer.emit(relax.TupleGetItem(layer.emit(relax.op.split(layer.take(projected, step), 3,
                                                                                  axis=-1)), i)) for i in range(3))
            zr = layer.emit(relax.op.matmul(hidden, rz_rr))
            if rb_parts is not None:
                zr = layer.emit(relax.op.add(zr, layer.emit(relax.TupleGetItem(rb_parts, 0))))
            hz, hr = (layer.emit(relax.TupleGetItem(layer.emit(relax.op.split(zr, 2, axis=-1)), i)) for i in range(2))
            z = layer.emit(relax.op.sigmoid(layer.emit(relax.op.add(xz, hz))))
            reset = layer.emit(relax.op.sigmoid(layer.emit(relax.op.add(xr, hr))))
            hh_bias = None if rb_parts is None else layer.emit(relax.TupleGetItem(rb_parts, 1))
            if linear_before_reset:
                hh = layer.emit(relax.op.matmul(hidden, rh))
                hh = layer.emit(relax.op.add(hh, hh_bias)) if hh_bias is not None else hh
                hh = layer.emit(relax.op.multiply(reset, hh))
            else:
                hh = layer.emit(relax.op.matmul(layer.emit(relax.op.multiply(reset, hidden)), rh))
                hh = layer.emit(relax.op.add(hh, hh_bias)) if hh_bias is not None else hh
            candidate = layer.emit(relax.op.tanh(layer.emit(relax.op.add(xh, hh))))
            keep = layer.emit(relax.op.multiply(z, hidden))
            one = relax.const(1.0, x.ty.dtype)
            hidden = layer.emit(relax.op.add(keep, layer.emit(relax.op.multiply(
                layer.emit(relax.op.subtract(one, z)), candidate))))
            states.append(hidden)
        per_direction.append(states)
        finals.append([hidden])
    return relax.Tuple(layer.outputs(per_direction, finals))


def _gru_steps(
    layer: _Layer, weight: relax.Expr, recurrent: relax.Expr, biases: relax.Expr | None, h0: relax.Expr | None
) -> list[relax.Expr]:
    """A GRU's hidden states with ``linear_before_reset``, run by run, every direction at once as the LSTM's, a
    run of steps per kernel (:func:`~probtune.model.recurrent_cells.gru_steps`; the projections carry the input
    biases and the z and r gates' recurrent biases)."""
    runs, weights, reset_bias = layer.cell_inputs(weight, recurrent, biases, folded=2 * layer.hidden)
    extra = () if reset_bias is None else (reset_bias,)
    start, states = layer.start_of(h0, runs), []
    for run in runs:
        start = layer.bb.emit_te(gru_steps, run, start, weights, *extra, primfunc_name_hint="gru_steps")
        states.append(start)
    return states


def rnn(bb: relax.BlockBuilder, inputs: Sequence[Any], attrs: dict[str, Any], opset: int) -> relax.Expr:
    """ONNX RNN (a tanh cell; optional biases and initial state): (Y, Y_h)."""
    _check_supported("RNN", inputs, attrs, 4)
    x, w, r = inputs[:3]
    b, h0 = (inputs[i] if len(inputs) > i else None for i in (3, 5))
    layer = _Layer(bb, x, attrs)
    runs, recurrent, _ = layer.cell_inputs(w, r, b)
    start, states = layer.start_of(h0, runs), []
    for run in runs:
        start = bb.emit_te(rnn_steps, run, start, recurrent, primfunc_name_hint="rnn_steps")
        states.append(start)
    return relax.Tuple(layer.walked_outputs(states))


def celu(bb: relax.BlockBuilder, inputs: Sequence[Any], attrs: dict[str, Any], opset: int) -> relax.Expr:
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``."""
    x = inputs[0]
    alpha = relax.const(float(attrs.get("alpha", 1.0)), x.ty.dtype)
    zero, one = relax.const(0.0, x.ty.dtype), relax.const(1.0, x.ty.dtype)
    negative = relax.op.multiply(alpha, relax.op.subtract(relax.op.exp(relax.op.divide(x, alpha)), one))
    return relax.op.add(relax.op.maximum(x, zero), relax.op.minimum(negative, zero))


def swish(bb: relax.BlockBuilder, inputs: Sequence[Any], attrs: dict[str, Any], opset: int) -> relax.Expr:
    """``x * sigmoid(alpha * x)``."""
    x = inputs[0]
    alpha = float(attrs.get("alpha", 1.0))
    scaled = x if alpha == 1.0 else relax.op.multiply(x, relax.const(alpha, x.ty.dtype))
    return relax.op.multiply(x, relax.op.sigmoid(scaled))


def lp_normalization(bb: relax.BlockBuilder, inputs: Sequence[Any], attrs: dict[str, Any], opset: int) -> relax.Expr:
    """``x`` divided by its L1 or L2 norm along ``axis``."""
    x = inputs[0]
    axis, p = int(attrs.get("axis", -1)), int(attrs.get("p", 2))
    if p == 1:
        norm = relax.op.sum(relax.op.abs(x), axis=[axis], keepdims=True)
    elif p == 2:
        norm = relax.op.sqrt(relax.op.sum(relax.op.multiply(x, x), axis=[axis], keepdims=True))
    else:
        raise ModelImportError(f"LpNormalization with p={p} is not defined (ONNX allows 1 or 2)")
    return relax.op.divide(x, norm)


ONNX_CONVERTERS: dict[str, OnnxConverter] = {
    "LSTM": lstm, "GRU": gru, "RNN": rnn, "Celu": celu, "Swish": swish, "LpNormalization": lp_normalization,
}
"""The converters the kernel registers (``probtune_register_onnx_converters``), by ONNX operator type."""
