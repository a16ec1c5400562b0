"""AMX: 8-bit products summed in int32 on tile registers, 16 x 16 outputs x 64 terms per instruction (``tdpbusd``).

A reduction that ``vpdpbusd`` computes (:mod:`probtune_x86.vnni`) and that
also has a row loop ``i``, indexing the output's and ``A``'s second-to-last
dimensions (a matrix product's rows, a convolution's output pixels along a
row), maps onto an AMX tile product: ``C[i, j] += A[i, k] * B[k, j]`` over 16
rows, 16 columns and 64 terms, with ``A``'s rows and ``C``'s read at their
strides and ``B`` in the same blocked layout as for ``vpdpbusd``
(``[..., j // 16, k // 4, j % 16, k % 4]``: 64 consecutive ``k`` of 16
columns are one 16 x 64-byte tile). Each product loads its ``C`` tile and
stores it back, which costs little beside the product; the tile
configuration (every tile 16 rows of 64 bytes) is loaded once per parallel
task by :func:`configure_tiles`, a lowering pass, and Linux's permission to
use the tiles is asked once per call of the kernel (``arch_prctl``), so a
compiled model runs in any process that loads it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import s_tir, tirx

from probtune.plugin import SPATIAL, BlockRV, Schedule, SpaceContext, at_root, indexing_dims, iter_stmts, loop_kinds
from probtune_cpu.llvm_features import llvm_target_has
from probtune_cpu.multi_level_tiling import WRITE_BACK_DEPTH_KEY, write_back_per_tile
from probtune_cpu.tensorize import TENSORIZE_KEY
from probtune_x86.dot_product import DotInstruction, DotPlan, DotProductTiling, RewriteDotLayout, dot_plan
from probtune_x86.vnni import VNNI

__all__ = [
    "AMX",
    "AMX_INTRINSIC",
    "AMX_LAYOUT_KEY",
    "AMX_LLVM_NAME",
    "AMX_TILE",
    "AMXDotProduct",
    "AMXPlan",
    "RewriteAMXLayout",
    "amx_plan",
    "configure_tiles",
    "register_amx_intrinsic",
]

AMX_INTRINSIC = "probtune_x86.amx_u8s8_16x16x64"
"""The tensor intrinsic's name in TVM's table (:func:`register_amx_intrinsic`)."""

AMX_TILE = (16, 16, 64)
"""Rows, columns and terms of one ``tdpbusd``."""

AMX_LLVM_NAME = "llvm.x86.tdpbusd"
"""LLVM's name of ``tdpbusd`` on tile registers named by number."""

_TILE_CALLS = ("llvm.x86.tileloadd64", AMX_LLVM_NAME, "llvm.x86.tilestored64")
_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_ARCH_PRCTL = 0x1023, 18, 158  # Linux x86-64's
_CONFIG_WORDS = (1, 0, 0x0040_0040_0040_0040, 0x0040_0040_0040_0040, 0, 0, 0x1010_1010_1010_1010, 0)
"""LDTILECFG's 64 bytes as eight words: palette 1, each of the 8 tiles 64 bytes wide and 16 rows high."""


def _tile_call(name: str, *args: Any) -> tirx.Stmt:
    return tirx.Evaluate(tirx.call_llvm_intrin("void", name, *args))


