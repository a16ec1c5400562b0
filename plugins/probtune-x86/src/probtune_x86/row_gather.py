"""A strided convolution's input read through a copy gathered by output row, so that AMX tiles take it.

A tile of ``A`` is up to 16 rows read at one stride. A stride-1 NHWC
convolution's output pixels along a row read the input's pixels one after
another, so a row of them is such a tile. A stride-2 one reads every other
pixel: its window spans twice the tile's rows. ``gather_rows`` (TVM's
``reindex`` of the operand, then its row's pixels moved next to the
channels) copies ``A[n, y * s + ry, x * s + rx, c]`` into
``A'[n, y, ry, rx, x, c]``, which the block reads a row of pixels at a time,
one after another: the window gather of an im2col, (kernel / stride)^2 times
the input.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import s_tir, tirx

from probtune.plugin import SPATIAL, BlockRV, InstructionKind, identity, indexing_dims, loop_kinds

__all__ = ["GATHER_ROWS", "gather_rows", "index_step", "strided_rows"]


def gather_rows(raw: s_tir.Schedule, block_rv: s_tir.schedule.SBlockRV, read: int, row: int) -> Any:
    """Read the block's ``read``-th operand through a copy laid out with the block iterator ``row`` second to last
    (module docstring); the copy's block."""
    sblock = raw.get(block_rv)
    row_var = identity(sblock.iter_vars[row].var)
    copy = raw.reindex(block_rv, ("read", read))
    region = raw.get(block_rv).reads[read].region
    dims = [r.min for r in region]
    found = [n for n, index in enumerate(dims) if isinstance(index, tirx.Var) and identity(index) == row_var]
    if not found:
        raise ValueError(f"block {sblock.name_hint!r} does not read operand {read} along its iterator {row}")
    at = found[0]
    order = [n for n in range(len(dims) - 1) if n != at] + [at, len(dims) - 1]
    raw.transform_layout(block_rv, ("read", read), lambda *axes: [axes[n] for n in order])
    return copy


def strided_rows(raw: s_tir.Schedule, block_rv: s_tir.schedule.SBlockRV, read: int) -> int | None:
    """The block iterator of the output's rows that steps the ``read``-th operand's second-to-last dimension by a
    constant more than one (a stride-2 convolution's pixels), where the operand's last dimension is its reduction's
    innermost iterator alone (its channels); None otherwise."""
    sblock = raw.get(block_rv)
    loops = raw.get_loops(block_rv)
    kinds = loop_kinds(raw, block_rv, loops)
    a_region, c_region = sblock.reads[read].region, sblock.writes[0].region
    if len(a_region) < 2 or len(c_region) < 2 or not isinstance(a_region[-1].min, tirx.Var):
        return None
    for index in reversed(range(len(loops))):
        along = indexing_dims(raw, block_rv, loops[index])
        var = sblock.iter_vars[index].var
        if (
            kinds[index] == SPATIAL
            and along.get(("write", 0)) == [len(c_region) - 2]
            and along.get(("read", read)) == [len(a_region) - 2]
            and index_step(a_region[-2].min, var) > 1
            and index_step(c_region[-2].min, var) == 1
        ):
            return index
    return None


def index_step(index: tirx.PrimExpr, var: tirx.Var) -> int:
    """How much ``index`` steps with ``var`` (0 where it is not linear in it with a constant coefficient)."""
    coefficients = tvm.sym.detect_linear_equation(index, [var])
    return int(coefficients[0]) if len(coefficients) == 2 and isinstance(coefficients[0], tirx.IntImm) else 0


def _apply(sch: s_tir.Schedule, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    return gather_rows(sch, inputs[0], int(attrs["read"]), int(attrs["row"]))


GATHER_ROWS = InstructionKind("gather_rows", _apply, BlockRV)
"""Read a block's operand through a copy gathered by output row (:func:`gather_rows`); outputs the copy's block."""
