"""Carry a model's transposes forward past the operators that do not care where an axis lies, and join them.

After the layout pass, a transpose is left wherever the model meets an
operator without a layout rule: ConvNeXt's own channels-last layer norms,
ShuffleNet's channel shuffle (a reshape, a transpose and a reshape).
Carried forward past elementwise operators, slices, concatenations and
reshapes, the layout pass's transpose meets the next one and cancels. A
transpose after a bilinear upsampling (a segmentation head's last, laid out
back for the model's output) is done before it instead, on the smaller tensor.
A model's own transpose into a resize's layout (SegFormer's tokens laid out
channels first, upsampled and concatenated before a convolution the layout
pass gives channels last) is carried past the resize, which then runs in the
transpose's input layout.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tvm
from tvm import relax

from probtune.model.concat_in_place import variable_uses
from probtune.model.legalize import TWO_PASS_LAYOUTS, in_two_passes

__all__ = ["ELEMENTWISE_BINARY", "ELEMENTWISE_UNARY", "fold_transposes", "mutated", "reshape_groups", "static_shape", "transposed_elements"]

ELEMENTWISE_BINARY = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum",
                      "relax.minimum", "relax.power")
"""Elementwise operators of two tensors: a transpose or reshape of both operands is one of their result."""

ELEMENTWISE_UNARY = ("relax.astype", "relax.nn.relu", "relax.sigmoid", "relax.tanh", "relax.nn.silu", "relax.nn.gelu",
                     "relax.nn.gelu_tanh", "relax.exp", "relax.sqrt", "relax.rsqrt", "relax.negative", "relax.abs",
                     "relax.erf", "relax.clip")
"""Elementwise operators of one tensor with no axis attribute: they commute with a transpose or reshape."""

Groups = list[tuple[list[int], list[int]]]


def fold_transposes(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its transposes carried forward and joined.

    Past binary elementwise operators a transpose is always carried (a
    model's channels-last layer norm, ConvNeXt's, then cancels with the
    layout pass's transposes). Past the other operators only where that
    moves fewer elements in all (:func:`transposed_elements`): a transpose
    carried past a slice with other readers, or past a reshape that merges
    axes it has reordered (part of it is then done first), pays only where
    it meets another transpose.
    """
    variants = [mutated(mod, _FoldTransposes(mod, wide, split, resized)) for wide, split, resized in FOLDS]
    return min(variants, key=transposed_elements)  # the first of the cheapest: the narrower rewrite on a tie


FOLDS = ((False, False, False), (True, False, False), (True, True, False), (True, True, True))
"""The rewrites tried, narrowest first: ``(wide, split, resized)`` of :class:`_FoldTransposes`."""


def mutated(mod: tvm.IRModule, mutator: relax.PyExprMutator) -> tvm.IRModule:
    """``mod`` with ``mutator`` applied to its Relax functions and what they no longer use removed; ``mod`` itself
    where the mutator changed nothing (it counts its changes in ``changed``)."""
    functions = dict(mod.functions)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            functions[gv] = mutator.visit_expr(func)
    if not mutator.changed:
        return mod
    return relax.transform.DeadCodeElimination()(tvm.IRModule(functions, attrs=mod.attrs))


def transposed_elements(mod: tvm.IRModule) -> int:
    """Elements moved by the transposes of ``mod``'s Relax functions that are not folded away as constants."""
    total = 0
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        constant: set[relax.Var] = set()
        for block in func.body.blocks:
            for binding in block.bindings:
                value = binding.value
                if _of_constants(value, constant):
                    constant.add(binding.var)
                elif isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.permute_dims":
                    total += _elements(value.ty.shape)
    return total


def _of_constants(value: relax.Expr, constant: set[relax.Var]) -> bool:
    """Whether ``value`` is a constant or an operator on constants (folded before the model runs)."""
    if isinstance(value, tvm.ir.expr.Constant):
        return True
    if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
        return False
    tensors = [arg for arg in value.args if isinstance(arg, (relax.Var, tvm.ir.expr.Constant))]
    return bool(tensors) and all(isinstance(a, tvm.ir.expr.Constant) or a in constant for a in tensors)


