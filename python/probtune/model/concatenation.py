"""Concatenations written one input at a time, with no choice of input per element.

TVM lowers ``concat`` to one loop nest whose every element picks its input
through a chain of ``if_then_else`` tests on the concatenated axis, one test
per input, and fuses elementwise consumers (a batch norm, a ReLU) after it.
With many inputs (a DenseNet layer concatenates every earlier layer's
output: 25 in DenseNet-121's last one) the tests cost more than the copy and keep the
loop from being vectorized. :func:`split_concatenations` rewrites such a
function, when all its blocks are spatial and it concatenates at least
:data:`MIN_INPUTS` inputs, as one loop nest per input: every
block inlined into the one writing the output, and that block written once
per stretch of the axis between two inputs' boundaries, where the analyzer
folds the tests away. The function computes the same values; tasks and the
compiled model both use the rewritten one. :func:`concatenation_axis` tells a
function that only concatenates (and along which axis), for
:mod:`probtune.model.concat_in_place`.
"""

from __future__ import annotations

import itertools

import tvm
from tvm import s_tir, tirx

from probtune.errors import summary, warn_caller
from probtune.schedule.analysis import as_list, identity, is_spatial, iter_stmts, variable_ids

__all__ = ["MIN_INPUTS", "concatenation_axis", "split_concatenation", "split_concatenations"]

MIN_INPUTS = 7
"""Fewer inputs keep TVM's form: each piece is a loop nest (and a parallel loop) of its own, which costs more
than a short chain of tests (tuned both ways on DenseNet-121 and GoogLeNet: ``bench/results/zoo_tuned_1000_*``)."""

_IF_THEN_ELSE = "prim.if_then_else"


