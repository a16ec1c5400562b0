"""Weight repacking at compile time: a layout copy of a constant weight that a tuned program makes on every call is
made once, when the model is compiled.

Where every call site of a program passes a constant at a position (a weight
bound in the model), the program reads that input already in its copy's
layout (:func:`probtune.measure.constant_layouts.read_constants_packed`), and each
call site passes the constant through a Relax ``layout_transform`` that
constant folding evaluates at compile time.
"""

from __future__ import annotations

from collections.abc import Mapping

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.ir.expr import Constant

from probtune.measure.constant_layouts import read_constants_packed

__all__ = ["constant_arguments", "global_for", "prepack_weights"]


def constant_arguments(fused: tvm.IRModule) -> dict[str, set[int]]:
    """For each PrimFunc called from ``main``, the argument positions where every call passes a constant."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    constant: dict[str, set[int]] = {}

    def visit(call: relax.Call) -> None:
        if not call.op.same_as(call_tir):
            return
        name = call.args[0].name_hint
        here = {i for i, arg in enumerate(call.args[1].fields) if isinstance(arg, Constant)}
        constant[name] = constant[name] & here if name in constant else here

    tvm_ffi.structural_walk(fused["main"], (relax.Call, visit))
    return constant


@relax.expr_functor.mutator
class _PackArguments(relax.PyExprMutator):  # type: ignore[misc]
    """Calls of the named PrimFuncs: to their new versions, the given arguments put through ``layout_transform``."""

    def __init__(
        self, mod: tvm.IRModule, layouts: Mapping[str, Mapping[int, tirx.IndexMap]], callees: Mapping[str, tvm.ir.GlobalVar]
    ) -> None:
        super().__init__(mod)
        self.layouts = layouts
        self.callees = callees
        self.call_tir = tvm.ir.Op.get("relax.call_tir")

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        if not call.op.same_as(self.call_tir) or call.args[0].name_hint not in self.layouts:
            return call
        name = call.args[0].name_hint
        fields = list(call.args[1].fields)
        for position, layout in self.layouts[name].items():
            fields[position] = relax.op.layout_transform(fields[position], layout)
        return relax.Call(call.op, [self.callees[name], relax.Tuple(fields)], call.attrs, call.ty_args)


def global_for(name: str, func: tirx.PrimFunc, old: tvm.ir.GlobalVar) -> tvm.ir.GlobalVar:
    """A new global ``name`` for ``func``, a changed version of ``old``'s PrimFunc: Relax checks calls against its global's type."""
    gv = tvm.ir.GlobalVar(name)
    params = [relax.TensorType(list(param.shape), str(param.dtype)) for param in func.params]
    relax.expr._update_type(gv, relax.FuncType(params, old.ty.ret, old.ty.purity))
    return gv


def prepack_weights(
    fused: tvm.IRModule, programs: Mapping[str, tvm.IRModule], target: tvm.target.Target
) -> tuple[tvm.IRModule, dict[str, tvm.IRModule], int]:
    """``fused`` and ``programs`` with every constant weight's layout copy moved to compile time; how many moved.

    The returned module (``fused`` is left as it is) has the transformed
    constants folded, and new globals for the programs that changed: they
    read those parameters in their packed layouts.
    """
    constants = constant_arguments(fused)
    updated = dict(programs)
    layouts: dict[str, dict[int, tirx.IndexMap]] = {}
    for name, program in programs.items():
        updated[name], packed = read_constants_packed(program, constants.get(name, set()))
        if packed:
            layouts[name] = packed
    if not layouts:
        return fused, updated, 0
    callees = {name: global_for(name, updated[name]["main"], fused.get_global_var(name)) for name in layouts}
    main = _PackArguments(fused, layouts, callees).visit_expr(fused["main"])
    functions = {gv: func for gv, func in fused.functions.items() if gv.name_hint not in layouts}
    functions[fused.get_global_var("main")] = main
    functions.update({callees[name]: updated[name]["main"] for name in layouts})
    with target:
        mod = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.FoldConstant()])(
            tvm.IRModule(functions, attrs=fused.attrs)
        )
    return mod, updated, sum(len(positions) for positions in layouts.values())
