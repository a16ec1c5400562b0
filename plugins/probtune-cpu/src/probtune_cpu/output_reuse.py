"""Keep an intermediate that several blocks read in the output buffer, and finish the output in place.

Softmax computes ``exp[i, j]``, sums it, and writes ``out[i, j] = exp[i, j] /
sum[i]``: the exponentials are a whole extra buffer, and the last pass writes
the output from scratch. Vendor kernels (MLAS) store the exponentials in the
output and scale them there, and so does this rewrite, which made the best
program of a softmax tune faster (bench/results/NOTES.md): the writes that miss
the cache then happen in the exponentials' pass, overlapped with their
arithmetic, and the last pass reads and writes lines the sum has just read.

Applied to an intermediate ``E`` (allocated at the root, the output's shape
and dtype) when the output's only writer ``N`` reads ``E`` only at the
element it writes, nothing reads the output, and ``E`` has readers other
than ``N`` and its own producer (an intermediate with one consumer is left
to inlining and caches). Storing ``E`` in the output is correct when no
other block reads or writes an element of ``E`` after ``N`` has overwritten
it: each of them comes before ``N`` in program order, and if they share
loops, both access, in some dimensions, the same coordinate given by those
loops alone, one coordinate per iteration (a bijection), so an iteration
touches no element another iteration overwrote.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

from probtune.plugin import SpaceContext, as_list, child_stmts, identity, sblock_names, variable_ids
from probtune_cpu.stored_values import map_bottom_up, replace_block

__all__ = ["RewriteOutputReuse", "loads_of"]


@dataclass
class _Block:
    """A block with what the analysis needs: its realize, enclosing loops and position in program order."""

    realize: s_tir.SBlockRealize
    loops: list[tirx.For]
    order: int

    @property
    def block(self) -> s_tir.SBlock:
        return self.realize.block

    def touches(self, buffer: tirx.Buffer, field: str) -> bool:
        return any(region.source.same_as(buffer) for region in getattr(self.block, field))


def _blocks(func: tirx.PrimFunc) -> list[_Block]:
    blocks: list[_Block] = []

    def walk(stmt: tirx.Stmt, loops: list[tirx.For]) -> None:
        if isinstance(stmt, s_tir.SBlockRealize) and stmt.block.name_hint != "root":
            blocks.append(_Block(stmt, loops, len(blocks)))
        inner = [*loops, stmt] if isinstance(stmt, tirx.For) else loops
        for child in child_stmts(stmt):
            walk(child, inner)

    walk(func.body, [])
    return blocks


def loads_of(expr: tirx.Expr, buffer: tirx.Buffer) -> list[TensorLoad]:
    """Every load of ``buffer`` in ``expr``."""
    loads: list[TensorLoad] = []

    def collect(node: tirx.Expr) -> tirx.Expr:
        if isinstance(node, TensorLoad) and node.source.same_as(buffer):
            loads.append(node)
        return node

    map_bottom_up(expr, collect)
    return loads


def _single_store(block: s_tir.SBlock) -> bool:
    return isinstance(block.body, tirx.BufferStore) and (block.init is None or isinstance(block.init, tirx.BufferStore))


def _block_accesses(block: s_tir.SBlock, buffer: tirx.Buffer) -> list[list[tirx.Expr]]:
    """The indices of every load and store of ``buffer`` in a single-store block's value and init."""
    stores = [block.body] if block.init is None else [block.init, block.body]
    loads = [list(load.indices) for store in stores for load in loads_of(store.value, buffer)]
    return loads + [list(store.indices) for store in stores if store.buffer.same_as(buffer)]


def _analyzer(blocks: list[_Block]) -> tvm.sym.Analyzer:
    """Loop variables bound to their ranges, block iterators to their bindings."""
    analyzer = tvm.sym.Analyzer()
    bound: set[int] = set()
    for info in blocks:
        for loop in info.loops:
            if identity(loop.loop_var) not in bound:
                bound.add(identity(loop.loop_var))
                analyzer.bind(loop.loop_var, tvm.ir.Range.from_min_extent(loop.min, loop.extent))
        for iter_var, value in zip(info.block.iter_vars, info.realize.iter_values):
            analyzer.bind(iter_var.var, value)
    return analyzer