def reshape_groups(before: Sequence[int], after: Sequence[int]) -> Groups | None:
    """A reshape as consecutive groups of axes, ``(axes before, axes after)`` of equal sizes, each as small as it can
    be; None if the sizes do not match."""
    groups: Groups = []
    i = j = 0
    while i < len(before) or j < len(after):
        left, right = [i], [j]
        if i >= len(before) or j >= len(after):  # only axes of size 1 may be left: they join the last group
            rest_a, rest_b = list(range(i, len(before))), list(range(j, len(after)))
            if not groups or any(before[k] != 1 for k in rest_a) or any(after[k] != 1 for k in rest_b):
                return None
            groups[-1][0].extend(rest_a)
            groups[-1][1].extend(rest_b)
            break
        size_a, size_b = before[i], after[j]
        while size_a != size_b:
            if size_a < size_b and left[-1] + 1 < len(before):
                left.append(left[-1] + 1)
                size_a *= before[left[-1]]
            elif size_b < size_a and right[-1] + 1 < len(after):
                right.append(right[-1] + 1)
                size_b *= after[right[-1]]
            else:
                return None
        groups.append((left, right))
        i, j = left[-1] + 1, right[-1] + 1
    return groups


@relax.expr_functor.mutator
class _FoldTransposes(relax.PyExprMutator):  # type: ignore[misc]
    """Joins ``permute_dims(permute_dims(x, p), q)`` into one (none for the identity), and writes an operator on
    transposed operands as the transpose of the operator on the untransposed ones: binary elementwise operators
    (a constant operand is laid out back), and if ``wide``, unary elementwise ones, slices, concatenations and
    reshapes: with ``split``, also a reshape that merges axes the transpose has reordered; with ``resized``, also
    resizes (carried past an upsampling, a transpose moves more elements, so this pays only where it meets another)."""

    def __init__(self, mod: tvm.IRModule, wide: bool, split: bool, resized: bool = False) -> None:
        super().__init__(mod)
        self.permute = tvm.ir.Op.get("relax.permute_dims")
        self.split = split
        self.rules = {"relax.permute_dims": self.join, **{name: self.carry for name in ELEMENTWISE_BINARY}}
        if wide:
            self.rules.update({name: self.carry_unary for name in ELEMENTWISE_UNARY})
            self.rules.update({"relax.strided_slice": self.carry_slice, "relax.concat": self.carry_concat,
                               "relax.reshape": self.carry_reshape})
        if resized:
            self.rules["relax.image.resize2d"] = self.carry_resize
        self.sunk = _sinkable(mod)
        self.changed = 0

    def axes(self, call: relax.Call) -> list[int]:
        rank = len(call.args[0].ty.shape)
        return list(range(rank))[::-1] if call.attrs.axes is None else [int(a) for a in call.attrs.axes]

    def transposed(self, expr: relax.Expr) -> relax.Call | None:
        """The ``permute_dims`` call ``expr`` is bound to, if it is one."""
        bound = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        return bound if isinstance(bound, relax.Call) and bound.op.same_as(self.permute) else None

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        resize = self.sunk.get(call)
        if resize is not None:
            return self.sink(call, resize)
        call = super().visit_call_(call)
        rule = self.rules.get(call.op.name) if isinstance(call.op, tvm.ir.Op) else None
        return call if rule is None else rule(call)

    def moved(self, inner: relax.Expr, axes: list[int]) -> relax.Expr:
        """``inner`` emitted, then transposed by ``axes``: what replaces the call a transpose was carried past."""
        self.changed += 1
        return relax.op.permute_dims(self.builder_.emit(inner), axes)

    def join(self, call: relax.Call) -> relax.Expr:
        if self.axes(call) == list(range(len(call.args[0].ty.shape))):  # ConvertLayout leaves identities too
            self.changed += 1
            return call.args[0]
        inner = self.transposed(call.args[0])
        if inner is None:
            return call
        first, second = self.axes(inner), self.axes(call)
        combined = [first[axis] for axis in second]
        self.changed += 1
        if combined == list(range(len(combined))):
            return inner.args[0]
        return relax.op.permute_dims(inner.args[0], combined)

    def sink(self, call: relax.Call, resize: relax.Call) -> relax.Expr:
        """``permute_dims(resize2d(x))`` as the resize, in the permuted layout, of ``x`` transposed (joined with a
        transpose ``x`` may come from)."""
        axes = self.axes(call)
        source = self.join(relax.op.permute_dims(self.visit_expr(resize.args[0]), axes))
        if not isinstance(source, relax.Var):
            source = self.builder_.emit(source)
        self.changed += 1
        return _resize_in(source, resize, "".join(resize.attrs.layout[a] for a in axes))

    def carry_resize(self, call: relax.Call) -> relax.Expr:
        """``resize2d(permute_dims(x, p))`` as the resize of ``x`` in its own layout (one a resize is lowered in
        two passes in), transposed by ``p``."""
        found = self.transposed(call.args[0])
        layout = str(call.attrs.layout)
        if found is None or len(found.ty.shape) != len(layout):
            return call
        axes = self.axes(found)
        own = [""] * len(axes)
        for position, axis in enumerate(axes):
            own[axis] = layout[position]
        if "".join(own) not in TWO_PASS_LAYOUTS:
            return call
        return self.moved(_resize_in(found.args[0], call, "".join(own)), axes)

    def carry(self, call: relax.Call) -> relax.Expr:
        """``op(a, b)`` with a transposed operand, as the transpose of ``op`` on the untransposed ones; else as it is."""
        a, b = call.args
        left, right = self.transposed(a), self.transposed(b)
        axes = self.axes(left) if left is not None else self.axes(right) if right is not None else None
        if axes is None or call.ty.shape is None or len(call.ty.shape) != len(axes):
            return call
        operands = [self.untransposed(arg, found, axes) for arg, found in ((a, left), (b, right))]
        if any(operand is None for operand in operands):
            return call
        return self.moved(relax.Call(call.op, operands, call.attrs), axes)

    def untransposed(self, arg: relax.Expr, found: relax.Call | None, axes: list[int]) -> relax.Expr | None:
        """``arg`` as the operand of the untransposed operator: its transpose's input, or a constant laid out back."""
        if found is not None:
            return found.args[0] if self.axes(found) == axes else None
        if not isinstance(arg, tvm.ir.expr.Constant):
            return None
        value = arg.value.numpy()
        if value.ndim > len(axes):
            return None
        full = value.reshape((1,) * (len(axes) - value.ndim) + value.shape)
        return relax.const(np.ascontiguousarray(full.transpose(np.argsort(axes))), str(value.dtype))

    def carry_unary(self, call: relax.Call) -> relax.Expr:
        found = self.transposed(call.args[0])
        if found is None:
            return call
        return self.moved(relax.Call(call.op, [found.args[0], *call.args[1:]], call.attrs), self.axes(found))

    def carry_slice(self, call: relax.Call) -> relax.Expr:
        found = self.transposed(call.args[0])
        if found is None or not isinstance(call.args[1], relax.Tuple):
            return call
        axes = self.axes(found)
        sliced = [axes[int(getattr(field, "value", field))] for field in call.args[1].fields]
        begin, end, *strides = call.args[2:]
        inner = relax.op.strided_slice(found.args[0], sliced, begin, end, strides[0] if strides else None,
                                       bool(call.attrs.assume_inbound))
        return self.moved(inner, axes)

    def carry_concat(self, call: relax.Call) -> relax.Expr:
        parts = call.args[0]
        found = [self.transposed(part) for part in parts.fields] if isinstance(parts, relax.Tuple) else [None]
        if any(f is None for f in found) or call.attrs.axis is None:
            return call
        axes = self.axes(found[0])  # type: ignore[arg-type]
        if any(self.axes(f) != axes for f in found):  # type: ignore[arg-type]
            return call
        joined = relax.op.concat([f.args[0] for f in found], axis=axes[int(call.attrs.axis)])  # type: ignore[union-attr]
        return self.moved(joined, axes)

    def carry_reshape(self, call: relax.Call) -> relax.Expr:
        """``reshape(permute_dims(x, p))`` as a reshape of ``x`` (after what of ``p`` must be done first), transposed."""
        found = self.transposed(call.args[0])
        before, shape = (static_shape(found.ty.shape), static_shape(call.ty.shape)) if found is not None else (None, None)
        groups = reshape_groups(before, shape) if before is not None and shape is not None else None
        if found is None or shape is None or groups is None:
            return call
        source, axes = found.args[0], self.axes(found)
        sources = [[axes[i] for i in before] for before, _ in groups]
        first = [axis for group in sorted(sources, key=min) for axis in group]  # each group's axes together, in order
        if first != list(range(len(first))):
            if not self.split:
                return call
            source = self.builder_.emit(relax.op.permute_dims(source, first))
        order = sorted(range(len(groups)), key=lambda g: min(sources[g]))  # the groups as they lie in ``source``
        reshaped: list[int] = []
        start: dict[int, int] = {}
        for g in order:
            start[g] = len(reshaped)
            reshaped.extend(shape[k] for k in groups[g][1])
        moved = [start[g] + k for g in range(len(groups)) for k in range(len(groups[g][1]))]
        return self.moved(relax.op.reshape(source, reshaped), moved)


