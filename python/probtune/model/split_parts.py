"""Each part of a split taken as a slice of its own, before a model is fused into tasks.

A split is one operator with a tuple of results: TVM lowers it to one
function that copies every part, a loop nest (on a GPU, a kernel) per part,
and fusion joins it to none of its readers. MixNet's mixed convolutions split
the channels into groups, each convolved with its own window, so each group
is copied before its convolution reads it. As a slice per part, a part read
by elementwise operators is fused into them, and one that products read is
taken inside each product's function (:mod:`probtune.model.part_reads`),
where the product's space reads it in place: no copy.
"""

from __future__ import annotations

import itertools

import tvm
from tvm import relax

from probtune.model.concat_in_place import variable_uses
from probtune.model.transposes import mutated, static_shape

__all__ = ["SLICED_SPLITS", "slice_splits", "split_bounds"]

SLICED_SPLITS = "sliced-splits"
"""The name under which the fused module counts the splits whose parts became slices."""


def split_bounds(call: relax.Call) -> tuple[int, list[tuple[int, int]]] | None:
    """A split's axis and each part's ``[begin, end)`` along it, as TVM cuts (``n`` sections of ``ceil(length / n)``,
    the last shorter); None where the input's shape is not static."""
    shape = static_shape(call.args[0].ty.shape)
    if shape is None:
        return None
    axis = int(call.attrs.axis) % len(shape)
    extent, sections = shape[axis], call.attrs.indices_or_sections
    if isinstance(sections, tvm.tirx.IntImm):
        step = -(-extent // int(sections))
        cuts = list(range(step, extent, step))
    else:
        cuts = [min(int(index), extent) for index in sections]
    edges = [0, *cuts, extent]
    return axis, list(itertools.pairwise(edges))


@relax.expr_functor.mutator
class _SliceSplits(relax.PyExprMutator):  # type: ignore[misc]
    """Binds each item of a split in ``splits`` to a slice of the split's input."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.splits: dict[relax.Var, relax.Call] = {}
        self.changed = 0

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if binding.var in self.splits:
            return  # its items are sliced below; nothing else reads it
        value = binding.value
        if isinstance(value, relax.TupleGetItem) and value.tuple_value in self.splits:
            call = self.splits[value.tuple_value]
            axis, bounds = split_bounds(call)  # type: ignore[misc]
            begin, end = bounds[value.index]
            part = relax.op.strided_slice(self.visit_expr(call.args[0]), axes=[axis], begin=[begin], end=[end])
            self.set_var_remap(binding.var, self.builder_.emit(part, str(binding.var.name)))
            return
        super().visit_var_binding_(binding)


def _splits(func: relax.Function) -> dict[relax.Var, relax.Call]:
    """The splits of static shape in ``func`` whose tuple nothing reads but its items."""
    split = tvm.ir.Op.get("relax.split")
    bindings = [b for block in func.body.blocks for b in block.bindings]
    uses = variable_uses(func, bindings)
    found = {b.var: b.value for b in bindings
             if isinstance(b.value, relax.Call) and b.value.op.same_as(split) and split_bounds(b.value) is not None}
    items: dict[relax.Var, int] = {}
    for b in bindings:
        if isinstance(b.value, relax.TupleGetItem) and b.value.tuple_value in found:
            items[b.value.tuple_value] = items.get(b.value.tuple_value, 0) + 1
    return {var: call for var, call in found.items() if items.get(var, 0) == uses[var]}


def slice_splits(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` with the parts of its splits taken as slices (where only the parts are read); how many splits."""
    mutator = _SliceSplits(mod)
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            found = _splits(func)
            mutator.splits.update(found)
            mutator.changed += len(found)
    return mutated(mod, mutator), mutator.changed
