"""Read-only analysis of TIR programs that design-space modules and validators share."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

__all__ = [
    "OTHER",
    "REDUCTION",
    "SPATIAL",
    "allows",
    "as_list",
    "at_root",
    "block_names",
    "child_stmts",
    "contiguous_along",
    "find_realize",
    "identity",
    "indexing_dims",
    "is_one",
    "is_spatial",
    "iter_loads",
    "iter_stmts",
    "loop_kinds",
    "nested_sblocks",
    "only_store",
    "program_blocks",
    "realize_of",
    "reuses_data",
    "root_tile",
    "sblock_names",
    "thread_tag",
    "variable_ids",
]

SPATIAL = "spatial"
REDUCTION = "reduction"
OTHER = "other"  # unused by the block's bindings, or bound to opaque/ordered iterators

_CHILD_FIELDS = ("seq", "block", "init", "body", "then_case", "else_case")
_EXPR_FIELDS = ("a", "b", "value", "condition", "true_value", "false_value", "args", "indices", "body")
_fields_by_type: dict[tuple[type, tuple[str, ...]], tuple[str, ...]] = {}

_get_sblock_realize = tvm_ffi.get_global_func("s_tir.schedule.GetSBlockRealize")  # no Python wrapper in TVM 0.27


def _child_fields(stmt: tirx.Stmt) -> tuple[str, ...]:
    """The ``_CHILD_FIELDS`` that statements of this type have, looked up once per type.

    Asking a TVM object for a field it lacks raises and catches an AttributeError, the
    slowest step of a walk.
    """
    return _fields(stmt, _CHILD_FIELDS)


def _fields(node: tvm_ffi.Object, names: tuple[str, ...]) -> tuple[str, ...]:
    """The ``names`` that nodes of this type have, looked up once per type."""
    key = (type(node), names)
    fields = _fields_by_type.get(key)
    if fields is None:
        fields = _fields_by_type[key] = tuple(name for name in names if hasattr(type(node), name))
    return fields


def child_stmts(stmt: tirx.Stmt) -> list[tirx.Stmt]:
    """The statements directly under ``stmt``, in program order."""
    children: list[tirx.Stmt] = []
    for name in _child_fields(stmt):
        child = getattr(stmt, name, None)
        if child is None:
            continue
        if isinstance(child, tirx.Stmt):
            children.append(child)
        elif not isinstance(child, tirx.Expr):  # an Array of statements
            children.extend(c for c in as_list(child) if isinstance(c, tirx.Stmt))
    return children


def as_list(array: tvm_ffi.Array) -> list:
    """The elements of a TVM Array as a Python list.

    Slicing fetches every element in one comprehension; iterating an Array checks and
    normalizes each index in Python first, which doubles the cost of short loops.
    """
    return array[:]


def identity(obj: tvm_ffi.Object) -> int:
    """A key that is equal for two Python handles of the same TVM object, and only for them (``same_as``).

    The hash of a TVM object is the address of the object it refers to; a key is only
    meaningful while that object is alive. (TVM expressions cannot go into sets
    themselves: ``==`` on them builds a comparison expression.)
    """
    return hash(obj)


def variable_ids(expr: tirx.Expr) -> set[int]:
    """The ``identity`` of every variable ``expr`` uses."""
    return {identity(var) for var in as_list(tirx.analysis.undefined_vars(expr))}


def iter_stmts(stmt: tirx.Stmt) -> Iterator[tirx.Stmt]:
    """All statements under ``stmt``, parents before children, in program order."""
    stack = [stmt]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(child_stmts(node)))


def iter_loads(expr: tirx.Expr) -> Iterator[TensorLoad]:
    """Every buffer load in ``expr``, those in other loads' indices too, outer loads first."""
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, TensorLoad):
            yield node
        for name in reversed(_fields(node, _EXPR_FIELDS)):
            child = getattr(node, name)
            if isinstance(child, tirx.Expr):
                stack.append(child)
            elif isinstance(child, tvm_ffi.Array):
                stack.extend(reversed([c for c in as_list(child) if isinstance(c, tirx.Expr)]))


def allows(raw: s_tir.Schedule, primitive: Callable[[s_tir.Schedule], object]) -> bool:
    """Whether TVM allows ``primitive`` on a throw-away copy of ``raw`` (the copy keeps the random variables valid).

    Legality depends on the program's structure, not on sampled values, so a move asked this way holds on every
    replay, and a refused one never reaches the trace."""
    try:
        primitive(raw.copy())
    except RuntimeError:  # TVM's schedule errors
        return False
    return True


def program_blocks(func: tirx.PrimFunc) -> list[s_tir.SBlock]:
    """The blocks of ``func`` in program order, without the implicit root block."""
    return [s.block for s in iter_stmts(func.body) if isinstance(s, s_tir.SBlockRealize) and s.block.name_hint != "root"]


def block_names(func: tirx.PrimFunc) -> list[str]:
    """Names of the blocks of ``func`` in program order, without the implicit root block."""
    return [block.name_hint for block in program_blocks(func)]


def is_one(extent: tirx.PrimExpr) -> bool:
    """Whether ``extent`` is the constant 1 (a loop or iterator of one value)."""
    return isinstance(extent, tirx.IntImm) and int(extent) == 1


def sblock_names(sch: s_tir.Schedule) -> list[str]:
    """``block_names`` of the schedule's program, asked of TVM rather than by walking it (validators run it often)."""
    return [sch.get(block).name_hint for block in sch.get_child_blocks(sch.get_sblock("root"))]


def nested_sblocks(sch: s_tir.Schedule) -> list[s_tir.schedule.SBlockRV]:
    """Every block of the program, those inside other blocks too (a blockized tile holds its original block)."""
    found, pending = [], list(sch.get_child_blocks(sch.get_sblock("root")))
    while pending:
        block = pending.pop()
        found.append(block)
        pending.extend(sch.get_child_blocks(block))
    return found


