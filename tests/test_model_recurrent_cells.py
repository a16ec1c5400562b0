"""Runs of recurrent steps as one kernel (probtune.model.recurrent_cells), against the gates written out in numpy.

Each kernel starts from what the run before it left (here a run of :data:`PREVIOUS` steps whose other states must
not be read): its last hidden state, and an LSTM's cell state after it."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from probtune.model.recurrent_cells import gru_steps, lstm_steps, rnn_steps

DIRECTIONS, BATCH, HIDDEN = 2, 3, 4
PREVIOUS = 2


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _run(kernel, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """``kernel`` over ``arrays`` as one ``call_tir`` in a Relax function, built and run."""
    params = [relax.Var(f"a{i}", relax.TensorType(a.shape, "float32")) for i, a in enumerate(arrays)]
    builder = relax.BlockBuilder()
    with builder.function("main", params):
        with builder.dataflow():
            out = builder.emit_output(builder.emit_te(kernel, *params))
        builder.emit_func_output(out)
    vm = relax.VirtualMachine(tvm.compile(builder.get(), target="llvm"), tvm.cpu())
    result = vm["main"](*(tvm.runtime.tensor(a) for a in arrays))
    return [result.numpy()] if hasattr(result, "numpy") else [r.numpy() for r in result]


def _inputs(steps: int, gates: int, cell: bool = False, extra: tuple[tuple[int, ...], ...] = ()) -> list[np.ndarray]:
    """The steps' projections, the previous run's output (its hidden states, then its cell state where ``cell``),
    the recurrent weights, then ``extra`` (biases, peepholes)."""
    rng = np.random.default_rng(gates)
    shapes = [(steps, DIRECTIONS, BATCH, gates * HIDDEN), (PREVIOUS + cell, DIRECTIONS, BATCH, HIDDEN),
              (DIRECTIONS, HIDDEN, gates * HIDDEN), *extra]
    return [(rng.standard_normal(shape) * 0.5).astype("float32") for shape in shapes]


def _gates(step: np.ndarray, hidden: np.ndarray, weights: np.ndarray, count: int) -> list[np.ndarray]:
    return np.split(step + hidden @ weights, count, axis=-1)


def _close(got: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("biased", [False, True])
def test_gru_steps_are_the_linear_before_reset_gru(steps, biased):
    arrays = _inputs(steps, 3, extra=((DIRECTIONS, 1, HIDDEN),) if biased else ())
    projections, previous, weights = arrays[:3]
    hidden, expected = previous[-1], []
    for step in projections:
        z, r, _ = _gates(step, hidden, weights, 3)
        z, r = _sigmoid(z), _sigmoid(r)
        recurrent = np.split(hidden @ weights, 3, axis=-1)[2] + (arrays[3] if biased else 0)
        candidate = np.tanh(np.split(step, 3, axis=-1)[2] + r * recurrent)
        hidden = z * hidden + (1 - z) * candidate
        expected.append(hidden)
    (got,) = _run(gru_steps, arrays)
    _close(got, np.stack(expected))


@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("peepholes", [False, True])
def test_lstm_steps_give_their_hidden_states_then_the_last_cell_state(steps, peepholes):
    arrays = _inputs(steps, 4, cell=True, extra=((DIRECTIONS, 3 * HIDDEN),) if peepholes else ())
    projections, previous, weights = arrays[:3]
    hidden, cell = previous[-2], previous[-1]
    pi, po, pf = (p[:, None, :] for p in np.split(arrays[3], 3, axis=-1)) if peepholes else (0, 0, 0)
    expected = []
    for step in projections:
        i, o, f, c = _gates(step, hidden, weights, 4)
        cell = _sigmoid(f + pf * cell) * cell + _sigmoid(i + pi * cell) * np.tanh(c)
        hidden = _sigmoid(o + po * cell) * np.tanh(cell)
        expected.append(hidden)
    (got,) = _run(lstm_steps, arrays)
    _close(got, np.stack([*expected, cell]))


@pytest.mark.parametrize("steps", [1, 4])
def test_rnn_steps_are_the_tanh_of_their_gates(steps):
    arrays = _inputs(steps, 1)
    projections, previous, weights = arrays
    hidden, expected = previous[-1], []
    for step in projections:
        hidden = np.tanh(step + hidden @ weights)
        expected.append(hidden)
    (got,) = _run(rnn_steps, arrays)
    _close(got, np.stack(expected))
