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

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, tirx

from probtune.model.concatenation import concatenation_axis
from probtune.model.inplace import bindings_of
from probtune.model.prepack import global_for

__all__ = [
    "CONCAT_IN_PLACE_ATTR", "Site", "aligned", "concatenations_in_place", "variable_uses", "write_concatenations_in_place",
    "write_into",
]

CONCAT_IN_PLACE_ATTR = "probtune_concat_in_place"
"""Set on a fused module (:func:`probtune.model.tasks.fuse`) whose target writes concatenations in place
(``TargetSpec.concat_in_place``), to the target's ``view_alignment``: its tasks and its compile both read it."""


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
    graph = _Graph(mod, int(mod.attrs[CONCAT_IN_PLACE_ATTR]))
    sites: list[Site] = []
    for binding in graph.bindings:
        site = graph.site(binding)
        if site is not None and not any(p.var.same_as(s.concat.var) for p, _ in site.producers for s in sites):
            sites.append(site)  # an input that is itself concatenated in place keeps that one only
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
            gv = _variant(mod, functions, variants, producer.value.args[0], whole, site.axis, offset)
            args = list(producer.value.args[1].fields)
            value = (
                relax.op.call_tir(gv, relax.Tuple(args), whole) if previous is None
                else relax.op.call_tir_inplace(gv, relax.Tuple([*args, previous]), [len(args)], [whole])
            )
            var = type(producer.var)(producer.var.name, whole)
            replaced[producer.var] = relax.VarBinding(var, value)
            previous = var
        replaced[site.concat.var] = relax.VarBinding(site.concat.var, previous)
    functions[mod.get_global_var("main")] = _rebind(mod["main"], replaced)
    updated = relax.transform.DeadCodeElimination()(tvm.IRModule(functions, attrs=mod.attrs))
    return updated, sites


def _variant(
    mod: tvm.IRModule, functions: dict[tvm.ir.GlobalVar, tvm.ir.BaseFunc],
    variants: dict[tuple[str, tuple[int, ...], int, int], tvm.ir.GlobalVar], callee: tvm.ir.GlobalVar,
    whole: relax.TensorType, axis: int, offset: int,
) -> tvm.ir.GlobalVar:
    """The global of ``callee``'s program writing into ``whole`` at ``offset``, added to ``functions`` when new."""
    key = (callee.name_hint, tuple(int(d) for d in whole.shape), axis, offset)
    if key not in variants:
        into = write_into(mod[callee], key[1], axis, offset)
        gv = global_for(f"{callee.name_hint}_into{len(variants)}", into, callee)
        functions[gv] = into.with_attr("global_symbol", gv.name_hint)
        variants[key] = gv
    return variants[key]


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


class _Graph:
    """``main``'s bindings in order, where each variable is bound, and how many times each is read."""

    def __init__(self, mod: tvm.IRModule, alignment: int) -> None:
        self.mod = mod
        self.alignment = alignment
        self.bindings = [b for b in bindings_of(mod["main"]) if isinstance(b, relax.VarBinding)]
        self.uses = variable_uses(mod["main"], self.bindings)
        self.position = {binding.var: index for index, binding in enumerate(self.bindings)}
        self._axes: dict[str, int | None] = {}

    def site(self, binding: relax.VarBinding) -> Site | None:
        """``binding`` as a concatenation its producers can write, or None."""
        callee, whole = self.callee(binding), _static_shape(binding.var)
        if callee is None or whole is None:
            return None
        if callee.name_hint not in self._axes:
            self._axes[callee.name_hint] = concatenation_axis(self.mod[callee])
        axis = self._axes[callee.name_hint]
        producers = self.producers(binding) if axis is not None else None
        if axis is None or producers is None:
            return None
        offsets = _offsets([p.var for p in producers], axis)
        if not all(self.keeps_alignment(whole, p.var, axis, offset) for p, offset in zip(producers, offsets)):
            return None
        return Site(binding, axis, tuple(sorted(zip(producers, offsets), key=lambda pair: self.position[pair[0].var])))

    def keeps_alignment(self, whole: tuple[int, ...], part: relax.Var, axis: int, offset: int) -> bool:
        """Whether ``part`` written at ``offset`` along ``axis`` of ``whole`` keeps the target's alignment (:func:`aligned`)."""
        shape = _static_shape(part)
        return shape is not None and aligned(whole, shape, axis, offset, str(part.ty.dtype), self.alignment)

    def producers(self, concat: relax.VarBinding) -> list[relax.VarBinding] | None:
        """The bindings of the concatenation's inputs, in its order, where each is a one-output call whose result
        only the concatenation reads; else None."""
        found = []
        for arg in concat.value.args[1].fields:
            if not isinstance(arg, relax.Var) or arg not in self.position or self.uses[arg] != 1:
                return None
            producer = self.bindings[self.position[arg]]
            if self.callee(producer) is None or len(producer.value.ty_args) != 1 or _static_shape(producer.var) is None:
                return None
            found.append(producer)
        return found

    def callee(self, binding: relax.VarBinding) -> tvm.ir.GlobalVar | None:
        """The PrimFunc a plain ``call_tir`` (a tuple of arguments, no shape arguments) calls, or None."""
        value = binding.value
        if not isinstance(value, relax.Call) or not value.op.same_as(tvm.ir.Op.get("relax.call_tir")):
            return None
        if len(value.args) != 2 or not isinstance(value.args[0], tvm.ir.GlobalVar) or not isinstance(value.args[1], relax.Tuple):
            return None
        return value.args[0] if isinstance(self.mod[value.args[0]], tirx.PrimFunc) else None


def _static_shape(var: relax.Var) -> tuple[int, ...] | None:
    """The shape of a tensor variable whose every dimension is a constant; None for anything else."""
    ty = var.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    dims = list(ty.shape.values) if hasattr(ty.shape, "values") else list(ty.shape)
    return tuple(int(d) for d in dims) if all(isinstance(d, tirx.IntImm) for d in dims) else None


def aligned(whole: tuple[int, ...], part: tuple[int, ...], axis: int, offset: int, dtype: str, alignment: int) -> bool:
    """Whether each element of ``part``, written at ``offset`` along ``axis`` of ``whole``, lies at the same address
    modulo ``alignment`` bytes as in ``part``'s own tensor: the strides of every dimension but the last, in both, and
    the view's start are whole multiples of it. A vector access aligned in the program's own output is then aligned in
    the view (on a GPU, a misaligned one faults)."""
    lanes = max(alignment // tvm.DataType(dtype).itemsize, 1)
    starts = [int(np.prod(part[n + 1 :])) for n in range(len(part) - 1) if part[n] > 1]
    starts += [int(np.prod(whole[n + 1 :])) for n in range(len(whole) - 1) if part[n] > 1]
    starts.append(offset * int(np.prod(whole[axis + 1 :])))
    return all(start % lanes == 0 for start in starts)


def _offsets(inputs: list[relax.Var], axis: int) -> list[int]:
    """Where each input starts along ``axis`` in the concatenation of them all."""
    offsets, at = [], 0
    for var in inputs:
        offsets.append(at)
        at += int(var.ty.shape[axis])
    return offsets


def variable_uses(main: relax.Function, bindings: list[relax.VarBinding]) -> Counter[relax.Var]:
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