def realize_of(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> s_tir.SBlockRealize:
    """The statement that binds ``block``'s iterators (TVM finds it from the block's parent)."""
    return _get_sblock_realize(sch, block)


def find_realize(func: tirx.PrimFunc, name: str) -> s_tir.SBlockRealize:
    for stmt in iter_stmts(func.body):
        if isinstance(stmt, s_tir.SBlockRealize) and stmt.block.name_hint == name:
            return stmt
    raise KeyError(f"no block named {name!r}")


def loop_kinds(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, loops: list[s_tir.schedule.LoopRV]) -> list[str]:
    """For each loop, whether it feeds only spatial iterators of ``block``, any reduction one, or neither."""
    realize = realize_of(sch, block)
    iter_types_using: dict[int, set[int]] = {}  # identity of a variable -> types of the iterators it feeds
    for iv, value in zip(as_list(realize.block.iter_vars), as_list(realize.iter_values)):
        for var in as_list(tirx.analysis.undefined_vars(value)):
            iter_types_using.setdefault(identity(var), set()).add(int(iv.iter_type))
    kinds = []
    for loop in loops:
        types = iter_types_using.get(identity(sch.get(loop).loop_var), set())
        if types == {tirx.IterVar.DataPar}:
            kinds.append(SPATIAL)
        elif types and types <= {tirx.IterVar.DataPar, tirx.IterVar.CommReduce}:
            kinds.append(REDUCTION)
        else:
            kinds.append(OTHER)
    return kinds


def thread_tag(loop: tirx.For) -> str:
    """The GPU thread axis a loop is bound to, by its tag ("blockIdx.x", "vthread.y", ...), or "" for an unbound loop."""
    binding = loop.thread_binding
    return "" if binding is None else str(binding.thread_tag)


def at_root(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """Whether the block has loops hanging directly under the root block (not computed at another block or inside one)."""
    loops = sch.get_loops(block)
    if not loops:
        return False
    parent = sch.get_sref(loops[0]).parent
    return parent is not None and isinstance(parent.stmt, s_tir.SBlock) and parent.parent is None


def root_tile(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> str | None:
    """The name of the root-level block that ``block`` was blockized into, if it is not at the root itself."""
    if at_root(sch, block):
        return None
    sref = sch.get_sref(block).parent
    while sref is not None and not isinstance(sref.stmt, s_tir.SBlock):
        sref = sref.parent
    if sref is None or sref.parent is None:  # under the root block: computed at another block's loops
        return None
    name = str(sref.stmt.name_hint)
    return name if at_root(sch, sch.get_sblock(name)) else None


def indexing_dims(
    sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, loop: s_tir.schedule.LoopRV
) -> dict[tuple[str, int], list[int]]:
    """For each access of the block that ``loop`` indexes, the dimensions it indexes.

    Keys are ("read" or "write", the access's position in the block's reads or
    writes); an access missing from the result is the same on every iteration.
    """
    loop_var_id = identity(sch.get(loop).loop_var)
    realize = realize_of(sch, block)
    sblock = realize.block
    bound = {  # identities of the block iterators that ``loop`` feeds
        identity(iv.var)
        for iv, value in zip(as_list(sblock.iter_vars), as_list(realize.iter_values))
        if any(identity(v) == loop_var_id for v in as_list(tirx.analysis.undefined_vars(value)))
    }
    indexed = {}
    for kind, regions in (("read", sblock.reads), ("write", sblock.writes)):
        for index, region in enumerate(as_list(regions)):
            dims = [
                dim
                for dim, extent in enumerate(region.region)
                if any(identity(v) in bound for v in as_list(tirx.analysis.undefined_vars(extent.min)))
            ]
            if dims:
                indexed[(kind, index)] = dims
    return indexed


def contiguous_along(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, loop: s_tir.schedule.LoopRV) -> bool:
    """Whether every buffer the block accesses is indexed by ``loop`` in its last dimension only, if at all."""
    sblock = sch.get(block)
    regions = {"read": as_list(sblock.reads), "write": as_list(sblock.writes)}
    return all(dims == [len(regions[kind][index].region) - 1] for (kind, index), dims in indexing_dims(sch, block, loop).items())


def is_spatial(block: s_tir.SBlock) -> bool:
    """Whether every iterator of the block is spatial (it reduces over nothing)."""
    return all(int(iv.iter_type) == tirx.IterVar.DataPar for iv in block.iter_vars)


def reuses_data(block: s_tir.SBlock, unit_iterators: bool = True) -> bool:
    """Whether some input read ignores a spatial iterator, so its elements serve several outputs (matmul, conv).

    Without ``unit_iterators``, an iterator of one value does not count: a mean that keeps its reduced axis ignores
    that axis's iterator, and serves no element twice."""
    spatial = [iv.var for iv in block.iter_vars if int(iv.iter_type) == tirx.IterVar.DataPar
               and (unit_iterators or not is_one(iv.dom.extent))]
    output = block.writes[0].source
    for read in block.reads:
        if read.source.same_as(output):
            continue
        used = [var for r in read.region for var in tirx.analysis.undefined_vars(r.min)]
        if any(not any(var.same_as(u) for u in used) for var in spatial):
            return True
    return False


def only_store(func: tirx.PrimFunc) -> tirx.BufferStore | None:
    """The store of a function that is one block storing one value per iteration (a cast, a copy); None otherwise."""
    blocks = program_blocks(func)
    return blocks[0].body if len(blocks) == 1 and isinstance(blocks[0].body, tirx.BufferStore) else None
