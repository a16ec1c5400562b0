"""Graph rewrite ``head-projections``: attention's projections read and write heads as attention lays them out.

Exported transformers project the tokens to queries, keys and values with
2-D matrix products (tokens x features), add the bias and move the features
into heads before the tokens: reshapes and transposes, or (PyTorch's
``nn.MultiheadAttention``) one product for all three taken apart by an
expand, a transpose, a squeeze and takes: a kernel per transpose, which
moves every value once more. Which sequence of moves an exporter wrote does
not matter: the product's element numbers, moved by it
(:mod:`probtune_cuda.index_trace`), show whether it lays a range of the
product's columns out as (batch, heads, tokens, width). If it does, that
tensor is a batched product with the weight's columns grouped by head (a
constant, laid out at compile time), casts and operators with a constant
per column applied per head. Keys that attention reads transposed come out
the same way and their transpose is folded into the product that reads them
(TVM's ``FuseTransposeMatmul``). A product the moves share with another
reader is left as it is, so that it is never computed twice. The heads'
outputs, moved back token by token into features for the output
projection, are read where they lie by a product that sums over heads and
their width at once (its weight's rows grouped by head). One kernel per
projection, none to transpose.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import tvm
from tvm import relax, te
from tvm.ir.expr import Constant

from probtune.plugin import ELEMENTWISE_BINARY, TargetSpec, split_bounds, static_shape, variable_uses
from probtune_cuda.index_trace import is_move, moved, op_name

__all__ = ["HeadProjections"]


def _uses(mod: tvm.IRModule) -> Counter[relax.Expr]:
    """How many times each variable of ``mod``'s Relax functions is read (by a binding, or as a result)."""
    uses: Counter[relax.Expr] = Counter()
    for func in mod.functions.values():
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            uses.update(variable_uses(func, [b for block in func.body.blocks for b in block.bindings]))
    return uses


def _bound_vars(mod: tvm.IRModule) -> set[relax.Expr]:
    return {b.var for func in mod.functions.values() if isinstance(func, relax.Function)
            for block in func.body.blocks for b in block.bindings}


class _Chain:
    """A product of tokens by a constant weight, and the steps from it to a tensor: moves, casts and binary
    operators with a constant, the product's first; ``shared`` if a tensor on the way has other readers."""

    def __init__(self, product: relax.Call, var: relax.Expr, steps: list[relax.Call], shared: bool) -> None:
        self.product, self.var, self.steps, self.shared = product, var, steps, shared
        self.weight = product.args[1].value.numpy()
        self.shape: list[int] = static_shape(product.ty.shape) or []

    def positions(self, upto: int | None = None) -> np.ndarray:
        """The product's element numbers after the moves among the first ``upto`` steps (all of them: None)."""
        return moved([step for step in self.steps[:upto] if is_move(step)], self.shape)