def split_concatenations(fused: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``fused`` with every PrimFunc that :func:`split_concatenation` rewrites replaced; how many were."""
    replaced = {}
    for gv in fused.get_global_vars():
        func = fused[gv]
        if not isinstance(func, tirx.PrimFunc):
            continue
        try:
            split = split_concatenation(func)
        except Exception as exc:  # noqa: BLE001 - TVM refused a step: the function stays as TVM wrote it
            warn_caller(f"{gv.name_hint} keeps TVM's concatenation: {summary(exc)}")
            continue
        if split is not None:
            replaced[gv] = split
    if not replaced:
        return fused, 0
    functions = {gv: replaced.get(gv, fused[gv]) for gv in fused.get_global_vars()}
    return tvm.IRModule(functions, attrs=fused.attrs), len(replaced)


def split_concatenation(func: tirx.PrimFunc, min_inputs: int = MIN_INPUTS) -> tirx.PrimFunc | None:
    """``func`` as one loop nest per stretch of its concatenated axis; None where it has no such axis.

    Only functions of spatial blocks (no reduction) whose blocks all inline
    into one writing the output qualify; the axis is the output iterator the
    most ``if_then_else`` tests compare with a constant, and it must have at
    least ``min_inputs`` stretches.
    """
    sblocks = [s.block for s in iter_stmts(func.body) if isinstance(s, s_tir.SBlockRealize) and s.block.name_hint != "root"]
    if not any(_thresholds(b) for b in sblocks) or not all(is_spatial(b) for b in sblocks):
        return None
    final = _inline_all(func)
    cuts = _thresholds(final.block) if final is not None else {}
    if final is None or not cuts:  # the tests now on an index expression (a consumer reorders the axis)
        return None
    block = final.block
    axis = max(cuts, key=lambda n: len(cuts[n]))
    extent = int(block.iter_vars[axis].dom.extent)
    bounds = [0, *sorted(t for t in cuts[axis] if 0 < t < extent), extent]
    if len(bounds) - 1 < max(min_inputs, 2):
        return None
    stretches = enumerate(itertools.pairwise(bounds))
    pieces = [_piece(block, axis, lo, hi, f"{block.name_hint}_{n}") for n, (lo, hi) in stretches]
    if any(piece is None for piece in pieces):
        return None
    root = func.body.block
    new_root = s_tir.SBlock([], [], [], root.name_hint, tirx.SeqStmt(pieces))
    return func.with_body(s_tir.SBlockRealize([], True, new_root))


def concatenation_axis(func: tirx.PrimFunc) -> int | None:
    """The axis along which ``func`` does nothing but concatenate its inputs, in the order of its parameters; else None.

    Each stretch of the output along that axis must be a plain copy of the
    next input (same indices, nothing computed on it), and the stretches
    exactly as long as the inputs along the axis.
    """
    *inputs, output = func.params
    if len(inputs) < 2 or not all(isinstance(p.ty, tirx.buffer.BufferType) for p in func.params):
        return None
    if not all(isinstance(d, tirx.IntImm) for p in func.params for d in p.shape):
        return None  # a symbolic shape: the stretches are not known here
    shapes = [[int(d) for d in p.shape] for p in func.params]
    by_shape = _shape_axis(shapes[:-1], shapes[-1])
    if by_shape is None:
        return None
    sblocks = [s.block for s in iter_stmts(func.body) if isinstance(s, s_tir.SBlockRealize) and s.block.name_hint != "root"]
    if not sblocks or not all(is_spatial(b) for b in sblocks):
        return None
    try:
        final = _inline_all(func)
    except Exception:  # noqa: BLE001 - TVM refused to schedule it: not a concatenation this module reads
        return None
    cuts = _thresholds(final.block) if final is not None else {}
    if final is None or len(cuts) != 1:
        return None
    block = final.block
    (axis, thresholds), = cuts.items()
    if axis != by_shape:
        return None
    extent = int(block.iter_vars[axis].dom.extent)
    bounds = [0, *sorted(t for t in thresholds if 0 < t < extent), extent]
    if len(bounds) - 1 != len(inputs):
        return None
    for param, (lo, hi) in zip(inputs, itertools.pairwise(bounds)):
        stretch = _stretch(block, axis, lo, hi)
        if stretch is None or not _copies(stretch, param, output, axis, lo):
            return None
    return axis


def _shape_axis(inputs: list[list[int]], output: list[int]) -> int | None:
    """The one axis along which ``output``'s shape is the ``inputs``' shapes laid end to end; None if there is none."""
    if any(len(shape) != len(output) for shape in inputs):
        return None
    axes = [n for n in range(len(output)) if any(shape[n] != output[n] for shape in inputs)]
    if len(axes) != 1 or sum(shape[axes[0]] for shape in inputs) != output[axes[0]]:
        return None
    return axes[0]


def _copies(
    stretch: tuple[list[tirx.IterVar], tirx.BufferStore], source: tirx.Var, output: tirx.Var, axis: int, lo: int
) -> bool:
    """Whether the stretch's store copies ``source`` element for element into ``output`` from ``lo`` on along ``axis``."""
    iter_vars, store = stretch
    load = store.value
    if not (store.buffer.same_as(output) and isinstance(load, tvm.ir.expr.TensorLoad) and load.source.same_as(source)):
        return False
    if not len(store.indices) == len(load.indices) == len(iter_vars):
        return False
    shifted = tvm.sym.Analyzer().simplify(store.indices[axis] - iter_vars[axis].var - lo)
    return (
        all(_at(j, iv) for j, iv in zip(load.indices, iter_vars))
        and all(_at(i, iv) for n, (i, iv) in enumerate(zip(store.indices, iter_vars)) if n != axis)
        and isinstance(shifted, tirx.IntImm) and int(shifted) == 0
        and [int(d) for d in source.shape] == [int(iv.dom.extent) for iv in iter_vars]
    )


def _at(index: tirx.Expr, iv: tirx.IterVar) -> bool:
    """Whether ``index`` is the iterator ``iv`` itself (0 where its extent is 1, as the analyzer writes it)."""
    if isinstance(index, tirx.IntImm):
        return int(index) == 0 and int(iv.dom.extent) == 1
    return isinstance(index, tirx.Var) and index.same_as(iv.var)


def _inline_all(func: tirx.PrimFunc) -> s_tir.SBlockRealize | None:
    """The one block left when every other block of ``func`` is inlined into its readers, each of its
    iterators bound to a loop of its own."""
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    for block in blocks[:-1]:
        try:
            sch.compute_inline(block)
        except RuntimeError:  # TVM's ScheduleError: an output of the function, or a block that cannot inline
            return None
    last = blocks[-1]
    if len(sch.get_child_blocks(sch.get_sblock("root"))) != 1:
        return None
    realize = _realize_of(sch, last)
    if not _bound_to_own_loops(realize, [sch.get(loop) for loop in sch.get_loops(last)]):
        return None
    return realize


def _piece(block: s_tir.SBlock, axis: int, lo: int, hi: int, name: str) -> tirx.Stmt | None:
    """The loop nest writing ``block``'s output where iterator ``axis`` is in ``[lo, hi)``, its value simplified
    there; None if a test on that iterator is left (the stretch holds an input boundary after all)."""
    stretch = _stretch(block, axis, lo, hi)
    if stretch is None:
        return None
    iter_vars, body = stretch
    buffers = {r.source: r.source for r in [*block.reads, *block.writes]}
    reads, writes = s_tir.analysis.get_sblock_read_write_region(s_tir.SBlock(iter_vars, [], [], name, body), buffers)
    loops = [tirx.Var(f"{iv.var.name}_l", str(iv.var.ty)) for iv in iter_vars]
    nest: tirx.Stmt = s_tir.SBlockRealize(loops, True, s_tir.SBlock(iter_vars, reads, writes, name, body))
    for loop, iv in reversed(list(zip(loops, iter_vars))):
        nest = tirx.For(loop, iv.dom.min, iv.dom.extent, tirx.ForKind.SERIAL, nest)
    return nest


def _stretch(block: s_tir.SBlock, axis: int, lo: int, hi: int) -> tuple[list[tirx.IterVar], tirx.BufferStore] | None:
    """``block``'s iterators and store over the stretch ``[lo, hi)`` of iterator ``axis`` (which then counts from 0),
    the value simplified there; None if a test on that iterator is left."""
    extents = [hi - lo if n == axis else int(iv.dom.extent) for n, iv in enumerate(block.iter_vars)]
    iter_vars = [_iterator(iv.var.name, str(iv.dom.extent.ty), extent) for iv, extent in zip(block.iter_vars, extents)]
    analyzer = tvm.sym.Analyzer()
    for iv in iter_vars:
        analyzer.bind(iv.var, iv.dom)
    at = [iv.var + lo if n == axis else iv.var for n, iv in enumerate(iter_vars)]
    old, store = [iv.var for iv in block.iter_vars], block.body
    value = analyzer.simplify(tirx.IndexMap(old, [store.value], None).map_indices(at)[0])
    if any(identity(iter_vars[axis].var) in variable_ids(call.args[0]) for call in _if_then_else_calls(value)):
        return None
    indices = [analyzer.simplify(i) for i in tirx.IndexMap(old, list(store.indices), None).map_indices(at)]
    return iter_vars, tirx.BufferStore(store.buffer, value, indices)


def _iterator(name: str, dtype: str, extent: int) -> tirx.IterVar:
    """A spatial block iterator over ``[0, extent)``."""
    dom = tvm.ir.Range.from_min_extent(tirx.const(0, dtype), tirx.const(extent, dtype))
    return tirx.IterVar(dom, tirx.Var(name, dtype), tirx.IterVar.DataPar)


def _realize_of(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> s_tir.SBlockRealize:
    """The realize statement of ``block`` in the schedule's program."""
    target = identity(sch.get(block))
    return next(
        s for s in iter_stmts(sch.mod["main"].body)
        if isinstance(s, s_tir.SBlockRealize) and identity(s.block) == target
    )


def _bound_to_own_loops(realize: s_tir.SBlockRealize, loops: list[tirx.For]) -> bool:
    """Whether each iterator of the block is bound to its own loop, in order, over the iterator's whole domain."""
    block = realize.block
    if len(loops) != len(block.iter_vars) or not isinstance(block.body, tirx.BufferStore):
        return False
    return all(
        isinstance(value, tirx.Var) and value.same_as(loop.loop_var)
        and isinstance(iv.dom.extent, tirx.IntImm) and int(loop.extent) == int(iv.dom.extent)
        and int(iv.dom.min) == 0 == int(loop.min)
        for value, loop, iv in zip(as_list(realize.iter_values), loops, block.iter_vars)
    )


def _thresholds(block: s_tir.SBlock) -> dict[int, set[int]]:
    """For each iterator position, the constants ``t`` that an ``if_then_else`` test of the block's value
    compares it with (``t <= v``, ``v < t`` and their mirrors: the input boundaries of a concatenation)."""
    body = block.body
    if not isinstance(body, tirx.BufferStore):
        return {}
    position = {identity(iv.var): n for n, iv in enumerate(block.iter_vars)}
    found: dict[int, set[int]] = {}
    for call in _if_then_else_calls(body.value):
        test = _threshold(call.args[0])
        if test is not None and identity(test[0]) in position:
            found.setdefault(position[identity(test[0])], set()).add(test[1])
    return found


# For a test ``v OP t`` (or ``t OP v``), the first value of ``v`` on the upper side of the split.
_SPLIT_AT_VAR_LEFT = {"LT": 0, "GE": 0, "LE": 1, "GT": 1}
_SPLIT_AT_VAR_RIGHT = {"LE": 0, "GT": 0, "LT": 1, "GE": 1}


def _threshold(cond: tirx.Expr) -> tuple[tirx.Var, int] | None:
    """``(v, t)`` where ``cond`` compares a variable ``v`` with a constant and splits its range before ``t``."""
    kind = type(cond).__name__
    if kind not in _SPLIT_AT_VAR_LEFT:
        return None
    if isinstance(cond.a, tirx.Var) and isinstance(cond.b, tirx.IntImm):
        return cond.a, int(cond.b) + _SPLIT_AT_VAR_LEFT[kind]
    if isinstance(cond.a, tirx.IntImm) and isinstance(cond.b, tirx.Var):
        return cond.b, int(cond.a) + _SPLIT_AT_VAR_RIGHT[kind]
    return None


def _if_then_else_calls(expr: tirx.Expr) -> list[tvm.ir.Call]:
    """Every ``if_then_else`` call inside ``expr``."""
    calls, stack = [], [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, tvm.ir.Call) and isinstance(node.op, tvm.ir.Op) and node.op.name == _IF_THEN_ELSE:
            calls.append(node)
        for field in ("a", "b", "value", "args", "condition", "true_value", "false_value", "indices"):
            child = getattr(node, field, None)
            if isinstance(child, tirx.Expr):
                stack.append(child)
            elif child is not None and not isinstance(child, (str, int, float)) and hasattr(child, "__len__"):
                stack.extend(c for c in as_list(child) if isinstance(c, tirx.Expr))
    return calls
