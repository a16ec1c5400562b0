"""Graph rewrite ``packed-projections``: attention's per-head projections of the same tokens computed as one product.

After ``head-projections`` the queries, keys and values are three batched
products of the same tokens by weights laid out by head, each with its own
bias and cast: three kernels, each with too few tiles to fill a large GPU at
a small batch (BERT-base at batch one: 12 heads x 128 tokens x 64 per
projection). Products that read the same tokens, with weights of one shape
and the same steps after them (operators with a constant, casts), are
stacked into one with the weights and constants stacked along a new leading
axis: (parts, batch, heads, tokens, width). Each reader takes its part
(``part``, a copy that fusion computes inside the product that reads it:
:mod:`probtune.model.part_reads`), so one kernel writes all three.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import cast

import numpy as np
import tvm
from tvm import relax, te
from tvm.ir.expr import Constant

from probtune.plugin import ELEMENTWISE_BINARY, ELEMENTWISE_UNARY, TargetSpec, static_shape, variable_uses
from probtune_cuda.index_trace import op_name

__all__ = ["PackedProjections"]


@dataclass(frozen=True)
class _Part:
    """A product of tokens by a constant per-head weight and the steps after it, each the only reader of the last."""

    product: relax.VarBinding
    steps: tuple[relax.VarBinding, ...]

    @property
    def end(self) -> relax.Var:
        return (self.steps[-1] if self.steps else self.product).var

    @property
    def weight(self) -> np.ndarray:
        """The weight as (heads, features, width)."""
        weight = self.product.value.args[1].value.numpy()
        return weight.reshape(weight.shape[-3:])


def _per_head_product(value: relax.Expr) -> bool:
    """Whether ``value`` is ``matmul(tokens, weight)``: tokens (batch, 1, tokens, features), a constant weight (heads,
    features, width), with a leading axis of one or not."""
    if op_name(value) != "relax.matmul" or not isinstance(value.args[1], Constant):
        return False
    tokens = static_shape(getattr(value.args[0].ty, "shape", None))
    weight = value.args[1].value.numpy().shape
    return tokens is not None and len(tokens) == 4 and tokens[1] == 1 and len(weight) in (3, 4) and weight[:-3] in (
        (), (1,))


def _step(value: relax.Expr, previous: relax.Var) -> bool:
    """Whether ``value`` is an elementwise operator of ``previous`` alone, or with a constant second operand."""
    name = op_name(value)
    if not value.args or not value.args[0].same_as(previous):
        return False
    if name in ELEMENTWISE_UNARY:
        return True
    return name in ELEMENTWISE_BINARY and len(value.args) == 2 and isinstance(value.args[1], Constant)


def _constant(value: relax.Expr) -> np.ndarray | None:
    return value.args[1].value.numpy() if len(value.args) == 2 and isinstance(value.args[1], Constant) else None


def _unreshaped(tokens: relax.Expr, made: relax.Expr | None) -> relax.Expr:
    """What ``tokens`` reshapes (``made`` is its value), or ``tokens`` itself: the stacked product reshapes once."""
    return made.args[0] if made is not None and op_name(made) == "relax.reshape" else tokens


def _padded(array: np.ndarray) -> np.ndarray:
    """A constant of a step, with leading axes of one up to the four of the products' results."""
    return array.reshape((1,) * (4 - array.ndim) + array.shape)


def _signature(part: _Part, bound: dict[relax.Var, relax.Expr]) -> tuple[object, ...]:
    """What parts must share to be stacked: the tokens they read, the weight's shape and type, and their steps."""
    tokens = part.product.value.args[0]
    read = _unreshaped(tokens, bound.get(tokens))
    steps = []
    for step in part.steps:
        constant = _constant(step.value)
        shape = None if constant is None else (_padded(constant).shape, str(constant.dtype))
        steps.append((op_name(step.value), str(step.value.attrs) if step.value.attrs else "", shape))
    weight = part.weight
    return (read, tuple(static_shape(tokens.ty.shape) or ()), weight.shape, str(weight.dtype),
            _out_dtype(part.product.value), tuple(steps))


