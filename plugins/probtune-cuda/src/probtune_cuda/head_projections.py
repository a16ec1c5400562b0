"""Graph rewrite ``head-projections``: attention's projections read and write heads as attention lays them out.

Exported transformers project the tokens to queries, keys and values with
one 2-D matrix product each (tokens x features), add the bias, reshape the
features into heads and transpose the heads before the tokens: a kernel per
transpose, which moves every value once more. With its weight's columns
grouped by head (a constant, laid out at compile time), the projection is a
batched product that writes each head's tokens where the attention reads
them. The keys, which attention reads transposed, come out the same way and
their transpose is folded into the product that reads them (TVM's
``FuseTransposeMatmul``). The heads' outputs are transposed back and merged
into features for the output projection; that product instead sums over
heads and their width at once, reading the heads where they lie (its
weight's rows grouped by head). One kernel per projection, none to transpose.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import tvm
from tvm import relax, te
from tvm.ir.expr import Constant

from probtune.plugin import TargetSpec, static_shape, variable_uses

__all__ = ["HeadProjections"]

_HEADS_FIRST = [0, 2, 1, 3]  # (batch, tokens, heads, width) -> (batch, heads, tokens, width)
_HEADS_FIRST_TRANSPOSED = [0, 2, 3, 1]  # -> (batch, heads, width, tokens): keys as attention reads them
_ELEMENTWISE = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")


def _name(call: relax.Call | None) -> str:
    return "" if call is None else str(getattr(call.op, "name", ""))


def _uses(mod: tvm.IRModule) -> Counter[relax.Expr]:
    """How many times each variable of ``mod``'s Relax functions is read (by a binding, or as a result)."""
    uses: Counter[relax.Expr] = Counter()
    for func in mod.functions.values():
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            uses.update(variable_uses(func, [b for block in func.body.blocks for b in block.bindings]))
    return uses


