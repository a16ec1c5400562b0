"""Put a model in the target's preferred data layouts (``TargetSpec.layouts``) before it is fused into tasks.

TVM's ``ConvertLayout`` moves the named operators, and the layout-agnostic
operators between them, to the desired layouts, with transposes only where
the model's own layout meets them. It cannot see into a ``call_tir``: an
importer that lowers an operator straight to TIR (the ONNX frontend does so
for Clip, i.e. every ReLU6) would leave a transpose pair around each such
call. A call whose PrimFunc is exactly what a Relax elementwise operator
legalizes to is therefore first lifted back to that operator. Likewise an
elementwise operator that ``ConvertLayout`` has no rule for (``clip``: every
hard-swish and hard-sigmoid; ``leakyrelu``) is first written as operators it
converts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from probtune.errors import summary, warn_caller

__all__ = ["convert_layouts", "fold_transposes", "lift_elementwise_calls"]

LIFTABLE: tuple[Callable[..., relax.Expr], ...] = (relax.op.maximum, relax.op.minimum)
"""Relax operators that an importer may have lowered to TIR and that ``ConvertLayout`` converts."""


def convert_layouts(mod: tvm.IRModule, layouts: Mapping[str, Sequence[str]]) -> tvm.IRModule:
    """``mod`` with the operators named in ``layouts`` (and what lies between them) in those layouts.

    A model without such an operator is left as it is. Where TVM's pass
    fails on the model (its layout rules crash on some operators: a variadic
    maximum, a dropout's tuple), the model keeps its own layouts, with a warning.
    """
    if not layouts or not _calls_any(mod, set(layouts)):
        return mod
    desired = {op: list(names) for op, names in layouts.items()}
    try:
        converted = relax.transform.ConvertLayout(desired)(lift_elementwise_calls(mod))
    except Exception as exc:  # noqa: BLE001 - TVM's InternalError from an operator's layout rule
        warn_caller(f"the model keeps its own data layouts: TVM's ConvertLayout failed on it ({summary(exc, 300)})")
        return mod
    return fold_transposes(converted)


def fold_transposes(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with transposes moved after the elementwise operators they feed, and joined where they meet.

    A model that moves its own data channels-last around an operator
    (ConvNeXt's layer norms, as PyTorch writes them) transposes back to NCHW
    for a scale and a residual add; once its convolutions are NHWC, the next
    one transposes to NHWC again. Carried past the scale and the add (with
    the constant laid out to match), the two transposes meet and cancel.
    """
    return _mutated(mod, _FoldTransposes(mod))


_ELEMENTWISE = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum", "relax.minimum")
"""Binary elementwise operators a transpose of their operands is carried past."""


@relax.expr_functor.mutator
class _FoldTransposes(relax.PyExprMutator):  # type: ignore[misc]
    """Joins ``permute_dims(permute_dims(x, p), q)`` into one (none for the identity) and rewrites
    ``op(permute_dims(x, p), permute_dims(y, p) or a constant)`` as ``permute_dims(op(x, y or the constant
    transposed back), p)`` for the operators of :data:`_ELEMENTWISE`."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.permute = tvm.ir.Op.get("relax.permute_dims")
        self.elementwise = {tvm.ir.Op.get(name) for name in _ELEMENTWISE}
        self.changed = 0

    def axes(self, call: relax.Call) -> list[int]:
        rank = len(call.args[0].ty.shape)
        return list(range(rank))[::-1] if call.attrs.axes is None else [int(a) for a in call.attrs.axes]

    def transposed(self, expr: relax.Expr) -> relax.Call | None:
        """The ``permute_dims`` call ``expr`` is bound to, if it is one."""
        bound = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        return bound if isinstance(bound, relax.Call) and bound.op.same_as(self.permute) else None

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if call.op.same_as(self.permute):
            return self.join(call)
        if any(call.op.same_as(op) for op in self.elementwise):
            return self.carry(call)
        return call

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
        self.changed += 1
        inner = self.builder_.emit(relax.Call(call.op, operands, call.attrs))
        return relax.op.permute_dims(inner, axes)

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


def _calls_any(mod: tvm.IRModule, names: set[str]) -> bool:
    """Whether a Relax function of ``mod`` calls one of the operators ``names``."""
    found = False

    def visit(call: relax.Call) -> None:
        nonlocal found
        found = found or (isinstance(call.op, tvm.ir.Op) and call.op.name in names)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            tvm_ffi.structural_walk(func, (relax.Call, visit))
    return found


def _clip(call: relax.Call) -> relax.Expr | None:
    """``clip(x, lo, hi)`` as ``maximum(minimum(x, hi), lo)``: TOPI's clip, in operators with a layout rule."""
    x, lo, hi = call.args
    dtype = x.ty.dtype
    return relax.op.maximum(relax.op.minimum(x, relax.const(float(hi.value), dtype)), relax.const(float(lo.value), dtype))


def _leakyrelu(call: relax.Call) -> relax.Expr | None:
    """``leakyrelu(x, a)`` as ``maximum(x, x * a)``, equal where ``0 <= a <= 1`` (the slope every exporter writes)."""
    alpha = float(call.attrs.alpha)
    if not 0.0 <= alpha <= 1.0:
        return None
    x = call.args[0]
    return relax.op.maximum(x, relax.op.multiply(x, relax.const(alpha, x.ty.dtype)))


DECOMPOSED: dict[str, Callable[[relax.Call], relax.Expr | None]] = {
    "relax.clip": _clip,
    "relax.nn.leakyrelu": _leakyrelu,
}
"""Elementwise Relax operators without a ``ConvertLayout`` rule, and how each is written in operators with one."""


def lift_elementwise_calls(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each ``call_tir`` of a PrimFunc equal to a legalized :data:`LIFTABLE` operator made that operator."""
    return _mutated(mod, _Lift(mod))


def _mutated(mod: tvm.IRModule, mutator: relax.PyExprMutator) -> tvm.IRModule:
    """``mod`` with ``mutator`` applied to its Relax functions and what they no longer use removed; ``mod`` itself
    where the mutator changed nothing (it counts its changes in ``changed``)."""
    functions = dict(mod.functions)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            functions[gv] = mutator.visit_expr(func)
    if not mutator.changed:
        return mod
    return relax.transform.DeadCodeElimination()(tvm.IRModule(functions, attrs=mod.attrs))


def _legalized(op: Callable[..., relax.Expr], args: Sequence[relax.Expr]) -> tvm.tirx.PrimFunc | None:
    """The PrimFunc that ``op(*args)`` legalizes to (None if it does not legalize to exactly one)."""
    params = [relax.Var(f"a{i}", arg.ty) for i, arg in enumerate(args)]
    try:
        builder = relax.BlockBuilder()
        with builder.function("main", params):
            builder.emit_func_output(builder.emit(op(*params)))
    except Exception:  # noqa: BLE001 - the operator does not take these arguments
        return None
    legalized = relax.transform.LegalizeOps()(builder.get())
    prims = [func for func in legalized.functions.values() if isinstance(func, tvm.tirx.PrimFunc)]
    return prims[0] if len(prims) == 1 else None


def _same_computation(a: tvm.tirx.PrimFunc, b: tvm.tirx.PrimFunc) -> bool:
    """Equal up to names and function attributes (an importer and the legalizer tag functions differently)."""
    return bool(tvm_ffi.structural_equal(_bare(a), _bare(b), map_free_vars=True))


def _bare(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``func`` without its attributes."""
    for key in list(func.attrs.keys()) if func.attrs else []:
        func = func.without_attr(key)
    return func


@relax.expr_functor.mutator
class _Lift(relax.PyExprMutator):  # type: ignore[misc]
    """Replaces each ``call_tir`` whose PrimFunc is exactly a legalized :data:`LIFTABLE` operator by that operator."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.mod = mod
        self.call_tir = tvm.ir.Op.get("relax.call_tir")
        self.changed = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        decompose = DECOMPOSED.get(call.op.name) if isinstance(call.op, tvm.ir.Op) else None
        written = decompose(call) if decompose is not None else None
        if written is not None:
            self.changed += 1
            return written
        if not call.op.same_as(self.call_tir) or not isinstance(call.args[1], relax.Tuple):
            return call
        callee = self.mod[call.args[0]]
        args = list(call.args[1].fields)
        for op in LIFTABLE:
            prim = _legalized(op, args)
            if prim is not None and _same_computation(prim, callee):
                self.changed += 1
                return op(*args)
        return call
