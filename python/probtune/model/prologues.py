"""Producer calls taken inside the one call that reads them: the join behind part reads and reduction inputs.

TVM's FuseOps leaves some producers apart from their only reader (a copy
before a product, an elementwise step before a mean), so each would be a
task (on a GPU, a kernel) of its own. After FuseOps and before FuseTIR,
:func:`join_producers` makes each such reader a primitive function of the
producers' inputs that computes the producers first; FuseTIR makes it one
PrimFunc, whose space inlines the producers into the reads. Which producers
move is the caller's choice (:mod:`probtune.model.part_reads`,
:mod:`probtune.model.reduction_inputs`, :mod:`probtune.model.narrow_outputs`).
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import relax, tirx

__all__ = ["Choose", "Name", "callee", "join_producers", "op_pattern", "plain_bindings", "primfuncs_of", "single_result_primfunc"]

Choose = Callable[[tvm.IRModule, relax.Function], dict[relax.Var, relax.Call]]
"""Picks, in a Relax function of the module, the producers to move: each call's variable and call (a ``call_tir``, or
a primitive function's call after FuseOps)."""

Name = Callable[[tvm.ir.GlobalVar, list[tvm.ir.GlobalVar]], str]
"""Names the joined function from the reader's function and the producers' (the task's name)."""


def callee(mod: tvm.IRModule, value: relax.Expr) -> tuple[tvm.ir.GlobalVar, list[relax.Expr]] | None:
    """The function a ``call_tir`` or a primitive function's call calls, with its tensor arguments."""
    if not isinstance(value, relax.Call):
        return None
    if isinstance(value.op, tvm.ir.GlobalVar) and isinstance(mod[value.op], relax.Function):
        return value.op, list(value.args)
    if value.op.same_as(tvm.ir.Op.get("relax.call_tir")) and len(value.args) == 2:
        if isinstance(value.args[1], relax.Tuple) and isinstance(mod[value.args[0]], tirx.PrimFunc):
            return value.args[0], list(value.args[1].fields)
    return None


def single_result_primfunc(mod: tvm.IRModule, value: relax.Expr) -> tvm.ir.GlobalVar | None:
    """The PrimFunc a plain ``call_tir`` with one tensor result calls, or None."""
    found = callee(mod, value)
    if found is None or not isinstance(mod[found[0]], tirx.PrimFunc) or len(value.ty_args) != 1:
        return None
    return found[0] if isinstance(value.ty_args[0], relax.TensorType) else None


def primfuncs_of(mod: tvm.IRModule, gvar: tvm.ir.GlobalVar) -> list[tvm.ir.GlobalVar]:
    """``gvar`` if it is a PrimFunc; the PrimFuncs a primitive function calls (after FuseOps); else none."""
    func = mod[gvar]
    if isinstance(func, tirx.PrimFunc):
        return [gvar]
    if not (func.attrs and func.attrs.get("Primitive")):
        return []
    inner = [callee(mod, b.value) for block in func.body.blocks for b in block.bindings]
    return [g for found in inner if found is not None for g in primfuncs_of(mod, found[0])]


def op_pattern(mod: tvm.IRModule, gvar: tvm.ir.GlobalVar) -> int | None:
    """The operator pattern TVM annotated ``gvar``'s PrimFunc with (elementwise 0 ... opaque 8), or None."""
    attrs = mod[gvar].attrs
    pattern = attrs.get("op_pattern") if attrs else None
    return None if pattern is None else int(pattern)


def plain_bindings(func: relax.Function) -> list[relax.VarBinding]:
    """The bindings of ``func``'s dataflow blocks, in order."""
    return [b for block in func.body.blocks if isinstance(block, relax.DataflowBlock) for b in block.bindings]


