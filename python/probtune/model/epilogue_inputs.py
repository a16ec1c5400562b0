"""Elementwise producers of a fused group's epilogue inputs, merged into that group.

TVM's FuseOps fuses the elementwise consumers of a product (bias, activation,
residual add) into its group, but never the elementwise producer of another
input those consumers read: a residual connection widened from its narrow copy
becomes a task and a kernel of its own, writing a tensor that only the
product's epilogue reads. ``fold_epilogue_inputs`` runs between FuseOps and
FuseTIR: a group (or a lone operator) made only of elementwise, broadcast
and injective operators, whose one result a single group reads, only in
elementwise or broadcast operators, is merged into that group. After FuseTIR,
``inline_epilogue_inputs`` inlines the merged producer's blocks into the
epilogue blocks that read them, so that the task's program computes each
value where the epilogue reads it (the space's modules tile a product before
they reach the blocks above it, and the product's epilogue could not be
folded into its write while it read another block's buffer).
"""

from __future__ import annotations

import tvm
from tvm import relax, s_tir, tirx
from tvm.relax.utils import copy_with_new_vars

from probtune.model.concat_in_place import variable_uses
from probtune.schedule.analysis import block_names, is_spatial

__all__ = ["fold_epilogue_inputs", "inline_epilogue_inputs"]

MERGED_ATTR = "probtune_epilogue_inputs"
"""The module attribute naming the groups ``fold_epilogue_inputs`` made, for ``inline_epilogue_inputs``."""

_BROADCAST, _INJECTIVE = 1, 2
"""TVM's operator patterns (``op_pattern``): elementwise 0, broadcast 1, injective 2, reductions and products above."""

_Key = tuple[str, int, str]


