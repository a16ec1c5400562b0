"""Graph rewrite ``sink-reshapes``: a reshape is done after the elementwise operators that follow it, not before.

Exported transformers compute their matrix products on 2-D tensors
(tokens x features) and reshape around them: the bias is added in 2-D, the
result reshaped to 3-D, widened and added to the residual stream, and a
GELU is applied between a reshape to 3-D and one back. TVM's operator fusion
joins only elementwise operators to a matrix product, so each reshape ends
the product's kernel and starts one more for the rest of the chain. Carried
past the elementwise operators (a unary one, a cast, or a binary one whose
other operand is reshaped alike or broadcasts over the axes the reshape
keeps), the reshape meets the next product or normalization and stays a
view of memory, and the whole chain runs in the product's epilogue. The
value computed is the same: each elementwise operator sees the same
elements, only laid out in the reshape's input shape.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant

from probtune.plugin import ELEMENTWISE_BINARY, ELEMENTWISE_UNARY, TargetSpec, mutated, static_shape

__all__ = ["SinkReshapes"]


@relax.expr_functor.mutator
class _SinkReshapes(relax.PyExprMutator):  # type: ignore[misc]
    """Writes an elementwise operator on reshaped operands as the reshape of the operator on the operands before the
    reshape, and joins a reshape of a reshape into one (none where it gives the shape back)."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.reshape = tvm.ir.Op.get("relax.reshape")
        self.changed = 0

    def reshaped(self, expr: relax.Expr) -> relax.Call | None:
        """The ``reshape`` call ``expr`` is bound to, if it is one of a tensor of static shape."""
        bound = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        if not (isinstance(bound, relax.Call) and bound.op.same_as(self.reshape)):
            return None
        return bound if static_shape(bound.args[0].ty.shape) is not None else None

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        name = call.op.name if isinstance(call.op, tvm.ir.Op) else ""
        if static_shape(getattr(call.ty, "shape", None)) is None:
            return call
        if name == "relax.reshape":
            return self.join(call)
        if name in ELEMENTWISE_UNARY:
            return self.carry_unary(call)
        if name in ELEMENTWISE_BINARY:
            return self.carry_binary(call)
        return call

    def moved(self, inner: relax.Call, like: relax.Call) -> relax.Expr:
        """``inner`` emitted, then reshaped to the shape of ``like``, the call it replaces."""
        self.changed += 1
        return relax.op.reshape(self.builder_.emit(inner), static_shape(like.ty.shape))

    def join(self, call: relax.Call) -> relax.Expr:
        found = self.reshaped(call.args[0])
        if found is None:
            return call
        self.changed += 1
        source = found.args[0]
        if static_shape(source.ty.shape) == static_shape(call.ty.shape):
            return source
        return relax.op.reshape(source, static_shape(call.ty.shape))

    def carry_unary(self, call: relax.Call) -> relax.Expr:
        found = self.reshaped(call.args[0])
        if found is None:
            return call
        return self.moved(relax.Call(call.op, [found.args[0], *call.args[1:]], call.attrs, call.ty_args), call)

    def carry_binary(self, call: relax.Call) -> relax.Expr:
        """``op(reshape(x), y)`` as ``reshape(op(x, y'))``: ``y'`` is ``y``'s reshape input where it is reshaped
        from ``x``'s shape too, ``y`` reshaped to ``x``'s shape where it has the output's, or ``y`` as it is where it
        broadcasts over trailing axes that the reshape keeps."""
        a, b = call.args
        left, right = self.reshaped(a), self.reshaped(b)
        found = left if left is not None else right
        out = static_shape(call.ty.shape)
        if found is None or out is None or out != static_shape(found.ty.shape):
            return call
        source = static_shape(found.args[0].ty.shape)
        if source is None:
            return call
        operands = [self.before_reshape(arg, seen, source, out) for arg, seen in ((a, left), (b, right))]
        if operands[0] is None or operands[1] is None:
            return call
        return self.moved(relax.Call(call.op, operands, call.attrs, call.ty_args), call)

    def before_reshape(
        self, arg: relax.Expr, seen: relax.Call | None, source: list[int], out: list[int]
    ) -> relax.Expr | None:
        """``arg`` as an operand of the operator on tensors of shape ``source`` rather than ``out``; None if it
        cannot be."""
        if seen is not None:
            return seen.args[0] if static_shape(seen.args[0].ty.shape) == source else None
        shape = static_shape(getattr(arg.ty, "shape", None))
        if shape is None:
            return None
        if shape == out:
            return self.builder_.emit(relax.op.reshape(arg, source))
        kept = _broadcast_dims(shape)
        if kept and (len(kept) > len(source) or source[-len(kept):] != out[-len(kept):]):
            return None
        if shape == kept:
            return arg
        if isinstance(arg, Constant):
            value = arg.value.numpy()
            return relax.const(np.ascontiguousarray(value.reshape(kept)), str(value.dtype))
        return self.builder_.emit(relax.op.reshape(arg, kept))


def _broadcast_dims(shape: list[int]) -> list[int]:
    """The trailing axes of a broadcast operand that hold more than one element (its leading ones dropped)."""
    start = next((n for n, dim in enumerate(shape) if dim != 1), len(shape))
    return shape[start:]


class SinkReshapes:
    """Graph rewrite ``sink-reshapes``: reshapes carried past the elementwise operators after them (module docstring)."""

    name = "sink-reshapes"

    def rewrite(self, mod: tvm.IRModule, target: TargetSpec) -> tuple[tvm.IRModule, int]:
        """``mod`` with its reshapes carried past elementwise operators, and how many operators were rewritten."""
        mutator = _SinkReshapes(mod)
        rewritten = mutated(mod, mutator)
        return (rewritten, mutator.changed) if mutator.changed else (mod, 0)
