"""Weight repacking at compile time: a layout copy of a constant weight that a tuned program makes on every call is
made once, when the model is compiled.

A tuned program may copy an input into another layout before computing with
it (the CPU space packs a dense layer's weight into vector-wide panels). When
every call site passes a constant there (a weight bound in the model), the
program is changed to read that input already in the copy's layout (TVM's
``transform_layout`` on the parameter, then the copy inlined into its
readers), and each call site passes the constant through a Relax
``layout_transform`` that constant folding evaluates at compile time.
Nothing here knows a target: a copy is recognized by its form alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx
from tvm.ir.expr import Constant, TensorLoad

__all__ = ["LayoutCopy", "layout_copies", "prepack_weights"]


@dataclass(frozen=True)
class LayoutCopy:
    """A block ``B[f(v)] = P[v]`` that copies parameter ``param`` of a program into the layout ``f``."""

    block: str
    param: int
    layout: tirx.IndexMap


def layout_copies(func: tirx.PrimFunc) -> list[LayoutCopy]:
    """The blocks of ``func`` that copy one of its parameters, element for element, into another buffer's layout."""
    params = list(func.params)
    found: list[LayoutCopy] = []

    def visit(block: s_tir.SBlock) -> None:
        store = block.body
        if not isinstance(store, tirx.BufferStore) or block.init is not None or len(block.reads) != 1:
            return
        load = store.value
        if not isinstance(load, TensorLoad) or any(p.same_as(store.buffer) for p in params):
            return
        index = next((i for i, p in enumerate(params) if p.same_as(load.source)), None)
        iter_vars = [iv.var for iv in block.iter_vars]
        if index is None or len(load.indices) != len(iter_vars):
            return
        if not all(i.same_as(v) for i, v in zip(load.indices, iter_vars)):
            return
        if any(iv.iter_type != tirx.IterVar.DataPar for iv in block.iter_vars):
            return
        found.append(LayoutCopy(block.name_hint, index, tirx.IndexMap(iter_vars, list(store.indices), None)))

    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, visit))
    return found


def _read_packed(program: tvm.IRModule, copy: LayoutCopy) -> tvm.IRModule | None:
    """``program`` reading the copied parameter in the copy's layout, the copy gone; None where TVM refuses."""
    sch = s_tir.Schedule(program)
    try:
        block = sch.get_sblock(copy.block)
        sch.transform_layout(block, ("read", 0), copy.layout)
        sch.compute_inline(block)
    except (RuntimeError, tvm.error.TVMError, ValueError):
        return None
    return sch.mod


def _constant_arguments(fused: tvm.IRModule) -> dict[str, set[int]]:
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


def _callee(name: str, func: tirx.PrimFunc, old: tvm.ir.GlobalVar) -> tvm.ir.GlobalVar:
    """A new global for a PrimFunc whose parameters changed: Relax checks calls against its global's type."""
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
    constants = _constant_arguments(fused)
    updated = dict(programs)
    layouts: dict[str, dict[int, tirx.IndexMap]] = {}
    for name, program in programs.items():
        for copy in layout_copies(program["main"]):
            if copy.param not in constants.get(name, set()) or copy.param in layouts.get(name, {}):
                continue
            packed = _read_packed(updated[name], copy)
            if packed is not None:
                updated[name] = packed
                layouts.setdefault(name, {})[copy.param] = copy.layout
    if not layouts:
        return fused, updated, 0
    callees = {name: _callee(name, updated[name]["main"], fused.get_global_var(name)) for name in layouts}
    main = _PackArguments(fused, layouts, callees).visit_expr(fused["main"])
    functions = {gv: func for gv, func in fused.functions.items() if gv.name_hint not in layouts}
    functions[fused.get_global_var("main")] = main
    functions.update({callees[name]: updated[name]["main"] for name in layouts})
    with target:
        mod = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.FoldConstant()])(
            tvm.IRModule(functions, attrs=fused.attrs)
        )
    return mod, updated, sum(len(positions) for positions in layouts.values())
