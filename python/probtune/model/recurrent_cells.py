"""A few steps of an LSTM, GRU or RNN layer as one kernel: each step's recurrent product and the gates that read it.

Fusion puts a matrix product in one function with the elementwise operators
that read each of its elements where it was written; a cell's gates read
their own columns of the product (slices), so written with Relax operators a
step is two calls, the product and the gates, and at the sizes of a
recurrent layer the VM's cost per call (its arguments, its outputs'
allocation) is as large as either. Written in TE, one function computes
:data:`STEPS_PER_KERNEL` steps in a row, each the product of the previous
hidden state and the recurrent weights, then the cell that reads its gates'
columns of it; the function returns one tensor (each further output costs
the VM another allocation and tuple field): its steps' hidden states
stacked, and after them, for an LSTM, the last cell state. The next run
starts from what the run before it left there, read from that tensor (the
first run's, the initial state repeated, as the same tensor).

The arithmetic is ONNX's (default activations), in the order onnxruntime
computes it. Tensors, every direction at once: the steps' input projections
``(steps, directions, batch, gates x hidden)`` with the biases that can be
added up front, the previous run's output ``(steps, directions, batch,
hidden)`` (``steps + 1`` for an LSTM) and the recurrent weights transposed
``(directions, hidden, gates x hidden)``.
"""

from __future__ import annotations

from tvm import te, tirx

__all__ = ["STEPS_PER_KERNEL", "gru_steps", "lstm_steps", "rnn_steps", "state_at"]

STEPS_PER_KERNEL = 4
"""The most steps of a layer one kernel computes: each call saves the VM's cost per call on all but one of them;
more steps make a larger function to tune and compile (three blocks per LSTM step)."""


def state_at(run: te.Tensor, index: int) -> te.Tensor:
    """Entry ``index`` (negative: from the end) of a run's output, (directions, batch, hidden)."""
    at = index % int(run.shape[0])
    return te.compute(run.shape[1:], lambda d, b, j: run[at, d, b, j], name="start_state")


def _stacked(states: list[te.Tensor]) -> te.Tensor:
    """``states`` (directions, batch, hidden) as one tensor, (count, directions, batch, hidden)."""

    def pick(s: tirx.Var, d: tirx.Var, b: tirx.Var, j: tirx.Var) -> tirx.PrimExpr:
        value = states[-1][d, b, j]
        for step in range(len(states) - 2, -1, -1):
            value = tirx.if_then_else(s == step, states[step][d, b, j], value)
        return value

    return te.compute((len(states), *states[0].shape), pick, name="hidden_states")


def _product(hidden: te.Tensor, weights: te.Tensor) -> te.Tensor:
    """``hidden @ weights`` per direction: (directions, batch, gates x hidden)."""
    directions, batch, width = hidden.shape
    k = te.reduce_axis((0, width), "k")
    return te.compute(
        (directions, batch, weights.shape[2]),
        lambda d, b, c: te.sum(hidden[d, b, k] * weights[d, k, c], axis=k),
        name="recurrent_product",
    )


def _gru_step(steps: te.Tensor, s: int, hidden: te.Tensor, weights: te.Tensor, *reset_bias: te.Tensor) -> te.Tensor:
    """Step ``s`` of a GRU with ``linear_before_reset`` (gates z, r, h): the next hidden state."""
    product = _product(hidden, weights)
    size = hidden.shape[2]
    one = tirx.const(1.0, hidden.dtype)

    def state(d: tirx.Var, b: tirx.Var, j: tirx.Var) -> tirx.PrimExpr:
        z = tirx.sigmoid(steps[s, d, b, j] + product[d, b, j])
        reset = tirx.sigmoid(steps[s, d, b, size + j] + product[d, b, size + j])
        recurrent = product[d, b, 2 * size + j]
        if reset_bias:
            recurrent = recurrent + reset_bias[0][d, 0, j]
        candidate = tirx.tanh(steps[s, d, b, 2 * size + j] + reset * recurrent)
        return z * hidden[d, b, j] + (one - z) * candidate

    return te.compute(hidden.shape, state, name="gru_cell")


