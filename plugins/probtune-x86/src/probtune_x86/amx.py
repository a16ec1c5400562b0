"""AMX: tile products, 16 x 16 sums per instruction of 64 bytes of products (``tdpbusd``, ``tdpbf16ps``).

A reduction that a vector dot product computes (``vpdpbusd``,
:mod:`probtune_x86.vnni`; ``vdpbf16ps``, :mod:`probtune_x86.bf16`) and that
also has a row loop ``i``, indexing the output's and ``A``'s second-to-last
dimensions (a matrix product's rows, a convolution's output pixels along a
row), maps onto AMX tile products: ``C[i, j] += A[i, k] * B[k, j]`` over up
to 16 rows, 16 columns and 64 terms of bytes or 32 of bfloat16 each, with ``A``'s
rows and ``C``'s read at their strides and ``B`` in the vector instruction's
blocked layout (``[..., j // 16, k // depth, j % 16, k % depth]``: a tile's
terms of 16 columns are one 16 x 64-byte tile). One call of the tensor
intrinsic computes up to 2 x 2 C tiles over up to 8 tiles of terms: its C
tiles are loaded once and stored once, and each A and B tile loaded per step
serves two products. A tile of ``A`` and ``C`` has as many rows as the
largest count of at most 16 that divides the block's rows (14 for a
convolution's rows of 56, 28 or 14 pixels), no fewer than ``MIN_TILE_ROWS``;
the intrinsic marks its statements with that count (``TILE_ROWS_KEY``). A
block whose rows step ``A`` by more (a stride-2 convolution) reads it through
a copy gathered by output row (:mod:`probtune_x86.row_gather`). The
tiles' configuration and Linux's permission to use them are
:mod:`probtune_x86.tile_config`'s lowering step.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx

from probtune.plugin import (
    SPATIAL,
    BlockRV,
    Schedule,
    SpaceContext,
    at_root,
    indexing_dims,
    loop_kinds,
    sblock_names,
)
from probtune_cpu.llvm_features import llvm_target_has
from probtune_cpu.multi_level_tiling import WRITE_BACK_DEPTH_KEY, write_back_per_tile
from probtune_cpu.tensorize import TENSORIZE_KEY
from probtune_x86.bf16 import BF16
from probtune_x86.dot_product import DotInstruction, DotPlan, DotProductTiling, RewriteDotLayout, dot_plan
from probtune_x86.row_gather import GATHER_ROWS, gather_rows, index_step, strided_rows
from probtune_x86.vnni import VNNI

__all__ = [
    "AMX",
    "AMX_BF16",
    "BF16_TILE",
    "INT8_TILE",
    "MAX_STEPS",
    "MAX_TILES",
    "MIN_TILE_ROWS",
    "TILE_COLUMNS",
    "TILE_ROWS",
    "TILE_ROWS_KEY",
    "AMXBF16DotProduct",
    "AMXDotProduct",
    "AMXPlan",
    "RewriteAMXBF16Layout",
    "RewriteAMXLayout",
    "TileProduct",
    "amx_plan",
    "register_amx_bf16_intrinsic",
    "register_amx_intrinsic",
    "register_named",
    "register_tile_intrinsic",
    "tile_intrinsic",
    "tile_rows",
]

@dataclass(frozen=True)
class TileProduct:
    """One AMX tile product: 16 x 16 sums of ``terms`` products (64 bytes of a row of ``A``) of the types that
    ``vector``, the vector dot product, multiplies, its ``B`` blocked as that instruction blocks it."""

    prefix: str  # of its tensor intrinsics' names in TVM's table
    llvm_name: str
    vector: DotInstruction
    terms: int


INT8_TILE = TileProduct("probtune_x86.amx_u8s8", "llvm.x86.tdpbusd", VNNI, 64)
"""``tdpbusd``: unsigned by signed bytes, summed in int32."""

BF16_TILE = TileProduct("probtune_x86.amx_bf16", "llvm.x86.tdpbf16ps", BF16, 32)
"""``tdpbf16ps``: bfloat16 pairs, summed in float32."""

TILE_ROWS = TILE_COLUMNS = 16
"""A tile's most rows, and the columns of its sums (16 lanes of 4 bytes)."""
MIN_TILE_ROWS = 4
"""The fewest rows a tile of ``A`` and ``C`` is given: a tile product costs as much at any count of rows, so a block
whose rows no count from here to 16 divides is left to the vector instruction. Tiles less than half full (a 7-pixel
row) still beat ``vdpbf16ps`` several times over, and the vector program stays the other sketch."""
TILE_ROWS_KEY = "probtune_x86.tile_rows"
"""The attribute with which a tile intrinsic's statements name the rows of its tiles of ``A`` and ``C``."""
MAX_TILES = 2
"""Tiles of C per side of an intrinsic's block: 2 x 2 sums, 2 tiles of A and 2 of B fill the 8 tile registers."""
MAX_STEPS = 8
"""Tiles of terms an intrinsic's block sums before it stores its C tiles."""


