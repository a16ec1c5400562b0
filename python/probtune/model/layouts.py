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
converts. The transposes the pass leaves are then carried forward and joined
(:mod:`probtune.model.transposes`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import tvm
import tvm_ffi
from tvm import relax

from probtune.errors import summary, warn_caller
from probtune.model.transposes import fold_transposes, mutated

__all__ = ["convert_layouts", "lift_elementwise_calls"]

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
    try:
        return fold_transposes(converted)
    except Exception as exc:  # noqa: BLE001 - TVM's checks refused a rewritten call; the pass's own output is correct
        warn_caller(f"the model's transposes are left where the layout pass put them ({summary(exc, 300)})")
        return converted


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
    return mutated(mod, _Lift(mod))


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