def gru_steps(steps: te.Tensor, start: te.Tensor, weights: te.Tensor, *reset_bias: te.Tensor) -> te.Tensor:
    """GRU steps with ``linear_before_reset`` from the last of ``start``'s hidden states: their hidden states.

    ``steps`` carries the input biases and the z and r gates' recurrent biases; the h gate's (``reset_bias``,
    (directions, 1, hidden), if the layer has biases) is added to its recurrent product before the reset gate
    scales it."""
    hidden, states = state_at(start, -1), []
    for s in range(int(steps.shape[0])):
        hidden = _gru_step(steps, s, hidden, weights, *reset_bias)
        states.append(hidden)
    return _stacked(states)


def _lstm_step(
    steps: te.Tensor, s: int, hidden: te.Tensor, cell: te.Tensor, weights: te.Tensor, *peepholes: te.Tensor
) -> tuple[te.Tensor, te.Tensor]:
    """Step ``s`` of an LSTM (gates i, o, f, c): the next hidden state and cell state."""
    product = _product(hidden, weights)
    size = hidden.shape[2]

    def gate(k: int, d: tirx.Var, b: tirx.Var, j: tirx.Var) -> tirx.PrimExpr:
        return steps[s, d, b, k * size + j] + product[d, b, k * size + j]

    def peeped(k: int, d: tirx.Var, b: tirx.Var, j: tirx.Var, state: te.Tensor, peep: int) -> tirx.PrimExpr:
        value = gate(k, d, b, j)
        return value + peepholes[0][d, peep * size + j] * state[d, b, j] if peepholes else value

    def next_cell(d: tirx.Var, b: tirx.Var, j: tirx.Var) -> tirx.PrimExpr:
        i = tirx.sigmoid(peeped(0, d, b, j, cell, 0))
        f = tirx.sigmoid(peeped(2, d, b, j, cell, 2))
        return f * cell[d, b, j] + i * tirx.tanh(gate(3, d, b, j))

    new_cell = te.compute(cell.shape, next_cell, name="lstm_cell")
    new_hidden = te.compute(
        hidden.shape,
        lambda d, b, j: tirx.sigmoid(peeped(1, d, b, j, new_cell, 1)) * tirx.tanh(new_cell[d, b, j]),
        name="lstm_hidden",
    )
    return new_hidden, new_cell


def lstm_steps(steps: te.Tensor, start: te.Tensor, weights: te.Tensor, *peepholes: te.Tensor) -> te.Tensor:
    """LSTM steps from the run before's output (``start``: its last hidden state at -2, its cell state at -1):
    their hidden states, then the last cell state, (steps + 1, directions, batch, hidden). ``peepholes``, if the
    layer has them, is ONNX's ``P`` (directions, 3 x hidden: i, o, f)."""
    hidden, cell, states = state_at(start, -2), state_at(start, -1), []
    for s in range(int(steps.shape[0])):
        hidden, cell = _lstm_step(steps, s, hidden, cell, weights, *peepholes)
        states.append(hidden)
    return _stacked([*states, cell])


def _rnn_step(steps: te.Tensor, s: int, hidden: te.Tensor, weights: te.Tensor) -> te.Tensor:
    """Step ``s`` of an RNN (a tanh cell): the next hidden state."""
    product = _product(hidden, weights)
    return te.compute(hidden.shape, lambda d, b, j: tirx.tanh(steps[s, d, b, j] + product[d, b, j]), name="rnn_cell")


def rnn_steps(steps: te.Tensor, start: te.Tensor, weights: te.Tensor) -> te.Tensor:
    """RNN steps from the last of ``start``'s hidden states: their hidden states."""
    hidden, states = state_at(start, -1), []
    for s in range(int(steps.shape[0])):
        hidden = _rnn_step(steps, s, hidden, weights)
        states.append(hidden)
    return _stacked(states)