@functools.cache
def register_amx_intrinsic() -> str:
    """Register the tile product (its description, and tile loads, ``tdpbusd`` and a tile store) once."""
    from tvm.script import tirx as T

    rows, columns, terms = AMX_TILE

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (rows, terms), "uint8", offset_factor=1)
        B = T.match_buffer(b, (terms // 4, columns, 4), "int8", offset_factor=1)
        C = T.match_buffer(c, (rows, columns), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:rows, 0:columns], A[0:rows, 0:terms], B[0 : terms // 4, 0:columns, 0:4])
            T.writes(C[0:rows, 0:columns])
            for i, j, k in T.grid(rows, columns, terms):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    C[vi, vj] = C[vi, vj] + T.Cast("int32", A[vi, vk]) * T.Cast("int32", B[vk // 4, vj, vk % 4])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        lda = T.int32()
        ldc = T.int32()
        A = T.match_buffer(a, (rows, terms), "uint8", offset_factor=1, strides=[lda, 1])
        B = T.match_buffer(b, (terms // 4, columns, 4), "int8", offset_factor=1)
        C = T.match_buffer(c, (rows, columns), "int32", offset_factor=1, strides=[ldc, 1])
        with T.sblock("root"):
            T.reads(C[0:rows, 0:columns], A[0:rows, 0:terms], B[0 : terms // 4, 0:columns, 0:4])
            T.writes(C[0:rows, 0:columns])
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(0), C.access_ptr("r"), T.Cast("int64", ldc * 4)))
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(1), A.access_ptr("r"), T.Cast("int64", lda)))
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(2), B.access_ptr("r"), T.int64(columns * 4)))
            T.evaluate(T.call_llvm_intrin("void", AMX_LLVM_NAME, T.int8(0), T.int8(1), T.int8(2)))
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.int8(0), C.access_ptr("w"), T.Cast("int64", ldc * 4)))

    from tvm.s_tir import TensorIntrin

    if TensorIntrin.get(AMX_INTRINSIC, allow_missing=True) is None:
        TensorIntrin.register(AMX_INTRINSIC, desc, impl)
    return AMX_INTRINSIC


def _is_tile_call(stmt: tirx.Stmt) -> bool:
    """Whether ``stmt`` evaluates one of the tile product's LLVM intrinsics."""
    if not isinstance(stmt, tirx.Evaluate) or not isinstance(stmt.value, tvm.ir.expr.Call) or not stmt.value.args:
        return False
    first = stmt.value.args[0]
    return isinstance(first, tirx.IntImm) and int(first) in _tile_intrinsic_ids()


@functools.cache
def _tile_intrinsic_ids() -> frozenset[int]:
    from tvm.target import codegen

    return frozenset(int(codegen.llvm_lookup_intrinsic_id(name)) for name in _TILE_CALLS)


def _uses_tiles(stmt: tirx.Stmt) -> bool:
    return any(_is_tile_call(s) for s in iter_stmts(stmt))


def _tile_configuration() -> list[tirx.Stmt]:
    """Statements loading the tile configuration (LDTILECFG) from a 64-byte buffer on the stack."""
    config = tirx.decl_buffer((len(_CONFIG_WORDS),), "uint64", name="tile_config")
    stores = [tirx.BufferStore(config, tirx.IntImm("uint64", word), [tirx.IntImm("int32", n)])
              for n, word in enumerate(_CONFIG_WORDS)]
    load = _tile_call("llvm.x86.ldtilecfg", tirx.address_of(config[0]))
    return [tirx.AllocBuffer(config), *stores, load]


def _configured(stmt: tirx.Stmt) -> tirx.Stmt | None:
    """``stmt`` with the tile configuration loaded at the start of each parallel loop's body that uses tiles (each
    task's thread has tile registers of its own), or None where no parallel loop uses them."""
    if isinstance(stmt, tirx.For):
        if stmt.kind == tirx.ForKind.PARALLEL and _uses_tiles(stmt.body):
            body: tirx.Stmt | None = tirx.SeqStmt([*_tile_configuration(), stmt.body])
        else:
            body = _configured(stmt.body)
        if body is None:
            return None
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding,
                        stmt.annotations, stmt.step, stmt.span)
    if isinstance(stmt, tirx.SeqStmt):
        rewritten = [_configured(s) for s in stmt.seq]
        if all(r is None for r in rewritten):
            return None
        return tirx.SeqStmt([r if r is not None else s for r, s in zip(rewritten, stmt.seq)], stmt.span)
    if isinstance(stmt, tirx.AttrStmt):
        body = _configured(stmt.body)
        return None if body is None else tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, body, stmt.span)
    return None