_NAME = re.compile(r"(?P<prefix>.+)_(?P<rows>\d+)x(?P<columns>\d+)x(?P<terms>\d+)(?:_r(?P<tile_rows>\d+))?")


def tile_intrinsic(tile: TileProduct, row_tiles: int = 1, column_tiles: int = 1, steps: int = 1,
                   tile_rows: int = TILE_ROWS) -> str:
    """The name of ``tile``'s intrinsic for a block of ``row_tiles`` x ``column_tiles`` C tiles of ``tile_rows`` rows
    summing ``steps`` tiles of terms: ``<prefix>_<rows>x<columns>x<terms>``, and ``_r<tile_rows>`` below 16 rows."""
    name = f"{tile.prefix}_{row_tiles * tile_rows}x{column_tiles * TILE_COLUMNS}x{steps * tile.terms}"
    return name if tile_rows == TILE_ROWS else f"{name}_r{tile_rows}"


def register_named(name: str) -> int:
    """Register the intrinsic ``name`` (:func:`tile_intrinsic`'s), in a process that replays a program using it; the
    rows of its tiles."""
    match = _NAME.fullmatch(name)
    if match is None:
        raise ValueError(f"{name!r} is not the name of a tile intrinsic")
    tile = next(t for t in (INT8_TILE, BF16_TILE) if t.prefix == match["prefix"])
    tile_rows = int(match["tile_rows"] or TILE_ROWS)
    register_tile_intrinsic(tile, int(match["rows"]) // tile_rows, int(match["columns"]) // TILE_COLUMNS,
                            int(match["terms"]) // tile.terms, tile_rows)
    return tile_rows


def _tile_address(buffer: tirx.Buffer, indices: tuple, storage: str, extent: tirx.PrimExpr, mask: int) -> tirx.PrimExpr:
    """The address of ``buffer``'s element at ``indices``, where a tile is loaded or stored (``mask``: 1 read, 2
    write, ``extent`` elements). An element's address follows the buffer when TVM's storage rewrite lets it share
    memory with a buffer of another type, where a typed ``tvm_access_ptr`` then fails to lower. A bfloat16 buffer
    keeps the typed pointer (as stored, 16-bit): its bf16 legalization would widen a buffer whose element is read
    for its address."""
    if buffer.dtype != "bfloat16":
        return tirx.address_of(tirx.BufferLoad(buffer, list(indices)))
    offset = buffer.elem_offset
    for index, stride in zip(indices, buffer.strides):
        offset = offset + index * stride
    return tirx.call_intrin("handle", "tirx.tvm_access_ptr", tirx.type_annotation(storage), buffer.data, offset, extent, mask)


@functools.cache
def register_tile_intrinsic(tile: TileProduct, row_tiles: int = 1, column_tiles: int = 1, steps: int = 1,
                            tile_rows: int = TILE_ROWS) -> str:
    """Register ``tile``'s intrinsic for a block of C tiles (:func:`tile_intrinsic`) once: the C tiles loaded, then
    per step of terms the A and B tiles loaded and every C tile's product, then the C tiles stored. C tiles are
    registers 0 to 3, A's 4 and 5, B's 6 and 7; the statements are marked with the tiles' rows (``TILE_ROWS_KEY``)."""
    from tvm.script import tirx as T

    rows, columns, terms, depth = row_tiles * tile_rows, column_tiles * TILE_COLUMNS, steps * tile.terms, tile.vector.depth
    a_dtype, b_dtype, acc, step = tile.vector.a_dtype, tile.vector.b_dtype, tile.vector.accumulator, tile.terms
    a_bytes = tvm.DataType(a_dtype).bits // 8
    a_storage, b_storage = ("uint16" if t == "bfloat16" else t for t in (a_dtype, b_dtype))  # bfloat16 is stored so
    load, store, product = "llvm.x86.tileloadd64", "llvm.x86.tilestored64", tile.llvm_name

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (rows, terms), a_dtype, offset_factor=1)
        B = T.match_buffer(b, (column_tiles, terms // depth, TILE_COLUMNS, depth), b_dtype, offset_factor=1)
        C = T.match_buffer(c, (rows, columns), acc, offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:rows, 0:columns], A[0:rows, 0:terms], B[0:column_tiles, 0 : terms // depth, 0:TILE_COLUMNS, 0:depth])
            T.writes(C[0:rows, 0:columns])
            for i, j, k in T.grid(rows, columns, terms):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    C[vi, vj] = C[vi, vj] + T.Cast(acc, A[vi, vk]) * T.Cast(
                        acc, B[vj // TILE_COLUMNS, vk // depth, vj % TILE_COLUMNS, vk % depth])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        lda = T.int32()
        ldb = T.int32()
        ldc = T.int32()
        A = T.match_buffer(a, (rows, terms), a_dtype, offset_factor=1, strides=[lda, 1])
        B = T.match_buffer(b, (column_tiles, terms // depth, TILE_COLUMNS, depth), b_dtype, offset_factor=1,
                           strides=[ldb, TILE_COLUMNS * depth, depth, 1])
        C = T.match_buffer(c, (rows, columns), acc, offset_factor=1, strides=[ldc, 1])
        with T.sblock("root"):
            T.reads(C[0:rows, 0:columns], A[0:rows, 0:terms], B[0:column_tiles, 0 : terms // depth, 0:TILE_COLUMNS, 0:depth])
            T.writes(C[0:rows, 0:columns])
            with T.attr(0, TILE_ROWS_KEY, tile_rows):
                for r in T.unroll(row_tiles):
                    for q in T.unroll(column_tiles):
                        T.evaluate(T.call_llvm_intrin("void", load, T.Cast("int8", r * 2 + q), _tile_address(
                            C, (r * tile_rows, q * TILE_COLUMNS), acc, tile_rows * ldc, 1), T.Cast("int64", ldc * 4)))
                for s in range(steps):
                    for r in T.unroll(row_tiles):
                        T.evaluate(T.call_llvm_intrin("void", load, T.Cast("int8", 4 + r), _tile_address(
                            A, (r * tile_rows, s * step), a_storage, tile_rows * lda, 1), T.Cast("int64", lda * a_bytes)))
                    for q in T.unroll(column_tiles):
                        T.evaluate(T.call_llvm_intrin("void", load, T.Cast("int8", 6 + q), _tile_address(
                            B, (q, s * step // depth, 0, 0), b_storage, step * TILE_COLUMNS, 1), T.int64(64)))
                    for r in T.unroll(row_tiles):
                        for q in T.unroll(column_tiles):
                            T.evaluate(T.call_llvm_intrin("void", product, T.Cast("int8", r * 2 + q), T.Cast("int8", 4 + r),
                                                          T.Cast("int8", 6 + q)))
                for r in T.unroll(row_tiles):
                    for q in T.unroll(column_tiles):
                        T.evaluate(T.call_llvm_intrin("void", store, T.Cast("int8", r * 2 + q), _tile_address(
                            C, (r * tile_rows, q * TILE_COLUMNS), acc, tile_rows * ldc, 2), T.Cast("int64", ldc * 4)))

    from tvm.s_tir import TensorIntrin

    name = tile_intrinsic(tile, row_tiles, column_tiles, steps, tile_rows)
    if TensorIntrin.get(name, allow_missing=True) is None:
        TensorIntrin.register(name, desc, impl)
    return name


def register_amx_intrinsic() -> str:
    """Register ``tdpbusd``'s one-tile intrinsic."""
    return register_tile_intrinsic(INT8_TILE)


def register_amx_bf16_intrinsic() -> str:
    """Register ``tdpbf16ps``'s one-tile intrinsic."""
    return register_tile_intrinsic(BF16_TILE)


AMX = dataclasses.replace(VNNI, intrinsic=tile_intrinsic(INT8_TILE), register=register_amx_intrinsic,
                          llvm_feature="amx-int8", layout_key="probtune_x86.amx_layout")
"""``tdpbusd`` seen as ``vpdpbusd`` is (16 columns of 4-term sums), which its block must first map onto; its rows and
its 64 terms are :func:`amx_plan`'s. ``B``'s copy is annotated with its own key, for the same layout."""

AMX_BF16 = dataclasses.replace(BF16, intrinsic=tile_intrinsic(BF16_TILE), register=register_amx_bf16_intrinsic,
                               llvm_feature="amx-bf16", layout_key="probtune_x86.amx_bf16_layout")
"""``tdpbf16ps`` seen as ``vdpbf16ps`` is (16 columns of 2-term sums); 32 terms per tile."""

_TILES = {AMX.intrinsic: INT8_TILE, AMX_BF16.intrinsic: BF16_TILE}


@dataclass(frozen=True)
class AMXPlan:
    """How a block maps onto a tile product: as onto the vector dot product of its types, the loop of its rows, and
    the rows of a tile (the most, up to 16, that divide that loop)."""

    dot: DotPlan
    rows_loop: int
    tile_rows: int = TILE_ROWS


def amx_plan(raw: s_tir.Schedule, block: s_tir.schedule.SBlockRV, instruction: DotInstruction = AMX) -> AMXPlan | None:
    """How the block maps onto ``instruction``'s tile product, or None: a block of its vector dot product whose
    reduction is a whole number of tiles' terms, with a spatial loop of a whole number of tiles' rows (of
    ``MIN_TILE_ROWS`` to 16) that steps one row of ``A`` and of the output (a stride-2 convolution's pixels step two)
    and indexes no dimension of ``B``."""
    dot = dot_plan(raw, block, instruction)
    if dot is None:
        return None
    sblock, loops = raw.get(block), raw.get_loops(block)
    kinds = loop_kinds(raw, block, loops)
    if int(raw.get(loops[dot.depth_loop]).extent) % _TILES[instruction.intrinsic].terms:
        return None
    a_region, c_region = sblock.reads[dot.a].region, sblock.writes[0].region
    if len(a_region) < 2 or len(c_region) < 2:
        return None
    for index in reversed(range(dot.lanes_loop)):
        along = indexing_dims(raw, block, loops[index])
        extent = raw.get(loops[index]).extent
        rows = tile_rows(extent)
        if kinds[index] != SPATIAL or rows is None:
            continue
        var = sblock.iter_vars[index].var
        if (
            along.get(("write", 0)) == [len(c_region) - 2]
            and along.get(("read", dot.a)) == [len(a_region) - 2]
            and ("read", dot.b) not in along
            and index_step(a_region[-2].min, var) == 1
            and index_step(c_region[-2].min, var) == 1
        ):
            return AMXPlan(dot, index, rows)
    return None


def _gather(raw: s_tir.Schedule, block: s_tir.schedule.SBlockRV, instruction: DotInstruction) -> dict[str, int] | None:
    """``gather_rows``'s attributes where the block's rows step ``A`` by more than one (a stride-2 convolution) and it
    would map onto the tile product once they are gathered (tried on a copy of the schedule); None otherwise."""
    dot = dot_plan(raw, block, instruction)
    row = None if dot is None else strided_rows(raw, block, dot.a)
    if dot is None or row is None:
        return None
    trial = raw.copy()
    gather_rows(trial, block, dot.a, row)
    return {"read": dot.a, "row": row} if amx_plan(trial, block, instruction) is not None else None


def tile_rows(extent: tirx.PrimExpr | int) -> int | None:
    """The most rows, from ``MIN_TILE_ROWS`` to 16, that divide a loop of ``extent``; None if none does."""
    if not isinstance(extent, (tirx.IntImm, int)):
        return None
    return next((rows for rows in range(TILE_ROWS, MIN_TILE_ROWS - 1, -1) if int(extent) % rows == 0), None)


def _block_shape(raw: s_tir.Schedule, block: s_tir.schedule.SBlockRV, plan: AMXPlan, tile: TileProduct
                 ) -> tuple[int, int, int]:
    """The C tiles per side and the steps of terms of the block each intrinsic call computes: as many as divide the
    loops' extents, up to ``MAX_TILES`` and ``MAX_STEPS``."""
    extents = [int(raw.get(loop).extent) for loop in raw.get_loops(block)]

    def most(extent: int, unit: int, limit: int) -> int:
        return max(n for n in range(1, limit + 1) if extent % (n * unit) == 0)

    return (most(extents[plan.rows_loop], plan.tile_rows, MAX_TILES), most(extents[plan.dot.lanes_loop], TILE_COLUMNS, MAX_TILES),
            most(extents[plan.dot.depth_loop], tile.terms, MAX_STEPS))


@dataclass(frozen=True)
class AMXDotProduct(DotProductTiling):
    """Tile a u8 x s8 -> int32 reduction around AMX's ``tdpbusd`` where the target's CPU has AMX-INT8, its ``A`` first
    gathered by rows where they step it by more than one; the program without it (left to ``vnni-dot-product``) is
    a second sketch."""

    name: str = "amx-dot-product"
    instruction: DotInstruction = AMX

    def prior(self, sch: s_tir.Schedule, ctx: SpaceContext) -> float:
        """Every draw kept: a tile product's sums stay in AMX's tile registers, which the vector tilings' register
        tile does not measure."""
        return 1.0

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> list[Schedule] | None:  # type: ignore[override]
        raw, block_rv, op = sch.tvm, sch.resolve(block), self.instruction
        if not at_root(raw, block_rv) or not llvm_target_has(dict(ctx.target.tvm_target), op.llvm_feature):
            return None
        plan = amx_plan(raw, block_rv, op)
        gather = None if plan is not None else _gather(raw, block_rv, op)
        if plan is None and gather is None:
            return None
        op.register()
        fork = sch.fork()
        if gather is not None:
            sch.apply(GATHER_ROWS.name, [block], gather)
            raw, block_rv = sch.tvm, sch.resolve(block)
            plan = amx_plan(raw, block_rv, op)
        assert plan is not None  # _gather tried it
        loops = sch.get_loops(block)
        kinds = loop_kinds(raw, block_rv, [sch.resolve(loop) for loop in loops])
        dot, tile = plan.dot, _TILES[op.intrinsic]
        row_tiles, column_tiles, steps = _block_shape(raw, block_rv, plan, tile)
        intrinsic = register_tile_intrinsic(tile, row_tiles, column_tiles, steps, plan.tile_rows)
        loops[plan.rows_loop], rows_loop = sch.split(loops[plan.rows_loop], [None, row_tiles * plan.tile_rows])
        loops[dot.lanes_loop], lanes_loop = sch.split(loops[dot.lanes_loop], [None, column_tiles * TILE_COLUMNS])
        loops[dot.depth_loop], depth_loop = sch.split(loops[dot.depth_loop], [None, steps * tile.terms])
        order, level_ends = self._tile(sch, loops, kinds)
        sch.reorder(*order, rows_loop, lanes_loop, depth_loop)
        copy = sch.cache_read(block, dot.b, "global")
        sch.annotate(copy, op.layout_key, dot.b_dims[0] * op.lanes + dot.b_dims[1])
        written_back = write_back_per_tile(sch, block, [level_ends[level - 1] for level in self.write_back_levels])
        tiled = sch.blockize(rows_loop)
        sch.annotate(tiled, TENSORIZE_KEY, intrinsic)
        if written_back is not None:
            sch.unannotate(block, WRITE_BACK_DEPTH_KEY)
            sch.annotate(tiled, WRITE_BACK_DEPTH_KEY, written_back)
        return [fork]


@dataclass(frozen=True)
class AMXBF16DotProduct(AMXDotProduct):
    """Tile a bf16 x bf16 -> float32 reduction around AMX's ``tdpbf16ps`` where the target's CPU has AMX-BF16; the
    program without it (left to ``bf16-dot-product``) is a second sketch."""

    name: str = "amx-bf16-dot-product"
    instruction: DotInstruction = AMX_BF16


def _register_named_intrinsics(sch: s_tir.Schedule, prefix: str) -> set[int]:
    """Register the tile intrinsics (of ``prefix``) that blocks of ``sch`` are marked for, before they are tensorized;
    the rows of their tiles."""
    rows = set()
    for name in sblock_names(sch):
        intrinsic = sch.get(sch.get_sblock(name)).annotations.get(TENSORIZE_KEY)
        if intrinsic is not None and str(intrinsic).startswith(prefix + "_"):
            rows.add(register_named(str(intrinsic)))
    return rows


@dataclass(frozen=True)
class RewriteAMXLayout(RewriteDotLayout):
    """Lay each copy of ``B`` annotated for ``tdpbusd`` out as ``vpdpbusd`` reads it (64 consecutive terms of 16
    columns are then one tile), and register the tile intrinsics the program names (one per block shape); reject a
    program whose tiles would need two configurations (rows)."""

    name: str = "rewrite-amx-layout"
    instruction: DotInstruction = AMX

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        rows = _register_named_intrinsics(sch, _TILES[self.instruction.intrinsic].prefix)
        if len(rows) > 1:
            return f"its tile products have tiles of {sorted(rows)} rows, and a kernel has one tile configuration"
        return super().check(sch, ctx)


@dataclass(frozen=True)
class RewriteAMXBF16Layout(RewriteAMXLayout):
    """Lay each copy of ``B`` annotated for ``tdpbf16ps`` out as ``vdpbf16ps`` reads it (32 consecutive terms of 16
    columns are one tile), and register the tile intrinsics the program names."""

    name: str = "rewrite-amx-bf16-layout"
    instruction: DotInstruction = AMX_BF16