def _resize_in(source: relax.Expr, resize: relax.Call, layout: str) -> relax.Call:
    """``resize`` of ``source``, laid out in ``layout``: the same sizes, method and coordinates."""
    attrs = resize.attrs
    return relax.op.image.resize2d(
        source, resize.args[1], [float(v) for v in attrs.roi], layout, attrs.method,
        attrs.coordinate_transformation_mode, attrs.rounding_method, float(attrs.cubic_alpha), int(attrs.cubic_exclude),
        float(attrs.extrapolation_value), attrs.out_dtype or None)


def _sinkable(mod: tvm.IRModule) -> dict[relax.Call, relax.Call]:
    """The transposes of ``mod`` that are better done before the resize they transpose, each with that resize: its
    only use, into a layout a resize has, and a resize lowered in two passes (an upsampling: fewer elements before
    it than after), whose pass along the height reads and writes whole rows in either layout."""
    found: dict[relax.Call, relax.Call] = {}
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        bindings = [b for block in func.body.blocks for b in block.bindings]
        uses = variable_uses(func, bindings)
        bound = {b.var: b.value for b in bindings}
        for value in bound.values():
            if not (isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.permute_dims"):
                continue
            resize = bound.get(value.args[0])
            if not (isinstance(resize, relax.Call) and getattr(resize.op, "name", "") == "relax.image.resize2d"
                    and in_two_passes(resize)):
                continue
            layout = str(resize.attrs.layout)
            axes = [int(a) for a in value.attrs.axes] if value.attrs.axes is not None else [3, 2, 1, 0]
            permuted = "".join(layout[a] for a in axes) if len(layout) == len(axes) else ""
            smaller = _elements(resize.args[0].ty.shape) < _elements(resize.ty.shape)
            if uses.get(value.args[0], 0) == 1 and permuted in TWO_PASS_LAYOUTS and smaller:
                found[value] = resize
    return found


def _elements(shape: relax.Expr | None) -> int:
    """The elements of a tensor of ``shape``, a symbolic dimension (a dynamic batch) counted as 1."""
    dims = [int(d) if isinstance(d, tvm.tirx.IntImm) else 1 for d in shape] if shape is not None else []
    return int(np.prod(dims))


def static_shape(shape: relax.Expr | None) -> list[int] | None:
    """``shape`` as integers, or None if it is unknown or symbolic."""
    if shape is None or not all(isinstance(d, tvm.tirx.IntImm) for d in shape):
        return None
    return [int(d) for d in shape]