def fold_epilogue_inputs(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` (as FuseOps leaves it) with each producer that only an epilogue reads merged into that group."""
    builder = relax.BlockBuilder(mod)
    merged: dict[_Key, relax.GlobalVar] = {}
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function) and not _primitive(func):
            folded = _fold(builder, func, merged)
            if not folded.same_as(func):
                builder.update_func(gvar, folded)
    names = sorted(gvar.name_hint for gvar in merged.values())
    return builder.get().with_attr(MERGED_ATTR, names) if names else builder.get()


def inline_epilogue_inputs(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` (as FuseTIR leaves it) with each merged group's producer blocks inlined into their readers."""
    names = mod.attrs.get(MERGED_ATTR) if mod.attrs is not None else None
    if not names:
        return mod
    merged = {str(name) for name in names}
    functions = {gvar: _inlined(func) if gvar.name_hint in merged and isinstance(func, tirx.PrimFunc) else func
                 for gvar, func in mod.functions_items()}
    return tvm.IRModule(functions, attrs=mod.without_attr(MERGED_ATTR).attrs)


def _inlined(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with its spatial blocks that depend on no reduction inlined into their readers, where TVM can."""
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    reducing: set[str] = set()
    for name in block_names(func):
        block = sch.get_sblock(name)
        producers = {sch.get(p).name_hint for p in sch.get_producers(block)}
        if not is_spatial(sch.get(block)) or producers & reducing:
            reducing.add(name)
    for name in block_names(func):
        if name not in reducing:
            try:
                sch.compute_inline(sch.get_sblock(name))
            except RuntimeError:  # TVM refuses (a block writing the function's output): it stays
                continue
    return sch.mod["main"]


def _primitive(func: relax.Function) -> bool:
    return bool(func.attrs and func.attrs.get("Primitive"))


def _fold(builder: relax.BlockBuilder, func: relax.Function, merged: dict[_Key, relax.GlobalVar]) -> relax.Function:
    """``func`` with every foldable producer merged into the one group call that reads it."""
    functions = builder.get()
    bindings = [b for block in func.body.blocks for b in block.bindings]
    uses = variable_uses(func, bindings)
    producers = {b.var: b.value for b in bindings if _elementwise(functions, b.value) and uses[b.var] == 1}
    folded: set[relax.Var] = set()
    replaced: dict[relax.Var, relax.VarBinding] = {}
    for binding in bindings:
        call = binding.value
        if not (isinstance(call, relax.Call) and isinstance(call.op, relax.GlobalVar) and _group(functions, call.op)):
            continue
        new = call
        for arg in call.args:
            index = next(i for i, a in enumerate(new.args) if a.same_as(arg))
            if arg in producers and _read_in_epilogue(functions, functions[new.op], index):
                new = _merge(builder, new, index, producers[arg], merged)
                functions = builder.get()
                folded.add(arg)
        if not new.same_as(call):
            replaced[binding.var] = relax.VarBinding(binding.var, new)
    if not folded:
        return func
    blocks = []
    for block in func.body.blocks:
        kept = [replaced.get(b.var, b) for b in block.bindings if b.var not in folded]
        blocks.append(relax.DataflowBlock(kept) if isinstance(block, relax.DataflowBlock) else relax.BindingBlock(kept))
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure, func.attrs)


def _group(functions: tvm.IRModule, gvar: relax.GlobalVar) -> bool:
    func = functions.functions.get(gvar)
    return isinstance(func, relax.Function) and _primitive(func)


def _pattern(functions: tvm.IRModule, gvar: relax.Expr) -> int:
    """The operator pattern of the PrimFunc ``gvar`` names (opaque, above every other, when it has none)."""
    func = functions.functions.get(gvar) if isinstance(gvar, relax.GlobalVar) else None
    attrs = getattr(func, "attrs", None)
    return int(attrs["op_pattern"]) if attrs is not None and "op_pattern" in attrs else 8


def _call_tir(expr: relax.Expr) -> bool:
    return isinstance(expr, relax.Call) and str(getattr(expr.op, "name", "")) == "relax.call_tir"


def _group_calls(func: relax.Function) -> list[relax.Call]:
    return [b.value for block in func.body.blocks for b in block.bindings]


def _elementwise(functions: tvm.IRModule, value: relax.Expr) -> bool:
    """Whether ``value`` is a call of injective operators alone (a lone one or a group) with one tensor result."""
    if not isinstance(getattr(value, "ty", None), relax.TensorType):
        return False
    if _call_tir(value):
        return _pattern(functions, value.args[0]) <= _INJECTIVE
    if not (isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar) and _group(functions, value.op)):
        return False
    calls = _group_calls(functions[value.op])
    return all(_call_tir(c) and _pattern(functions, c.args[0]) <= _INJECTIVE for c in calls)


def _read_in_epilogue(functions: tvm.IRModule, group: relax.Function, index: int) -> bool:
    """Whether the group reads its parameter ``index`` only in elementwise and broadcast operators."""
    param = group.params[index]
    readers = [c for c in _group_calls(group) if any(f.same_as(param) for f in c.args[1].fields)]
    return bool(readers) and all(_call_tir(c) and _pattern(functions, c.args[0]) <= _BROADCAST for c in readers)


def _merge(builder: relax.BlockBuilder, call: relax.Call, index: int, producer: relax.Call,
           merged: dict[_Key, relax.GlobalVar]) -> relax.Call:
    """``call`` of a group with its argument ``index`` computed inside it from ``producer``'s arguments."""
    functions = builder.get()
    inputs = list(producer.args[1].fields) if _call_tir(producer) else list(producer.args)
    source = producer.args[0].name_hint if _call_tir(producer) else producer.op.name_hint
    key = (call.op.name_hint, index, source)
    if key not in merged:
        group = _merged_group(functions[call.op], index, _as_group(producer, functions))
        merged[key] = builder.add_func(group, f"{call.op.name_hint}_{source.removeprefix('fused_')}")
    args = [*call.args[:index], *inputs, *call.args[index + 1:]]
    return relax.Call(merged[key], args)


def _as_group(producer: relax.Call, functions: tvm.IRModule) -> relax.Function:
    """The producer as a group function: its own, or one around a lone operator."""
    if not _call_tir(producer):
        return functions[producer.op]
    params = [relax.Var(f"p{i}", field.ty) for i, field in enumerate(producer.args[1].fields)]
    out = relax.Var("gv", producer.ty)
    value = relax.Call(producer.op, [producer.args[0], relax.Tuple(params), *producer.args[2:]], producer.attrs,
                       producer.ty_args)
    body = relax.SeqExpr([relax.DataflowBlock([relax.VarBinding(out, value)])], out)
    return relax.Function(params, body, producer.ty).with_attr("Primitive", True)


def _merged_group(group: relax.Function, index: int, producer: relax.Function) -> relax.Function:
    """``group`` with parameter ``index`` replaced by ``producer``'s parameters and computed by its operators."""
    group, producer = copy_with_new_vars(group), copy_with_new_vars(producer)
    produced = relax.DataflowVar("lv_in", group.params[index].ty)
    *head, last = [b for block in producer.body.blocks for b in block.bindings]
    bound = group.bind_params({group.params[index]: produced})
    bindings = [*head, relax.VarBinding(produced, last.value), *_group_calls_bindings(bound)]
    params = [*group.params[:index], *producer.params, *group.params[index + 1:]]
    body = relax.SeqExpr([relax.DataflowBlock(bindings)], bound.body.body)
    return relax.Function(params, body, group.ret_ty, group.is_pure, group.attrs)


def _group_calls_bindings(func: relax.Function) -> list[relax.Binding]:
    return [b for block in func.body.blocks for b in block.bindings]