def packed_groups(func: relax.Function) -> list[list[_Part]]:
    """Groups of two or more per-head products that read the same tokens and are followed by the same steps."""
    bindings = [b for block in func.body.blocks for b in block.bindings]
    bound, uses = {b.var: b.value for b in bindings}, variable_uses(func, bindings)
    readers: dict[relax.Var, list[relax.VarBinding]] = defaultdict(list)
    for binding in bindings:
        if isinstance(binding.value, relax.Call):
            for arg in binding.value.args:
                if isinstance(arg, relax.Var):
                    readers[arg].append(binding)
    groups: dict[tuple[object, ...], list[_Part]] = defaultdict(list)
    for binding in bindings:
        if not _per_head_product(binding.value):
            continue
        steps, last = [], binding.var
        while uses[last] == 1 and len(readers[last]) == 1 and _step(readers[last][0].value, last):
            steps.append(readers[last][0])
            last = readers[last][0].var
        part = _Part(binding, tuple(steps))
        groups[_signature(part, bound)].append(part)
    return [parts for parts in groups.values() if len(parts) > 1]


@relax.expr_functor.mutator
class _PackedProjections(relax.PyExprMutator):  # type: ignore[misc]
    """Emits each group's stacked product where its first product was, and has each part's readers read its part."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.first: dict[relax.Var, list[_Part]] = {}  # a group's first product -> its parts
        self.replaced: set[relax.Var] = set()  # every part's product and steps
        self.changed = 0

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        parts = self.first.get(binding.var)
        if parts is None:
            if binding.var not in self.replaced:
                super().visit_var_binding_(binding)
            return
        value = self._stacked(parts)
        for index, part in enumerate(parts):
            self.set_var_remap(part.end, self.builder_.emit_te(_part, value, index, primfunc_name_hint="part"))
        self.changed += len(parts)

    def _stacked(self, parts: list[_Part]) -> relax.Expr:
        """The parts' product with their weights stacked, and their steps with their constants stacked."""
        product = parts[0].product.value
        tokens = product.args[0]
        batch, _, rows, features = cast(list[int], static_shape(tokens.ty.shape))  # static: _per_head_product
        read = _unreshaped(tokens, self.lookup_binding(tokens) if isinstance(tokens, relax.Var) else None)
        source = self.builder_.emit(relax.op.reshape(self.visit_expr(read), (1, batch, 1, rows, features)))
        weights = relax.const(np.stack([part.weight for part in parts])[:, None])
        value = self.builder_.emit(relax.op.matmul(source, weights, out_dtype=_out_dtype(product)))
        for index, step in enumerate(parts[0].steps):
            call = step.value
            constants = [_constant(part.steps[index].value) for part in parts]
            operands = list(call.args[1:])
            if all(constant is not None for constant in constants):
                operands = [relax.const(np.stack([_padded(c) for c in constants if c is not None]))]
            value = self.builder_.emit(relax.Call(call.op, [value, *operands], call.attrs))
        return value


def _out_dtype(product: relax.Call) -> str | None:
    """The type a product sums into, None where it names none (its operands' type)."""
    dtype = product.attrs.out_dtype
    return None if dtype is None or str(dtype) in ("", "None", "void") else str(dtype)


def _part(stacked: te.Tensor, index: int) -> te.Tensor:
    """Part ``index`` of the stacked parts (its leading axis)."""
    return te.compute(stacked.shape[1:], lambda *i: stacked(index, *i), name="part")


class PackedProjections:
    """Graph rewrite ``packed-projections``: per-head products of the same tokens stacked into one (module docstring)."""

    name = "packed-projections"

    def rewrite(self, mod: tvm.IRModule, target: TargetSpec) -> tuple[tvm.IRModule, int]:
        """``mod`` with its per-head projections of the same tokens stacked, and how many products were."""
        mutator = _PackedProjections(mod)
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                groups = packed_groups(func)
                mutator.first = {min(parts, key=lambda p: _position(func, p)).product.var: parts for parts in groups}
                mutator.replaced = {b.var for parts in groups for p in parts for b in (p.product, *p.steps)}
                mutator.builder_.update_func(gvar, mutator.visit_expr(func))
        if not mutator.changed:
            return mod, 0
        return relax.transform.DeadCodeElimination()(mutator.builder_.get()), mutator.changed


def _position(func: relax.Function, part: _Part) -> int:
    bindings = [b.var for block in func.body.blocks for b in block.bindings]
    return next(i for i, var in enumerate(bindings) if var.same_as(part.product.var))