def _ordered_before(user: _Block, writer: _Block, intermediate: tirx.Buffer, coordinates: list[tirx.Expr]) -> bool:
    """Whether every access of ``user`` to ``intermediate`` happens before ``writer`` overwrites that element.

    A read after it would see the output's value; a write after it (a producer
    recomputed inside the writer's loops) would overwrite the output.
    """
    if user.order > writer.order:
        return False
    shared = []
    for a, b in zip(user.loops, writer.loops):
        if not a.loop_var.same_as(b.loop_var):
            break
        shared.append(a)
    if not shared:  # the user's whole nest runs before the writer's
        return True
    analyzer = _analyzer([user, writer])
    shared_ids = {identity(loop.loop_var) for loop in shared}
    written = [analyzer.simplify(c) for c in coordinates]
    dims = [d for d, c in enumerate(written) if (used := variable_ids(c)) and used <= shared_ids]
    if not dims:
        return False
    for indices in _block_accesses(user.block, intermediate):
        if not all(tvm_ffi.structural_equal(analyzer.simplify(indices[d]), written[d]) for d in dims):
            return False
    domain = {loop.loop_var: tvm.ir.Range.from_min_extent(loop.min, loop.extent) for loop in shared}
    return len(tvm.sym.detect_iter_map([written[d] for d in dims], domain, check_level="bijective").indices) > 0


def _reusable(func: tirx.PrimFunc) -> tuple[tirx.Buffer, tirx.Buffer] | None:
    """An (intermediate, output) pair that the module docstring's rule allows, or None."""
    blocks = _blocks(func)
    allocated = as_list(func.body.block.alloc_buffers)
    for output in as_list(func.params):
        writers = [b for b in blocks if b.touches(output, "writes")]
        if len(writers) != 1 or any(b.touches(output, "reads") for b in blocks):
            continue
        (finisher,) = writers
        store = finisher.block.body
        if finisher.block.init is not None or not isinstance(store, tirx.BufferStore):
            continue
        for intermediate in allocated:
            if not _same_layout(intermediate, output):
                continue
            loads = loads_of(store.value, intermediate)
            if not loads or not all(tvm_ffi.structural_equal(load.indices, store.indices) for load in loads):
                continue
            users = [b for b in blocks if b is not finisher and (b.touches(intermediate, "reads") or b.touches(intermediate, "writes"))]
            producers = [b for b in users if b.touches(intermediate, "writes")]
            readers = [b for b in users if b not in producers]
            if len(producers) != 1 or not readers or not all(_single_store(b.block) for b in users):
                continue
            if not all(_block_accesses(b.block, intermediate) for b in readers):
                continue  # a read the walk cannot see: leave the program alone
            if all(_ordered_before(user, finisher, intermediate, list(store.indices)) for user in users):
                return intermediate, output
    return None


def _same_layout(a: tirx.Buffer, b: tirx.Buffer) -> bool:
    return a.scope() == b.scope() and str(a.dtype) == str(b.dtype) and len(a.shape) == len(b.shape) and all(
        isinstance(x, tirx.IntImm) and isinstance(y, tirx.IntImm) and int(x) == int(y) for x, y in zip(a.shape, b.shape)
    )


def _store_in(sch: s_tir.Schedule, intermediate: tirx.Buffer, output: tirx.Buffer) -> None:
    """Every access to ``intermediate`` goes to ``output`` instead; ``intermediate`` is no longer allocated."""

    def redirect(expr: tirx.Expr) -> tirx.Expr:
        if isinstance(expr, TensorLoad) and expr.source.same_as(intermediate):
            return tirx.BufferLoad(output, expr.indices)
        return expr

    def store(stmt: tirx.BufferStore | None) -> tirx.BufferStore | None:
        if stmt is None:
            return None
        buffer = output if stmt.buffer.same_as(intermediate) else stmt.buffer
        return tirx.BufferStore(buffer, map_bottom_up(stmt.value, redirect), stmt.indices)

    def regions(regions: list) -> list:
        return [tirx.BufferRegion(output, r.region) if r.source.same_as(intermediate) else r for r in regions]

    for name in sblock_names(sch):
        block_rv = sch.get_sblock(name)
        block = sch.get(block_rv)
        if not any(r.source.same_as(intermediate) for r in [*block.reads, *block.writes]):
            continue
        replace_block(
            sch, block_rv, reads=regions(block.reads), writes=regions(block.writes), body=store(block.body),
            init=store(block.init),
        )
    root_rv = sch.get_sblock("root")
    kept = [buffer for buffer in sch.get(root_rv).alloc_buffers if not buffer.same_as(intermediate)]
    replace_block(sch, root_rv, alloc_buffers=kept)


@dataclass(frozen=True)
class RewriteOutputReuse:
    """Store an intermediate in the output when the module docstring's rule allows it."""

    name: str = "rewrite-output-reuse"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        while (pair := _reusable(sch.mod["main"])) is not None:
            _store_in(sch, *pair)
        return None
