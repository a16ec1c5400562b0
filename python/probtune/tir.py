"""Read-only analysis of TIR programs that design-space modules and validators share."""

from __future__ import annotations

from typing import Iterator

from tvm import s_tir, tirx

__all__ = [
    "iter_stmts", "child_stmts", "block_names", "sblock_names", "find_realize", "realize_of", "loop_kinds", "at_root", "contiguous_along",
    "SPATIAL", "REDUCTION", "OTHER",
]

SPATIAL = "spatial"
REDUCTION = "reduction"
OTHER = "other"  # unused by the block's bindings, or bound to opaque/ordered iterators

_CHILD_FIELDS = ("seq", "block", "init", "body", "then_case", "else_case")


def child_stmts(stmt: tirx.Stmt) -> list[tirx.Stmt]:
    """The statements directly under ``stmt``, in program order."""
    children: list[tirx.Stmt] = []
    for name in _CHILD_FIELDS:
        child = getattr(stmt, name, None)
        if child is None:
            continue
        if isinstance(child, tirx.Stmt):
            children.append(child)
        elif not isinstance(child, tirx.Expr):  # an Array of statements
            children.extend(c for c in child if isinstance(c, tirx.Stmt))
    return children


def iter_stmts(stmt: tirx.Stmt) -> Iterator[tirx.Stmt]:
    """All statements under ``stmt``, parents before children, in program order."""
    stack = [stmt]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(child_stmts(node)))


def block_names(func: tirx.PrimFunc) -> list[str]:
    """Names of the blocks of ``func`` in program order, without the implicit root block."""
    return [s.block.name_hint for s in iter_stmts(func.body) if isinstance(s, s_tir.SBlockRealize)
            and s.block.name_hint != "root"]


def sblock_names(sch: s_tir.Schedule) -> list[str]:
    """``block_names`` of the schedule's program, asked of TVM rather than by walking it (validators run it often)."""
    return [sch.get(block).name_hint for block in sch.get_child_blocks(sch.get_sblock("root"))]


def realize_of(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> s_tir.SBlockRealize:
    """The statement that binds ``block``'s iterators, found from its parent loop where possible."""
    sblock = sch.get(block)
    parent = sch.get_sref(block).parent
    body = getattr(parent.stmt, "body", None) if parent is not None else None
    for stmt in ([body] if isinstance(body, s_tir.SBlockRealize) else getattr(body, "seq", None) or ()):
        if isinstance(stmt, s_tir.SBlockRealize) and stmt.block.same_as(sblock):
            return stmt
    return find_realize(sch.mod["main"], sblock.name_hint)


def find_realize(func: tirx.PrimFunc, name: str) -> s_tir.SBlockRealize:
    for stmt in iter_stmts(func.body):
        if isinstance(stmt, s_tir.SBlockRealize) and stmt.block.name_hint == name:
            return stmt
    raise KeyError(f"no block named {name!r}")


def loop_kinds(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, loops: list[s_tir.schedule.LoopRV]) -> list[str]:
    """For each loop, whether it feeds only spatial iterators of ``block``, any reduction one, or neither."""
    sblock = sch.get(block)
    realize = realize_of(sch, block)
    uses: list[tuple[set[tirx.Var], int]] = [
        (set(tirx.analysis.undefined_vars(value)), int(iv.iter_type))
        for iv, value in zip(sblock.iter_vars, realize.iter_values)
    ]
    kinds = []
    for loop in loops:
        var = sch.get(loop).loop_var
        types = {iter_type for used, iter_type in uses if any(v.same_as(var) for v in used)}
        if types == {tirx.IterVar.DataPar}:
            kinds.append(SPATIAL)
        elif types and types <= {tirx.IterVar.DataPar, tirx.IterVar.CommReduce}:
            kinds.append(REDUCTION)
        else:
            kinds.append(OTHER)
    return kinds


def at_root(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """Whether the block has loops hanging directly under the root block (not computed at another block)."""
    loops = sch.get_loops(block)
    if not loops:
        return False
    parent = sch.get_sref(loops[0]).parent
    return parent is not None and isinstance(parent.stmt, s_tir.SBlock)


def contiguous_along(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, loop: s_tir.schedule.LoopRV) -> bool:
    """Whether every buffer the block accesses is indexed by ``loop`` in its last dimension only, if at all."""
    sblock = sch.get(block)
    loop_var = sch.get(loop).loop_var
    realize = realize_of(sch, block)
    bound = {
        iv.var
        for iv, value in zip(sblock.iter_vars, realize.iter_values)
        if any(v.same_as(loop_var) for v in tirx.analysis.undefined_vars(value))
    }
    for region in [*sblock.reads, *sblock.writes]:
        for dim in region.region[:-1]:
            if any(any(v.same_as(b) for b in bound) for v in tirx.analysis.undefined_vars(dim.min)):
                return False
    return True
