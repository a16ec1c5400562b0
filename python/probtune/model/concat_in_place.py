"""Concatenations with no copy: each input's producer writes its output straight into its stretch of the result.

A concatenation reads every element its producers have just written and
writes it again (SqueezeNet's fire modules, Inception's branches). Where
every input of a plain concatenation (:func:`~probtune.model.concatenation.concatenation_axis`)
is the fresh output of one call that nothing else reads, the first producer's
call makes the concatenated tensor and writes its stretch, each later one
writes its own stretch of that same tensor (Relax's ``call_tir_inplace``),
and the concatenation's call is gone. A producer's program is the one tuned,
its output a strided view of the whole (:func:`write_into`). The
concatenation is then no task of the model (:func:`concatenations_in_place`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax, tirx

from probtune.model.concatenation import concatenation_axis
from probtune.model.prepack import global_for

__all__ = ["CONCAT_IN_PLACE_ATTR", "Site", "concatenations_in_place", "write_concatenations_in_place", "write_into"]

CONCAT_IN_PLACE_ATTR = "probtune_concat_in_place"
"""Set on a fused module (:func:`probtune.model.tasks.fuse`) whose target writes concatenations in place
(``TargetSpec.concat_in_place``): its tasks and its compile both read it."""


@dataclass(frozen=True)
class Site:
    """A concatenation whose inputs' producers write into it: its binding, axis, and each producer's binding and offset."""

    concat: relax.VarBinding
    axis: int
    producers: tuple[tuple[relax.VarBinding, int], ...]  # in the order they run


def concatenations_in_place(mod: tvm.IRModule) -> list[Site]:
    """The concatenations of ``mod``'s ``main`` whose producers can write into them (see the module's doc); none
    unless ``mod`` is marked so (``CONCAT_IN_PLACE_ATTR``)."""
    if not (mod.attrs and mod.attrs.get(CONCAT_IN_PLACE_ATTR)):
        return []
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()] or not isinstance(mod["main"], relax.Function):
        return []
    bindings = list(_bindings(mod["main"]))
    uses = _uses(mod["main"], bindings)
    position = {binding.var: index for index, binding in enumerate(bindings)}
    axes: dict[str, int | None] = {}
    sites: list[Site] = []
    for binding in bindings:
        callee = _call_tir_callee(binding.value)
        if callee is None or not isinstance(mod[callee], tirx.PrimFunc):
            continue
        if callee.name_hint not in axes:
            axes[callee.name_hint] = concatenation_axis(mod[callee])
        axis = axes[callee.name_hint]
        producers = _producers(binding, bindings, position, uses, mod) if axis is not None else None
        nested = producers is not None and any(p.var.same_as(site.concat.var) for p in producers for site in sites)
        if axis is not None and producers is not None and not nested:  # an input concatenated in place: that one only
            offsets = _offsets([p.var for p in producers], axis)
            ordered = sorted(zip(producers, offsets), key=lambda pair: position[pair[0].var])
            sites.append(Site(binding, axis, tuple(ordered)))
    return sites


def write_concatenations_in_place(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[Site]]:
    """``mod`` with every concatenation :func:`concatenations_in_place` finds written by its producers; those sites."""
    sites = concatenations_in_place(mod)
    if not sites:
        return mod, []
    functions = dict(mod.functions)
    variants: dict[tuple[str, tuple[int, ...], int, int], tvm.ir.GlobalVar] = {}
    replaced: dict[relax.Var, relax.VarBinding] = {}
    for site in sites:
        whole = site.concat.var.ty
        previous: relax.Var | None = None
        for producer, offset in site.producers:
            call = producer.value
            name = call.args[0].name_hint
            key = (name, tuple(int(d) for d in whole.shape), site.axis, offset)
            if key not in variants:
                into = write_into(mod[name], key[1], site.axis, offset)
                gv = global_for(f"{name}_into{len(variants)}", into, call.args[0])
                functions[gv] = into.with_attr("global_symbol", gv.name_hint)
                variants[key] = gv
            args = list(call.args[1].fields)
            value = (
                relax.op.call_tir(variants[key], relax.Tuple(args), whole) if previous is None
                else relax.op.call_tir_inplace(variants[key], relax.Tuple([*args, previous]), [len(args)], [whole])
            )
            var = type(producer.var)(producer.var.name, whole)
            replaced[producer.var] = relax.VarBinding(var, value)
            previous = var
        replaced[site.concat.var] = relax.VarBinding(site.concat.var, previous)
    functions[mod.get_global_var("main")] = _rebind(mod["main"], replaced)
    updated = relax.transform.DeadCodeElimination()(tvm.IRModule(functions, attrs=mod.attrs))
    return updated, sites


def write_into(func: tirx.PrimFunc, whole: tuple[int, ...], axis: int, offset: int) -> tirx.PrimFunc:
    """``func`` (one output, its last parameter) writing its output into the stretch of a ``whole``-shaped tensor
    that starts at ``offset`` along ``axis``: its last parameter becomes that tensor, seen through a strided view."""
    output = func.params[-1]
    strides = [1] * len(whole)
    for n in range(len(whole) - 2, -1, -1):
        strides[n] = strides[n + 1] * whole[n + 1]
    target = tirx.decl_buffer(whole, output.dtype, name=f"{output.name}_whole")
    view = tirx.decl_buffer(list(output.shape), output.dtype, name=output.name, data=target.data, strides=strides,
                            elem_offset=offset * strides[axis])
    body = tvm_ffi.structural_map(func.body, (type(output), lambda var: view if var.same_as(output) else var))
    return tirx.PrimFunc([*func.params[:-1], target], tirx.SeqStmt([tirx.DeclBuffer(view, data=target.data), body]),
                         func.ret_type, func.attrs)


def _producers(
    concat: relax.VarBinding, bindings: list[relax.VarBinding], position: dict[relax.Var, int], uses: Counter[relax.Var],
    mod: tvm.IRModule,
) -> list[relax.VarBinding] | None:
    """The bindings of the concatenation's inputs, in its order, where each is a one-output call whose result only
    the concatenation reads; else None."""
    args = list(concat.value.args[1].fields)
    found = []
    for arg in args:
        if not isinstance(arg, relax.Var) or arg not in position or uses[arg] != 1:
            return None
        producer = bindings[position[arg]]
        callee = _call_tir_callee(producer.value)
        if callee is None or not isinstance(mod[callee], tirx.PrimFunc) or len(producer.value.ty_args) != 1:
            return None
        if not isinstance(producer.var.ty, relax.TensorType):
            return None
        found.append(producer)
    return found


def _offsets(inputs: list[relax.Var], axis: int) -> list[int]:
    """Where each input starts along ``axis`` in the concatenation of them all."""
    offsets, at = [], 0
    for var in inputs:
        offsets.append(at)
        at += int(var.ty.shape[axis])
    return offsets


def _call_tir_callee(value: relax.Expr) -> tvm.ir.GlobalVar | None:
    """The PrimFunc a plain ``call_tir`` calls (with a tuple of arguments), or None for anything else."""
    if not isinstance(value, relax.Call) or not value.op.same_as(tvm.ir.Op.get("relax.call_tir")):
        return None
    if not isinstance(value.args[0], tvm.ir.GlobalVar) or not isinstance(value.args[1], relax.Tuple):
        return None
    return value.args[0]


def _bindings(main: relax.Function) -> list[relax.VarBinding]:
    body = main.body
    if not isinstance(body, relax.SeqExpr):
        return []
    return [binding for block in body.blocks for binding in block.bindings if isinstance(binding, relax.VarBinding)]


def _uses(main: relax.Function, bindings: list[relax.VarBinding]) -> Counter[relax.Var]:
    """How many times each variable is read: by a binding (once per appearance) or by the function's result."""
    uses: Counter[relax.Var] = Counter()
    for binding in bindings:
        tvm_ffi.structural_walk(binding.value, ((relax.Var, relax.DataflowVar), lambda var: uses.update([var])))
    for var in relax.analysis.free_vars(main.body.body):
        uses[var] += 1
    return uses


def _rebind(main: relax.Function, replaced: dict[relax.Var, relax.VarBinding]) -> relax.Function:
    """``main`` with each binding of a variable in ``replaced`` replaced by its new binding, in place."""
    blocks = []
    for block in main.body.blocks:
        bindings = [replaced.get(b.var, b) if isinstance(b, relax.VarBinding) else b for b in block.bindings]
        blocks.append(relax.DataflowBlock(bindings) if isinstance(block, relax.DataflowBlock) else relax.BindingBlock(bindings))
    body = relax.SeqExpr(blocks, main.body.body)
    return relax.Function(main.params, body, main.ret_ty, main.is_pure, main.attrs)
