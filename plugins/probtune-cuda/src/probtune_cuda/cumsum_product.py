"""Graph rewrite ``cumsum-product``: a cumulative sum along a short last axis as a product with a triangle of ones.

TVM leaves ``cumsum`` to its runtime (a library scan that its VM calls),
which a compiled model run without TVM, as a model bundle is, cannot call;
RoBERTa numbers its positions with one. ``cumsum(x)[..., i]`` is
``sum(x[..., j] for j <= i)`` (``j < i`` exclusive): ``x`` times a constant
upper triangle of ones, a product the GPU space tiles like any other, exact
for integers. The triangle takes ``n * n`` elements, so an axis longer than
``MAX_LENGTH`` is left to TVM.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from probtune.plugin import TargetSpec, mutated, static_shape

__all__ = ["MAX_LENGTH", "CumsumProduct"]

MAX_LENGTH = 1024
"""The longest axis rewritten: its triangle holds a million elements."""


@relax.expr_functor.mutator
class _CumsumProduct(relax.PyExprMutator):  # type: ignore[misc]
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.changed = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if str(getattr(call.op, "name", "")) != "relax.cumsum":
            return call
        shape, axis = static_shape(getattr(call.args[0].ty, "shape", None)), call.attrs.axis
        if shape is None or axis is None or int(axis) % len(shape) != len(shape) - 1 or shape[-1] > MAX_LENGTH:
            return call
        dtype = str(call.ty.dtype)
        exclusive = bool(call.attrs.exclusive) if call.attrs.exclusive is not None else False
        triangle = np.triu(np.ones((shape[-1], shape[-1]), dtype), k=1 if exclusive else 0)
        x = call.args[0] if str(call.args[0].ty.dtype) == dtype else self.builder_.emit(relax.op.astype(call.args[0], dtype))
        self.changed += 1
        return relax.op.matmul(x, relax.const(triangle, dtype))


class CumsumProduct:
    """Graph rewrite ``cumsum-product``: cumulative sums as products with a triangle of ones (module docstring)."""

    name = "cumsum-product"

    def rewrite(self, mod: tvm.IRModule, target: TargetSpec) -> tuple[tvm.IRModule, int]:
        mutator = _CumsumProduct(mod)
        rewritten = mutated(mod, mutator)
        return (rewritten, mutator.changed) if mutator.changed else (mod, 0)
