"""Inline elementwise blocks into their neighbours, so that no intermediate buffer is written and read back.

Two directions, tried in this order (MetaSchedule's AutoInline is the model):

* ``compute_inline``: a spatial block (a bias add, a scale) is folded into the
  blocks that read it, its value recomputed where it is used;
* ``reverse_compute_inline``: an elementwise consumer (ReLU after a bias add, a
  cast) is folded into its only producer, whose only reader it is, so that the
  final value is written once.

Whether a primitive is legal is decided by TVM itself, on a copy of the
untraced schedule: a refused primitive never reaches the trace, and legality
depends only on the program's structure, never on sampled tile sizes, so the
recorded choice holds on every replay.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

from probtune.plugin import BlockRV, Schedule, SpaceContext, allows, is_spatial, iter_stmts
from probtune_cpu.output_reuse import loads_of

__all__ = ["AutoInline"]

_EXPR_CHILD_FIELDS = (
    "a", "b", "value", "body", "args", "condition", "true_value", "false_value", "indices", "base", "vectors",
)


def _is_spatial_function(func: tirx.PrimFunc) -> bool:
    """Whether no block of ``func`` reduces: then every value is read once per output and recomputation is cheap."""
    return all(
        is_spatial(stmt.block)
        for stmt in iter_stmts(func.body)
        if isinstance(stmt, s_tir.SBlockRealize) and stmt.block.name_hint != "root"
    )


def _calls_any(expr: tirx.Expr, op_names: Iterable[str]) -> bool:
    """Whether ``expr`` calls one of the named TIR operators anywhere inside."""
    wanted = set(op_names)
    stack: list[object] = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, tvm.ir.Call) and isinstance(node.op, tvm.ir.Op) and node.op.name in wanted:
            return True
        for field in _EXPR_CHILD_FIELDS:
            child = getattr(node, field, None)
            if isinstance(child, tirx.Expr):
                stack.append(child)
            elif isinstance(child, tvm_ffi.Array):
                stack.extend(c for c in child if isinstance(c, tirx.Expr))
    return False


def _read_at_several_places(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """Whether a consumer reads the block's output at more than one index per element it computes (a stencil, a
    resize's neighbouring rows): inlined, the block would be computed that many times over. Reads in the two
    branches of a choice (a concatenation's, a roll's) are one per element."""
    buffer = sch.get(block).writes[0].source
    for consumer in sch.get_consumers(block):
        body = sch.get(consumer).body
        if isinstance(body, tirx.BufferStore) and len(_places_per_element(body.value, buffer)) > 1:
            return True
    return False


def _places_per_element(expr: object, buffer: tirx.Buffer) -> list[TensorLoad]:
    """The loads of ``buffer`` at distinct indices that one evaluation of ``expr`` makes at most: of a choice
    (``if_then_else``, ``Select``), its condition's and its more reading branch's."""
    if isinstance(expr, tvm.ir.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "prim.if_then_else":
        condition, *branches = expr.args
    elif isinstance(expr, tirx.Select):
        condition, branches = expr.condition, [expr.true_value, expr.false_value]
    else:
        children = [getattr(expr, field, None) for field in _EXPR_CHILD_FIELDS]
        flat = [c for child in children for c in (child if isinstance(child, tvm_ffi.Array) else [child])
                if isinstance(c, tirx.Expr)]
        own = [expr] if isinstance(expr, TensorLoad) and expr.source.same_as(buffer) else []
        return _distinct(own + [load for child in flat for load in _places_per_element(child, buffer)])
    most = max((_places_per_element(branch, buffer) for branch in branches), key=len)
    return _distinct(_places_per_element(condition, buffer) + most)


def _distinct(loads: list[TensorLoad]) -> list[TensorLoad]:
    """``loads`` without repeats of an index."""
    distinct: list[TensorLoad] = []
    for load in loads:
        if not any(tvm_ffi.structural_equal(load.indices, seen.indices) for seen in distinct):
            distinct.append(load)
    return distinct


def _recomputed_if_inlined(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """Whether inlined, the block's elements would be computed more than once each: its consumers' iterations times
    their reads of it outnumber its elements (two consumers, a matrix product reading its operand once per column,
    a broadcast)."""
    elements = _iterations(sch.get(block))
    if elements is None:
        return True
    buffer = sch.get(block).writes[0].source
    computed = 0
    for consumer in sch.get_consumers(block):
        sblock = sch.get(consumer)
        iterations = _iterations(sblock, every_iterator=True)
        body = sblock.body
        if iterations is None or not isinstance(body, tirx.BufferStore):
            return True
        computed += iterations * len(loads_of(body.value, buffer))
    return computed > elements


def _iterations(sblock: s_tir.SBlock, every_iterator: bool = False) -> int | None:
    """How many elements a block writes: the product of its spatial iterators' extents, or of all of them given
    ``every_iterator`` (None if one is symbolic)."""
    total = 1
    for iv in sblock.iter_vars:
        if not every_iterator and int(iv.iter_type) != tirx.IterVar.DataPar:
            continue
        if not isinstance(iv.dom.extent, tirx.IntImm):
            return None
        total *= int(iv.dom.extent)
    return total


def _placed_with_others(raw: s_tir.Schedule, block_rv: s_tir.SBlockRV) -> bool:
    """Whether a module already computed the block in a loop nest it shares with other blocks (a GPU kernel's
    producers, in shared memory): where it runs, and that it runs, was that module's decision."""
    loops = raw.get_loops(block_rv)
    return bool(loops) and len(raw.get_child_blocks(loops[0])) > 1