@relax.expr_functor.mutator
class _HeadProjections(relax.PyExprMutator):  # type: ignore[misc]
    """Writes a tensor that moves alone make, in attention's (batch, heads, tokens, width) layout or with the width
    and tokens swapped, from a product's columns grouped by head, as the batched product per head with the chain's
    casts and constant operands applied per head; and a product of such a tensor's heads merged back into features
    as a product over heads and width."""

    def __init__(self, mod: tvm.IRModule, excluded: set[relax.Expr]) -> None:
        super().__init__(mod)
        self.uses = _uses(mod)
        self.excluded = excluded  # products that their other readers keep: not written again per head
        self.shared: set[relax.Expr] = set()  # products written per head through a tensor something else reads
        self.swapped: set[relax.Expr] = set()  # per-head results that a transpose swaps to (width, tokens)
        self.changed = 0

    def binding(self, expr: relax.Expr) -> relax.Call | None:
        value = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        return value if isinstance(value, relax.Call) else None

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if op_name(call) == "relax.matmul":
            return self.merged_heads(call)
        if op_name(call) == "relax.astype" or (op_name(call) in ELEMENTWISE_BINARY and isinstance(call.args[1], Constant)):
            return self.before_swap(call)
        shape = static_shape(call.ty.shape) if is_move(call) else None
        chain = self.chain(call) if shape is not None and len(shape) == 4 else None
        if shape is None or chain is None or (chain.shared and chain.var in self.excluded):
            return call
        heads = self.by_head(chain, shape)
        if heads is None:
            return call
        if chain.shared:
            self.shared.add(chain.var)
        self.changed += 1
        return heads

    def chain(self, call: relax.Call) -> _Chain | None:
        """The product that ``call`` is made from by moves, casts and binary operators with a constant; None if none."""
        steps, value, shared = [call], call.args[0], False
        while (bound := self.maker(value)) is not None:
            shared = shared or self.uses[value] != 1 or not isinstance(self.lookup_binding(value), relax.Call)
            if op_name(bound) == "relax.matmul":
                weight = bound.args[1]
                if not isinstance(weight, Constant) or weight.value.numpy().ndim != 2 or static_shape(bound.ty.shape) is None:
                    return None
                return _Chain(bound, value, steps, shared)
            movable = is_move(bound) or op_name(bound) == "relax.astype"
            if not movable and not (op_name(bound) in ELEMENTWISE_BINARY and isinstance(bound.args[1], Constant)):
                return None
            steps.insert(0, bound)
            value = bound.args[0]
        return None

    def maker(self, value: relax.Expr) -> relax.Call | None:
        """The call ``value`` is bound to, or the take standing for the split part it is; None for anything else."""
        bound = self.binding(value)
        return bound if bound is not None else self.split_part(value)

    def split_part(self, value: relax.Expr) -> relax.Call | None:
        """A part of a ``relax.split`` that ``value`` is bound to, as the take of its range it equals (a move the
        chain can trace); None for anything else."""
        part: Any = self.lookup_binding(value) if isinstance(value, relax.Var) else None
        split: Any = self.binding(part.tuple_value) if isinstance(part, relax.TupleGetItem) else None
        found = split_bounds(split) if split is not None and op_name(split) == "relax.split" else None
        if found is None:
            return None
        axis, bounds = found
        low, high = bounds[int(part.index)]
        take = relax.op.take(split.args[0], relax.const(np.arange(low, high, dtype="int64")), axis=axis)
        return self.builder_.normalize(take)

    def by_head(self, chain: _Chain, shape: list[int]) -> relax.Expr | None:
        """The chain's result computed per head, if it lays a column range of the product out as (batch, heads,
        tokens, width) or (batch, heads, width, tokens); None otherwise."""
        positions = chain.positions()
        layout = _head_layout(positions, shape, chain.shape, chain.weight.shape[1])
        if layout is None or _in_order(positions):  # a view of the product as it lies: nothing to move
            return None
        low, tokens, width, swapped = layout
        batch, heads = shape[0], shape[1]
        x, weight = chain.product.args[0], chain.weight
        grouped = weight[:, low:low + heads * width].reshape(weight.shape[0], heads, width).transpose(1, 0, 2)[None]
        value: relax.Expr = relax.op.matmul(
            self.builder_.emit(relax.op.reshape(x, [batch, 1, tokens, weight.shape[0]])),
            relax.const(np.ascontiguousarray(grouped), str(weight.dtype)), out_dtype=chain.product.attrs.out_dtype)
        for index, step in enumerate(chain.steps):
            if is_move(step):
                continue
            value = self.builder_.emit(value)
            if op_name(step) == "relax.astype":
                value = relax.op.astype(value, step.attrs.dtype)
                continue
            operand = _per_head(step.args[1], chain.positions(index), chain.weight.shape[1], low, heads, width)
            if operand is None:
                return None
            value = relax.Call(step.op, [value, operand], step.attrs)
        if not swapped:
            return value
        value = self.builder_.emit(value)
        self.swapped.add(value)
        return relax.op.permute_dims(value, [0, 1, 3, 2])

    def before_swap(self, call: relax.Call) -> relax.Expr:
        """A cast, or a binary operator with a scalar, of heads whose width and tokens a transpose swaps, applied
        before the swap, so that the swap is folded into the product that reads it (TVM's ``FuseTransposeMatmul``
        takes a transpose read directly)."""
        swap: Any = self.binding(call.args[0])
        if op_name(swap) != "relax.permute_dims" or swap.attrs.axes is None or [int(a) for a in swap.attrs.axes] != [
                0, 1, 3, 2] or not (swap.args[0] in self.swapped or self.uses[call.args[0]] == 1):
            return call
        if op_name(call) != "relax.astype" and call.args[1].value.numpy().size != 1:
            return call
        value = self.builder_.emit(relax.Call(call.op, [swap.args[0], *call.args[1:]], call.attrs))
        self.swapped.add(value)
        return relax.op.permute_dims(value, [0, 1, 3, 2])

    def merged_heads(self, call: relax.Call) -> relax.Expr:
        """``matmul(X, W)`` with ``X`` a (batch, heads, tokens, width) tensor's heads merged into features by moves
        (and casts), as one product summing over heads and width; or as it is."""
        x, weight = call.args
        steps: list[relax.Call] = []
        value = x
        while (bound := self.binding(value)) is not None and self.uses[value] == 1 and (
                is_move(bound) or op_name(bound) == "relax.astype"):
            steps.insert(0, bound)
            value = bound.args[0]
        shape, rows = static_shape(getattr(value.ty, "shape", None)), static_shape(x.ty.shape)
        if not steps or shape is None or len(shape) != 4 or rows is None or not isinstance(weight, Constant):
            return call
        w = weight.value.numpy()
        batch, count, tokens, width = shape
        positions = moved([s for s in steps if is_move(s)], shape)
        if w.ndim != 2 or w.shape[0] != count * width or rows[-1] != w.shape[0] or not _merged(positions, shape) or (
                len(rows) == 2 and batch != 1) or (len(rows) == 3 and rows[:2] != [batch, tokens]) or len(rows) not in (
                2, 3) or _in_order(positions):  # heads that a reshape alone merges are read as they lie already
            return call
        heads = value
        for step in steps:
            if op_name(step) == "relax.astype":
                heads = self.builder_.emit(relax.op.astype(heads, step.attrs.dtype))
        if str(heads.ty.dtype) != str(w.dtype):
            return call
        grouped = relax.const(np.ascontiguousarray(w.reshape(count, width, w.shape[1])), str(w.dtype))
        self.changed += 1
        return self.builder_.call_te(_sum_over_heads, heads, grouped, str(call.attrs.out_dtype or w.dtype),
                                     len(rows) == 3, primfunc_name_hint="heads_matmul")