def configure_tiles(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """A lowering step for programs with tile products: Linux's permission to use the tiles asked at the kernel's
    start, and the tile configuration loaded in each parallel task that uses them (at the start, if none does)."""
    if not _uses_tiles(func.body):
        return func
    body = _configured(func.body)
    permission = tirx.Evaluate(tirx.call_extern(
        "int64", "syscall", *(tirx.IntImm("int64", v) for v in (_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA))))
    if body is None:
        return func.with_body(tirx.SeqStmt([permission, *_tile_configuration(), func.body]))
    return func.with_body(tirx.SeqStmt([permission, body]))


AMX_LAYOUT_KEY = "probtune_x86.amx_layout"
"""Block annotation on ``B``'s copy for a tile product: as :data:`probtune_x86.vnni.VNNI_LAYOUT_KEY`, the same layout."""

AMX = DotInstruction(
    intrinsic=AMX_INTRINSIC,
    register=register_amx_intrinsic,
    llvm_feature="amx-int8",
    accumulator=VNNI.accumulator,
    a_dtype=VNNI.a_dtype,
    b_dtype=VNNI.b_dtype,
    lanes=VNNI.lanes,
    depth=VNNI.depth,
    layout_key=AMX_LAYOUT_KEY,
)
"""The tile product seen as ``vpdpbusd`` is (16 columns of 4-term sums), which its block must first map onto; its rows
and its 64 terms are :func:`amx_plan`'s."""


@dataclass(frozen=True)
class AMXPlan:
    """How a block maps onto the tile product: as onto ``vpdpbusd``, and the loop of its rows."""

    dot: DotPlan
    rows_loop: int


def _unit_stride(region_min: tirx.PrimExpr, var: tirx.Var) -> bool:
    """Whether ``region_min`` steps by one with ``var``."""
    coefficients = tvm.sym.detect_linear_equation(region_min, [var])
    return len(coefficients) == 2 and isinstance(coefficients[0], tirx.IntImm) and int(coefficients[0]) == 1


def amx_plan(raw: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> AMXPlan | None:
    """How the block maps onto the tile product, or None: a ``vpdpbusd`` block whose reduction is a whole number of
    64 terms, with a spatial loop of a whole number of 16 rows that steps one row of ``A`` and of the output (a
    stride-2 convolution's pixels step two) and indexes no dimension of ``B``."""
    dot = dot_plan(raw, block, AMX)
    if dot is None:
        return None
    sblock, loops = raw.get(block), raw.get_loops(block)
    kinds = loop_kinds(raw, block, loops)
    if int(raw.get(loops[dot.depth_loop]).extent) % AMX_TILE[2]:
        return None
    a_region, c_region = sblock.reads[dot.a].region, sblock.writes[0].region
    if len(a_region) < 2 or len(c_region) < 2:
        return None
    for index in reversed(range(dot.lanes_loop)):
        along = indexing_dims(raw, block, loops[index])
        extent = raw.get(loops[index]).extent
        if kinds[index] != SPATIAL or not isinstance(extent, tirx.IntImm) or int(extent) % AMX_TILE[0]:
            continue
        var = sblock.iter_vars[index].var
        if (
            along.get(("write", 0)) == [len(c_region) - 2]
            and along.get(("read", dot.a)) == [len(a_region) - 2]
            and ("read", dot.b) not in along
            and _unit_stride(a_region[-2].min, var)
            and _unit_stride(c_region[-2].min, var)
        ):
            return AMXPlan(dot, index)
    return None


@dataclass(frozen=True)
class AMXDotProduct(DotProductTiling):
    """Tile a u8 x s8 -> int32 reduction around AMX's ``tdpbusd`` where the target's CPU has AMX-INT8; the program
    without it (left to ``vnni-dot-product``) is a second sketch."""

    name: str = "amx-dot-product"
    instruction: DotInstruction = AMX

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> list[Schedule] | None:  # type: ignore[override]
        raw, block_rv = sch.tvm, sch.resolve(block)
        if not at_root(raw, block_rv) or not llvm_target_has(dict(ctx.target.tvm_target), AMX.llvm_feature):
            return None
        plan = amx_plan(raw, block_rv)
        if plan is None:
            return None
        AMX.register()
        fork = sch.fork()
        loops = sch.get_loops(block)
        kinds = loop_kinds(raw, block_rv, [sch.resolve(loop) for loop in loops])
        rows, columns, terms = AMX_TILE
        dot = plan.dot
        loops[plan.rows_loop], rows_loop = sch.split(loops[plan.rows_loop], [None, rows])
        loops[dot.lanes_loop], lanes_loop = sch.split(loops[dot.lanes_loop], [None, columns])
        loops[dot.depth_loop], depth_loop = sch.split(loops[dot.depth_loop], [None, terms])
        order, level_ends = self._tile(sch, loops, kinds)
        sch.reorder(*order, rows_loop, lanes_loop, depth_loop)
        copy = sch.cache_read(block, dot.b, "global")
        sch.annotate(copy, AMX.layout_key, dot.b_dims[0] * AMX.lanes + dot.b_dims[1])
        written_back = write_back_per_tile(sch, block, [level_ends[level - 1] for level in self.write_back_levels])
        tile = sch.blockize(rows_loop)
        sch.annotate(tile, TENSORIZE_KEY, AMX.intrinsic)
        if written_back is not None:
            sch.unannotate(block, WRITE_BACK_DEPTH_KEY)
            sch.annotate(tile, WRITE_BACK_DEPTH_KEY, written_back)
        return [fork]


@dataclass(frozen=True)
class RewriteAMXLayout(RewriteDotLayout):
    """Lay each copy of ``B`` annotated for the tile product out as ``vpdpbusd`` reads it (64 consecutive terms of 16
    columns are then one tile), and register the tile product's intrinsic."""

    name: str = "rewrite-amx-layout"
    instruction: DotInstruction = AMX