@relax.expr_functor.mutator
class _JoinProducers(relax.PyExprMutator):  # type: ignore[misc]
    """Drops the calls of ``producers`` and has each call that reads one compute it itself."""

    def __init__(self, mod: tvm.IRModule, name: Name, inputs_first: bool) -> None:
        super().__init__(mod)
        self.mod = mod
        self.name = name
        self.inputs_first = inputs_first
        self.producers: dict[relax.Var, relax.Call] = {}
        self.count = 0

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if binding.var in self.producers:
            return
        found = callee(self.mod, binding.value)
        if found is None or not any(arg in self.producers for arg in found[1]):
            super().visit_var_binding_(binding)
            return
        gvar, args = found
        sources = list(dict.fromkeys(
            source for arg in args for source in (self._producer(arg)[1] if arg in self.producers else [arg])
        ))
        if self.inputs_first:  # the order in which the joined body first reads them, as FuseOps orders parameters
            produced = {source for arg in args if arg in self.producers for source in self._producer(arg)[1]}
            sources = [s for s in sources if s in produced] + [s for s in sources if s not in produced]
        joined = self._joined(gvar, args, binding.value, sources)
        new = self.builder_.emit(relax.Call(joined, [self.visit_expr(s) for s in sources]), str(binding.var.name))
        self.set_var_remap(binding.var, new)
        self.count += 1

    def _joined(self, gvar: tvm.ir.GlobalVar, args: list[relax.Expr], call: relax.Call,
                sources: list[relax.Expr]) -> tvm.ir.GlobalVar:
        """A primitive function of ``sources`` that computes the producers among ``args``, then ``gvar`` of them."""
        params = [relax.Var(f"p{n}", source.ty) for n, source in enumerate(sources)]
        param_of = dict(zip(sources, params))
        body = relax.BlockBuilder()
        with body.function("joined", params, attrs={"Primitive": True}, private=True):
            with body.dataflow():
                values = []
                for arg in args:
                    if arg not in self.producers:
                        values.append(param_of[arg])
                        continue
                    function, inputs = self._producer(arg)
                    values.append(self._inlined(body, function, [param_of[i] for i in inputs], self.producers[arg]))
                result = self._inlined(body, gvar, values, call)
                out = body.emit_output(result)
            body.emit_func_output(out)
        producers = [self._producer(arg)[0] for arg in dict.fromkeys(args) if arg in self.producers]
        return self.builder_.add_func(body.get()["joined"], self.name(gvar, producers))

    def _producer(self, var: relax.Var) -> tuple[tvm.ir.GlobalVar, list[relax.Expr]]:
        """The function the producer of ``var`` calls, and the tensors it reads."""
        found = callee(self.mod, self.producers[var])
        assert found is not None  # a chosen producer is a call of a function
        return found

    def _inlined(self, body: relax.BlockBuilder, gvar: tvm.ir.GlobalVar, values: list[relax.Expr],
                 call: relax.Call) -> relax.Expr:
        """``gvar`` of ``values`` in ``body``: its ``call_tir``, or a primitive function's bindings (with variables of
        their own, so that a function inlined twice binds each once)."""
        func = self.mod[gvar]
        if isinstance(func, tirx.PrimFunc):
            out_ty = list(call.ty_args) if len(call.ty_args) > 1 else call.ty_args[0]
            return body.emit(relax.op.call_tir(gvar, relax.Tuple(values), out_ty))
        func = relax.utils.copy_with_new_vars(func)
        bound = func.bind_params(dict(zip(func.params, values)))
        for block in bound.body.blocks:
            for binding in block.bindings:
                body.emit_normalized(binding)
        return bound.body.body


def join_producers(mod: tvm.IRModule, choose: Choose, name: Name, inputs_first: bool = False
                   ) -> tuple[tvm.IRModule, int]:
    """``mod`` (after FuseOps) with the producers ``choose`` picks computed inside the calls that read them, each such
    reader a primitive function that ``name`` names; how many readers were joined. With ``inputs_first`` the joined
    function takes the producers' inputs before the reader's own: the function FuseOps makes where it fuses the
    producers itself, and so the same task.

    ``choose`` must pick only calls (:func:`callee`) bound to dataflow variables that nothing but other calls read."""
    mutator = _JoinProducers(mod, name, inputs_first)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function) and not (func.attrs and func.attrs.get("Primitive")):
            mutator.producers = choose(mod, func)
            if mutator.producers:
                mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    if not mutator.count:
        return mod, 0
    return relax.transform.DeadCodeElimination()(mutator.builder_.get()), mutator.count
