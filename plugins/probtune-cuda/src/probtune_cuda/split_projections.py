"""Graph rewrite ``split-projections``: a product whose features are split apart as one product per part.

GPT-2 and other decoders project the tokens to queries, keys and values with
one product (``features x 3 * features``), add the bias and split the result
three ways along the features: a kernel for the split, and the parts copied
once more before attention reads them. With the weight's and the bias's
columns sliced per part (constants, sliced at compile time), each part is a
product of its own that ``head-projections`` then writes per head, as it does
a model that projects them apart. A reshape between the product and the split
that keeps the features (tokens given a batch axis) moves to the product's
input.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant

from probtune.plugin import TargetSpec, mutated, static_shape, variable_uses
from probtune_cuda.index_trace import split_bounds

__all__ = ["SplitProjections"]

_ELEMENTWISE = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")


def _name(expr: Any) -> str:
    return str(getattr(getattr(expr, "op", None), "name", ""))


class _Plan:
    """A split product: its input (reshaped as the split's input is), weight, the steps after it, and the parts'
    feature bounds."""

    def __init__(self, x: relax.Expr, rows: list[int] | None, weight: np.ndarray, steps: list[relax.Call],
                 bounds: list[tuple[int, int]], out_dtype: Any) -> None:
        self.x, self.rows, self.weight, self.steps, self.bounds, self.out_dtype = x, rows, weight, steps, bounds, out_dtype


@relax.expr_functor.mutator
class _SplitProjections(relax.PyExprMutator):  # type: ignore[misc]
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.plans: dict[relax.Expr, _Plan] = {}
        self.parts: dict[tuple[relax.Expr, int], relax.Expr] = {}
        self.changed = 0

    def visit_function_(self, func: relax.Function) -> relax.Expr:
        bindings = [b for block in func.body.blocks for b in block.bindings]
        bound, uses = {b.var: b.value for b in bindings}, variable_uses(func, bindings)
        readers = _tuple_readers(bindings)
        self.plans = {}
        for binding in bindings:
            if _name(binding.value) == "relax.split" and readers.get(binding.var) == uses[binding.var]:
                plan = _plan(binding.value, bound, uses)
                if plan is not None:
                    self.plans[binding.var] = plan
        return super().visit_function_(func)

    def visit_tuple_getitem_(self, op: relax.TupleGetItem) -> relax.Expr:
        plan = self.plans.get(op.tuple_value)
        if plan is None:
            return super().visit_tuple_getitem_(op)
        key = (op.tuple_value, int(op.index))
        if key not in self.parts:
            self.parts[key] = self.builder_.emit(self.part(plan, *plan.bounds[int(op.index)]))
            self.changed += 1
        return self.parts[key]

    def part(self, plan: _Plan, low: int, high: int) -> relax.Expr:
        """Features ``low:high`` of the split's input, computed by a product of their own."""
        x = self.visit_expr(plan.x)
        if plan.rows is not None:
            x = self.builder_.emit(relax.op.reshape(x, [*plan.rows, plan.weight.shape[0]]))
        weight = relax.const(np.ascontiguousarray(plan.weight[:, low:high]), str(plan.weight.dtype))
        value: relax.Expr = relax.op.matmul(x, weight, out_dtype=plan.out_dtype)
        for step in plan.steps:
            operand = step.args[1].value.numpy()
            if operand.ndim and operand.shape[-1] != 1:
                operand = operand[..., low:high]
            value = relax.Call(step.op, [self.builder_.emit(value), relax.const(np.ascontiguousarray(operand))],
                               step.attrs)
        return value


def _tuple_readers(bindings: list[relax.Binding]) -> dict[relax.Expr, int]:
    """How many bindings read each tuple variable by taking one of its fields."""
    readers: dict[relax.Expr, int] = {}
    for binding in bindings:
        if isinstance(binding.value, relax.TupleGetItem):
            readers[binding.value.tuple_value] = readers.get(binding.value.tuple_value, 0) + 1
    return readers


def _plan(split: relax.Call, bound: dict, uses: Any) -> _Plan | None:
    """How to compute each part of ``split`` by a product of its own; None unless it splits the last axis of a
    product by a constant, followed by elementwise steps with constants and a reshape keeping the features, each
    read by the next alone."""
    shape = static_shape(split.args[0].ty.shape)
    if shape is None or int(split.attrs.axis) % len(shape) != len(shape) - 1:
        return None
    value, rows = split.args[0], None
    call: Any = bound.get(value) if uses[value] == 1 else None
    if _name(call) == "relax.reshape":
        source = static_shape(call.args[0].ty.shape)
        if source is None or source[-1] != shape[-1] or len(source) != 2:
            return None
        rows, value = shape[:-1], call.args[0]
        call = bound.get(value) if uses[value] == 1 else None
    steps: list[relax.Call] = []
    while _name(call) in _ELEMENTWISE and isinstance(call.args[1], Constant) and _per_feature(call.args[1], shape[-1]):
        steps.insert(0, call)
        value = call.args[0]
        call = bound.get(value) if uses[value] == 1 else None
    if _name(call) != "relax.matmul" or not isinstance(call.args[1], Constant) or call.args[1].value.numpy().ndim != 2:
        return None
    return _Plan(call.args[0], rows, call.args[1].value.numpy(), steps, split_bounds(split, shape[-1]), call.attrs.out_dtype)


def _per_feature(constant: Constant, features: int) -> bool:
    """Whether the constant broadcasts over everything but the features: a scalar, or ones but its last axis."""
    shape = constant.value.numpy().shape
    return all(d == 1 for d in shape[:-1]) and (not shape or shape[-1] in (1, features))


class SplitProjections:
    """Graph rewrite ``split-projections``: a product split along its features as one product per part (module
    docstring)."""

    name = "split-projections"

    def rewrite(self, mod: tvm.IRModule, target: TargetSpec) -> tuple[tvm.IRModule, int]:
        folded = relax.transform.FoldConstant()(mod)  # weights the model transposes become constants
        mutator = _SplitProjections(folded)
        rewritten = mutated(folded, mutator)
        if not mutator.changed:
            return mod, 0
        return relax.transform.CanonicalizeBindings()(rewritten), mutator.changed
