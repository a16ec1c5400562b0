"""Where a chain of reshapes, transposes and other operators that only move values puts each element of its input.

``moved`` runs the operators on an array of the input's element numbers: each
element of the result is the number of the input element it holds. A rewrite
compares that with the layout it needs, whatever sequence of operators an
exporter wrote to get there (PyTorch's ``nn.MultiheadAttention`` splits its
queries, keys and values with an expand, a transpose, a squeeze and a take
where a hand-written transformer slices and reshapes).
"""

from __future__ import annotations

import math

import numpy as np
from tvm import relax
from tvm.ir.expr import Constant

from probtune.plugin import static_shape

__all__ = ["MOVES", "is_move", "moved", "op_name"]

MOVES = ("relax.reshape", "relax.permute_dims", "relax.expand_dims", "relax.squeeze", "relax.take")
"""The operators that only move values, each element of the result a copy of one of the input's."""


def op_name(call: object) -> str:
    """The name of the operator ``call`` calls ("" for anything that is not a call of one)."""
    return str(getattr(getattr(call, "op", None), "name", ""))


def is_move(call: relax.Expr) -> bool:
    """Whether ``call`` is one of ``MOVES`` with a static result (a take's indices constant)."""
    if op_name(call) not in MOVES or static_shape(getattr(call.ty, "shape", None)) is None:
        return False
    return op_name(call) != "relax.take" or isinstance(call.args[1], Constant)


def moved(calls: list[relax.Call], shape: list[int]) -> np.ndarray:
    """The element numbers of a tensor of ``shape`` after ``calls`` (each one of ``MOVES``), first applied first;
    32-bit where they fit (half the memory of a long sequence's products)."""
    count = math.prod(shape)
    numbers = np.arange(count, dtype=np.int32 if count <= np.iinfo(np.int32).max else np.int64).reshape(shape)
    for call in calls:
        numbers = _apply(call, numbers)
    return numbers


def _apply(call: relax.Call, numbers: np.ndarray) -> np.ndarray:
    name, attrs = op_name(call), call.attrs
    if name == "relax.reshape":
        return numbers.reshape(static_shape(call.ty.shape))
    if name == "relax.permute_dims":
        return np.transpose(numbers, None if attrs.axes is None else [int(a) for a in attrs.axes])
    if name == "relax.expand_dims":
        return np.expand_dims(numbers, tuple(int(a) for a in attrs.axis))
    if name == "relax.squeeze":
        return np.squeeze(numbers, None if attrs.axis is None else tuple(int(a) for a in attrs.axis))
    return np.take(numbers, call.args[1].value.numpy(), axis=None if attrs.axis is None else int(attrs.axis))
