"""Which integer inputs of a model index a table (token ids into an embedding), and how many rows it has.

TVM compiles an ONNX Gather as a ``take`` that reads whatever memory an index
out of range points to; onnxruntime refuses such an index. A compiled model
checks these inputs before a call instead (:func:`probtune.model.compile.checked_inputs`).
"""

from __future__ import annotations

from typing import TypeGuard

import tvm
from tvm import relax

__all__ = ["index_bounds"]


def index_bounds(mod: tvm.IRModule) -> dict[int, int]:
    """For each position of ``main``'s parameters that a ``take`` indexes a table with (as it is, or through the
    frontend's mapping of negative indices), the fewest rows of the tables it indexes."""
    main = mod["main"]
    params = list(main.params)
    bound = {b.var: b.value for block in main.body.blocks for b in block.bindings}
    found: dict[int, int] = {}
    for value in bound.values():
        if not _is_call(value, "relax.take") or str(value.attrs.mode) != "fast":
            continue
        rows = _rows(value)
        position = _indexing_param(value.args[1], bound, params)
        if rows is not None and position is not None:
            found[position] = min(found.get(position, rows), rows)
    return found


def _rows(take: relax.Call) -> int | None:
    """The length of the axis ``take`` indexes its table along, if the table's shape is known and static there."""
    table = take.args[0].ty
    shape = getattr(table, "shape", None)
    if not isinstance(shape, relax.ShapeExpr) or not shape.values:
        return None
    axis = 0 if take.attrs.axis is None else int(take.attrs.axis) % len(shape.values)
    extent = shape.values[axis]
    return int(extent) if isinstance(extent, tvm.tirx.IntImm) else None


def _indexing_param(index: relax.Expr, bound: dict, params: list[relax.Var]) -> int | None:
    """The position of the parameter ``index`` is, or that the frontend maps from: ``where(p < 0, p + rows, p)``."""
    value = bound.get(index)
    if _is_call(value, "relax.where"):
        shifted = bound.get(value.args[1])
        if _is_call(shifted, "relax.add") and shifted.args[0].same_as(value.args[2]):
            index = value.args[2]
    return next((i for i, param in enumerate(params) if param.same_as(index)), None)


def _is_call(value: object, name: str) -> TypeGuard[relax.Call]:
    return isinstance(value, relax.Call) and getattr(value.op, "name", "") == name
