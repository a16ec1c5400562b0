"""One recurrent step as one kernel (probtune.model.recurrent_cells), against the gates written out in numpy."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from probtune.model.recurrent_cells import gru_cell, lstm_cell, rnn_cell

DIRECTIONS, BATCH, HIDDEN = 2, 3, 4


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _run(cell, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """``cell`` over ``arrays`` as one ``call_tir`` in a Relax function, built and run."""
    params = [relax.Var(f"a{i}", relax.TensorType(a.shape, "float32")) for i, a in enumerate(arrays)]
    builder = relax.BlockBuilder()
    with builder.function("main", params):
        with builder.dataflow():
            out = builder.emit_output(builder.emit_te(cell, *params))
        builder.emit_func_output(out)
    vm = relax.VirtualMachine(tvm.compile(builder.get(), target="llvm"), tvm.cpu())
    result = vm["main"](*(tvm.runtime.tensor(a) for a in arrays))
    return [result.numpy()] if hasattr(result, "numpy") else [r.numpy() for r in result]


def _inputs(gates: int, states: int = 1, extra: tuple[tuple[int, ...], ...] = ()) -> list[np.ndarray]:
    """The step's projections, ``states`` states, the recurrent weights, then ``extra`` (biases, peepholes)."""
    rng = np.random.default_rng(gates)
    shapes = [(1, DIRECTIONS, BATCH, gates * HIDDEN), *[(DIRECTIONS, BATCH, HIDDEN)] * states,
              (DIRECTIONS, HIDDEN, gates * HIDDEN), *extra]
    return [rng.standard_normal(shape).astype("float32") for shape in shapes]


def _gates(step: np.ndarray, hidden: np.ndarray, weights: np.ndarray, count: int) -> list[np.ndarray]:
    return np.split(step[0] + hidden @ weights, count, axis=-1)


@pytest.mark.parametrize("biased", [False, True])
def test_a_gru_step_is_the_linear_before_reset_gru(biased):
    arrays = _inputs(3, extra=((DIRECTIONS, 1, HIDDEN),) if biased else ())
    step, hidden, weights = arrays[:3]
    z, r, _ = _gates(step, hidden, weights, 3)
    z, r = _sigmoid(z), _sigmoid(r)
    recurrent = np.split(hidden @ weights, 3, axis=-1)[2] + (arrays[3] if biased else 0)
    candidate = np.tanh(np.split(step[0], 3, axis=-1)[2] + r * recurrent)
    (got,) = _run(gru_cell, arrays)
    np.testing.assert_allclose(got, z * hidden + (1 - z) * candidate, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("peepholes", [False, True])
def test_an_lstm_step_gives_the_next_hidden_and_cell_states(peepholes):
    arrays = _inputs(4, states=2, extra=((DIRECTIONS, 3 * HIDDEN),) if peepholes else ())
    step, hidden, cell, weights = arrays[:4]
    i, o, f, c = _gates(step, hidden, weights, 4)
    pi, po, pf = (p[:, None, :] for p in np.split(arrays[4], 3, axis=-1)) if peepholes else (0, 0, 0)
    new_cell = _sigmoid(f + pf * cell) * cell + _sigmoid(i + pi * cell) * np.tanh(c)
    new_hidden = _sigmoid(o + po * new_cell) * np.tanh(new_cell)
    got_hidden, got_cell = _run(lstm_cell, arrays)
    np.testing.assert_allclose(got_cell, new_cell, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_hidden, new_hidden, rtol=1e-5, atol=1e-5)


def test_an_rnn_step_is_the_tanh_of_its_gate():
    step, hidden, weights = _inputs(1)
    (got,) = _run(rnn_cell, [step, hidden, weights])
    np.testing.assert_allclose(got, np.tanh(step[0] + hidden @ weights), rtol=1e-5, atol=1e-5)