@relax.expr_functor.mutator
class _HeadProjections(relax.PyExprMutator):  # type: ignore[misc]
    """Writes ``permute_dims(reshape(chain(matmul(x, W))))`` as the chain of a batched product with the weight's columns
    grouped by head, where ``W`` is a constant and the chain's casts and constant operands apply per feature, and
    ``matmul(reshape(permute_dims(heads)), W)`` as a product over heads and width."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.uses = _uses(mod)
        self.changed = 0

    def bound(self, expr: relax.Expr) -> relax.Call | None:
        """The call a variable read once is bound to; None for anything else."""
        if not isinstance(expr, relax.Var) or self.uses[expr] != 1:
            return None
        value = self.lookup_binding(expr)
        return value if isinstance(value, relax.Call) else None

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if _name(call) == "relax.matmul":
            return self.merged_heads(call)
        if _name(call) != "relax.permute_dims" or call.attrs.axes is None:
            return call
        axes = [int(a) for a in call.attrs.axes]
        reshape = self.bound(call.args[0])
        if axes not in (_HEADS_FIRST, _HEADS_FIRST_TRANSPOSED) or reshape is None or _name(reshape) != "relax.reshape":
            return call
        split = static_shape(reshape.ty.shape)
        found = self.chain(reshape.args[0])
        if split is None or found is None:
            return call
        product, steps = found
        heads = self.by_head(product, steps, split)
        if heads is None:
            return call
        self.changed += 1
        return heads if axes == _HEADS_FIRST else relax.op.permute_dims(self.builder_.emit(heads), [0, 1, 3, 2])

    def chain(self, value: relax.Expr) -> tuple[relax.Call, list[relax.Call]] | None:
        """The product ``value`` is computed from by casts and binary operators with a constant, with those steps
        (the product's first); None if it is not."""
        steps: list[relax.Call] = []
        call = self.bound(value)
        while call is not None and _name(call) in ("relax.astype", *_ELEMENTWISE):
            if _name(call) != "relax.astype" and not isinstance(call.args[1], Constant):
                return None
            steps.insert(0, call)
            call = self.bound(call.args[0])
        if call is None or _name(call) != "relax.matmul" or not isinstance(call.args[1], Constant):
            return None
        return call, steps

    def by_head(self, product: relax.Call, steps: list[relax.Call], split: list[int]) -> relax.Expr | None:
        """The steps after ``product``, on the batched product per head: (batch, heads, tokens, width)."""
        x, weight = product.args[0], product.args[1].value.numpy()
        tokens_shape = static_shape(x.ty.shape)
        if len(split) != 4 or weight.ndim != 2 or tokens_shape is None or len(tokens_shape) not in (2, 3):
            return None
        batch, tokens, heads, width = split
        if tokens_shape[-2:] != [tokens, weight.shape[0]] or weight.shape[1] != heads * width:
            return None
        if (len(tokens_shape) == 3 and tokens_shape[0] != batch) or (len(tokens_shape) == 2 and batch != 1):
            return None
        operands = {n: _per_head(step.args[1], heads, width) for n, step in enumerate(steps) if _name(step) != "relax.astype"}
        if None in operands.values():
            return None
        grouped = weight.reshape(weight.shape[0], heads, width).transpose(1, 0, 2)[None]
        value: relax.Expr = relax.op.matmul(
            self.builder_.emit(relax.op.reshape(x, [batch, 1, tokens, weight.shape[0]])),
            relax.const(np.ascontiguousarray(grouped), str(weight.dtype)), out_dtype=product.attrs.out_dtype)
        for n, step in enumerate(steps):
            value = self.builder_.emit(value)
            if n in operands:
                value = relax.Call(step.op, [value, operands[n]], step.attrs)
            else:
                value = relax.op.astype(value, step.attrs.dtype)
        return value

    def merged_heads(self, call: relax.Call) -> relax.Expr:
        """``matmul(reshape(permute_dims(heads)), W)`` as one product summing over heads and width, or as it is."""
        x, weight = call.args
        reshape = self.bound(x)
        permute = self.bound(reshape.args[0]) if reshape is not None and _name(reshape) == "relax.reshape" else None
        if permute is None or _name(permute) != "relax.permute_dims" or not isinstance(weight, Constant):
            return call
        heads, tokens_shape = permute.args[0], static_shape(x.ty.shape)
        shape, w = static_shape(heads.ty.shape), weight.value.numpy()
        if permute.attrs.axes is None or [int(a) for a in permute.attrs.axes] != _HEADS_FIRST or shape is None:
            return call
        if tokens_shape is None or len(shape) != 4 or w.ndim != 2 or str(heads.ty.dtype) != str(w.dtype):
            return call
        batch, count, tokens, width = shape
        if w.shape[0] != count * width or tokens_shape[-2:] != [tokens, w.shape[0]] or (len(tokens_shape) == 2 and batch != 1):
            return call
        grouped = relax.const(np.ascontiguousarray(w.reshape(count, width, w.shape[1])), str(w.dtype))
        self.changed += 1
        return self.builder_.call_te(_sum_over_heads, heads, grouped, str(call.attrs.out_dtype or w.dtype),
                                     len(tokens_shape) == 3, primfunc_name_hint="heads_matmul")


def _sum_over_heads(heads: te.Tensor, weight: te.Tensor, out_dtype: str, batched: bool) -> te.Tensor:
    """``out[b, t, o] = sum(heads[b, h, t, d] * weight[h, d, o])`` over ``h`` and ``d``, summed in ``out_dtype``
    (``b`` dropped where the tokens were 2-D)."""
    batch, count, tokens, width = heads.shape
    h, d = te.reduce_axis((0, count), "h"), te.reduce_axis((0, width), "d")

    def value(b: Any, t: Any, o: Any) -> Any:
        return te.sum(heads[b, h, t, d].astype(out_dtype) * weight[h, d, o].astype(out_dtype), axis=[h, d])

    if batched:
        return te.compute((batch, tokens, weight.shape[2]), value, name="heads_matmul")
    return te.compute((tokens, weight.shape[2]), lambda t, o: value(0, t, o), name="heads_matmul")


def _per_head(constant: Constant, heads: int, width: int) -> Constant | None:
    """A constant operand of the features, as one of (batch, heads, tokens, width): a scalar as it is, a vector of the
    features grouped by head; None for another shape."""
    value = constant.value.numpy()
    if value.size == 1:
        return constant
    if value.size != heads * width or value.shape[-1] != heads * width:
        return None
    return relax.const(np.ascontiguousarray(value.reshape(1, heads, 1, width)), str(value.dtype))


class HeadProjections:
    """Graph rewrite ``head-projections``: attention's projections batched by head (module docstring)."""

    name = "head-projections"

    def rewrite(self, mod: tvm.IRModule, target: TargetSpec) -> tuple[tvm.IRModule, int]:
        """``mod`` with its attention projections reading and writing heads in place, and how many were rewritten."""
        folded = relax.transform.FoldConstant()(mod)  # weights the model transposes become constants
        mutator = _HeadProjections(folded)
        for gvar, func in folded.functions_items():
            if isinstance(func, relax.Function):
                mutator.builder_.update_func(gvar, mutator.visit_expr(func))
        if not mutator.changed:
            return mod, 0
        fused = relax.transform.FuseTransposeMatmul()(mutator.builder_.get())  # with the products' PrimFuncs
        return relax.transform.DeadCodeElimination()(fused), mutator.changed
