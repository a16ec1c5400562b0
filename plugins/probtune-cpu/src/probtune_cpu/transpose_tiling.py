"""Tile a copy that moves a buffer's rows into columns (a transpose), so that both sides stay in the L1 cache.

A transpose read along its output's rows (or written along its input's)
touches one element of a cache line per step on the strided side; when the
strided buffer is larger than L1 (an attention's key transpose), every
line is fetched once per element. Tiling the loop that is contiguous for
the strided buffer with the innermost one keeps the lines a tile touches
in L1 until all their elements are used. The tile sizes
are sampled; a tile of one row is the untiled order.

An elementwise chain between a transpose and its inverse, once inlined,
walks both buffers across their rows in the chain's order, while another
loop walks them all along their rows: that loop is made innermost instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx

from probtune.plugin import (
    SPATIAL,
    BlockRV,
    Schedule,
    SpaceContext,
    at_root,
    indexing_dims,
    is_spatial,
    loop_kinds,
)
from probtune_cpu.vector_unit import vector_width

__all__ = ["TransposeTiling", "along_rows", "transposed_loop"]


def along_rows(sch: Schedule, block: BlockRV, position: int) -> dict[tuple[str, int], bool]:
    """For each access of the block that its loop at ``position`` indexes, whether only along the buffer's rows
    (its last dimension, or the last one longer than 1: a (512, 1) scale is read along its rows by its first)."""
    raw, rv = sch.tvm, sch.resolve(block)
    sblock = raw.get(rv)
    regions = {"read": sblock.reads, "write": sblock.writes}
    found = {}
    for (kind, index), dims in indexing_dims(raw, rv, raw.get_loops(rv)[position]).items():
        shape = regions[kind][index].source.shape
        long = [d for d, n in enumerate(shape) if not (isinstance(n, tirx.IntImm) and int(n) == 1)]
        found[(kind, index)] = dims == [long[-1] if long else len(shape) - 1]
    return found


def transposed_loop(sch: Schedule, block: BlockRV) -> tuple[int, bool] | None:
    """For a block whose innermost loop walks some buffer across its rows: the position of the nearest loop that
    walks every buffer it indexes along their rows (True: the nest is merely out of order), else of the nearest
    that walks one of those buffers along its rows (False: a transpose); None for a block that copies along rows."""
    loops = sch.get_loops(block)
    strided = {access for access, rows in along_rows(sch, block, len(loops) - 1).items() if not rows}
    if not strided:
        return None
    rows_at = {p: along_rows(sch, block, p) for p in range(len(loops) - 2, -1, -1) if (sch.loop_extent(loops[p]) or 0) > 1}
    in_order = [p for p, rows in rows_at.items() if rows and all(rows.values())]
    if in_order:
        return in_order[0], True
    transposing = [p for p, rows in rows_at.items() if any(rows.get(access) for access in strided)]
    return (transposing[0], False) if transposing else None


@dataclass(frozen=True)
class TransposeTiling:
    """Split the innermost loop and the :func:`transposed_loop` of a spatial block at the root, and order the
    nest ``..., rows, ..., columns, row tile, column tile``: the column tile is vectorized, the row tile runs over
    the lines of the strided buffer that the tile keeps cached. A nest merely out of order gets its loop that
    walks every buffer along its rows innermost.

    ``max_row_tile`` bounds the rows of a tile; an innermost loop longer than
    ``max_column_vectors`` vectors is split too (else it stays whole, the column tile).
    """

    name: str = "transpose-tiling"
    max_row_tile: int = 32
    max_column_vectors: int = 4

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> None:
        raw, rv = sch.tvm, sch.resolve(block)
        if not at_root(raw, rv) or not is_spatial(raw.get(rv)):
            return
        loops = raw.get_loops(rv)
        if len(loops) < 2 or set(loop_kinds(raw, rv, loops)) != {SPATIAL}:
            return
        found = transposed_loop(sch, block)
        if found is None:
            return
        position, in_order = found
        if in_order:  # every buffer it indexes is read or written along its rows: innermost, nothing to tile
            nest = sch.get_loops(block)
            sch.reorder(*nest[position + 1 :], nest[position])
            return
        rows = sch.get_loops(block)[position]
        sch.split(rows, sch.sample_perfect_tile(rows, 2, max_innermost_factor=self.max_row_tile))
        columns = sch.get_loops(block)[-1]
        widest = vector_width(ctx.target) * self.max_column_vectors
        if (sch.loop_extent(columns) or 0) > widest:
            sch.split(columns, sch.sample_perfect_tile(columns, 2, max_innermost_factor=widest))
        nest = sch.get_loops(block)
        split_columns = len(nest) - len(loops) == 2
        row_outer, row_tile = nest[position], nest[position + 1]
        between = nest[position + 2 : -2 if split_columns else -1]
        column_outer = [nest[-2]] if split_columns else []
        sch.reorder(row_outer, *between, *column_outer, row_tile, nest[-1])