@dataclass(frozen=True)
class AutoInline:
    """Inline a spatial block into its consumers, else fold it into its only producer.

    In a function with a reduction, a block whose value calls one of
    ``costly_ops`` is not inlined into its consumers, whose inner loops would
    recompute it: ``exp`` is a transcendental (softmax's is read by both the
    sum and the normalisation), ``if_then_else`` is convolution padding, a
    branch in the convolution's innermost loop (inlined padding was mostly
    slower than padding as its own pass, bench/results/NOTES.md).
    Nor is a block that a consumer reads at several places per element (a
    bilinear resize's two rows), which inlining would compute as many times,
    nor, in a function with a reduction, one that calls one of
    ``transcendental_ops`` and would be computed more than once per element
    (a recurrent cell's state, read by the next step's matrix product once
    per column and by the next cell; a squeeze-excite's per-channel sigmoid
    broadcast over the map).
    Such blocks are left to ``random-compute-location``, which may still
    sample inlining. Folding into the producer computes each value once and
    is always allowed.
    """

    name: str = "auto-inline"
    costly_ops: tuple[str, ...] = ("tirx.exp", "prim.if_then_else")
    transcendental_ops: tuple[str, ...] = (
        "tirx.exp", "tirx.exp2", "tirx.exp10", "tirx.log", "tirx.log2", "tirx.log10", "tirx.log1p", "tirx.tanh",
        "tirx.sigmoid", "tirx.erf", "tirx.pow", "tirx.sin", "tirx.cos",
    )

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> None:
        raw, block_rv = sch.tvm, sch.resolve(block)
        sblock = raw.get(block_rv)
        if len(sblock.writes) != 1 or not is_spatial(sblock) or _placed_with_others(raw, block_rv):
            return
        recompute = (
            self._cheap_to_recompute(sblock, ctx)
            and not _read_at_several_places(raw, block_rv)
            and not (self._transcendental(sblock, ctx) and _recomputed_if_inlined(raw, block_rv))
        )
        if recompute and allows(raw, lambda s: s.compute_inline(block_rv)):
            sch.compute_inline(block)
        elif self._sole_consumer(raw, block_rv) and allows(raw, lambda s: s.reverse_compute_inline(block_rv)):
            sch.reverse_compute_inline(block)

    @staticmethod
    def _sole_consumer(raw: s_tir.Schedule, block_rv: s_tir.SBlockRV) -> bool:
        """Whether the block is its one producer's only reader, and reads all of it.

        TVM 0.27 folds a split's last part into the sum they all read, and the
        other parts are left reading a buffer nothing writes; and it folds a
        crop (the first 58 of 64 channels) into its producer keeping the
        producer's iterations, which then write past the end of the crop.
        """
        producers = raw.get_producers(block_rv)
        if len(producers) != 1 or len(raw.get_consumers(producers[0])) != 1:
            return False
        return _iterations(raw.get(block_rv)) == _iterations(raw.get(producers[0]))  # None == None: TVM decides

    def _transcendental(self, sblock: s_tir.SBlock, ctx: SpaceContext) -> bool:
        """Whether the block calls one of ``transcendental_ops`` in a function with a reduction."""
        body = sblock.body
        if not isinstance(body, tirx.BufferStore) or not _calls_any(body.value, self.transcendental_ops):
            return False
        return not _is_spatial_function(ctx.workload.prim_func)

    def _cheap_to_recompute(self, sblock: s_tir.SBlock, ctx: SpaceContext) -> bool:
        body = sblock.body
        if not isinstance(body, tirx.BufferStore) or not _calls_any(body.value, self.costly_ops):
            return True
        return _is_spatial_function(ctx.workload.prim_func)