def _head_layout(positions: np.ndarray, shape: list[int], product: list[int], features: int,
                 ) -> tuple[int, int, int, bool] | None:
    """(first column, tokens, width, swapped) if ``positions`` (a product's element numbers moved into ``shape``)
    lay columns ``first:first + heads * width`` of its rows out as (batch, heads, tokens, width), or as (batch,
    heads, width, tokens) when swapped; None otherwise."""
    batch, heads, first_axis, second_axis = shape
    rows = math.prod(product[:-1])
    for tokens, width, swapped in ((first_axis, second_axis, False), (second_axis, first_axis, True)):
        low = int(positions.flat[0]) % features
        if batch * tokens != rows or low + heads * width > features:
            continue
        b, h, t, w = np.indices((batch, heads, tokens, width))
        expected = (b * tokens + t) * features + low + h * width + w
        if np.array_equal(positions, expected.transpose(0, 1, 3, 2) if swapped else expected):
            return low, tokens, width, swapped
    return None


def _in_order(positions: np.ndarray) -> bool:
    """Whether the moves left every element where it was (reshapes alone: a view)."""
    return bool(np.array_equal(positions.reshape(-1), np.arange(positions.size)))


def _merged(positions: np.ndarray, shape: list[int]) -> bool:
    """Whether ``positions`` (a (batch, heads, tokens, width) tensor's element numbers after moves) lay each token's
    heads side by side: row ``b * tokens + t``, column ``h * width + w``."""
    batch, heads, tokens, width = shape
    b, t, h, w = np.indices((batch, tokens, heads, width))
    expected = ((b * heads + h) * tokens + t) * width + w
    return positions.size == expected.size and np.array_equal(positions.reshape(-1), expected.reshape(-1))


def _per_head(constant: Constant, positions: np.ndarray, features: int, low: int, heads: int, width: int,
              ) -> Constant | None:
    """A constant operand at a step of the chain (where ``positions`` are the product's element numbers), as one
    of (batch, heads, tokens, width): a scalar as it is, a value per column of the product grouped by head; None if
    it varies along the tokens."""
    value = constant.value.numpy()
    if value.size == 1:
        return constant
    try:
        broadcast = np.broadcast_to(value, positions.shape)
    except ValueError:
        return None
    columns = positions % features
    per_column = np.zeros(features, value.dtype)
    per_column[columns.reshape(-1)] = broadcast.reshape(-1)
    if not np.array_equal(per_column[columns], broadcast):
        return None
    grouped = per_column[low:low + heads * width].reshape(1, heads, 1, width)
    return relax.const(np.ascontiguousarray(grouped), str(value.dtype))


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


class HeadProjections:
    """Graph rewrite ``head-projections``: attention's projections batched by head (module docstring)."""

    name = "head-projections"

    def rewrite(self, mod: tvm.IRModule, target: TargetSpec) -> tuple[tvm.IRModule, int]:
        """``mod`` with its attention projections reading and writing heads in place, and how many were rewritten."""
        folded = relax.transform.FoldConstant()(mod)  # weights the model transposes become constants
        excluded: set[relax.Expr] = set()
        while True:  # a product read through a shared tensor is written per head only if no other reader keeps it
            mutator = _HeadProjections(folded, excluded)
            for gvar, func in folded.functions_items():
                if isinstance(func, relax.Function):
                    mutator.builder_.update_func(gvar, mutator.visit_expr(func))
            if not mutator.changed:
                return mod, 0
            fused = relax.transform.FuseTransposeMatmul()(mutator.builder_.get())  # with the products' PrimFuncs
            rewritten = relax.transform.DeadCodeElimination()(fused)
            kept = mutator.shared & _bound_vars(rewritten)
            if not kept:
                return rewritten, mutator.changed
            excluded |= kept
