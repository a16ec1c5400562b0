"""A part of a stacked tensor that only products read, taken inside each product's function instead of a call of its own.

A graph rewrite that stacks products of the same input into one (a
transformer's queries, keys and values computed by one product) leaves each
part as a copy of a slice along the stacked axis. TVM's
FuseOps does not fuse such an injective step into a product that reads it, so
each copy would be a task (a kernel) of its own. After FuseOps and before
FuseTIR, each product's call that reads a part is made a primitive function of
the stacked tensor that takes the part first: FuseTIR makes it one PrimFunc,
whose space inlines the copy into the product's reads. Only a copy of one
index of the leading axis or of a slice (:func:`is_part`) is moved, only where products
alone read it, so that no other operator is computed twice.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, tirx

from probtune.model.concat_in_place import variable_uses
from probtune.schedule.analysis import only_store

__all__ = ["PART_READS", "is_part", "read_parts_in_products"]

PART_READS = "part-reads"
"""The name under which the fused module counts the product calls that take their parts themselves."""

_PRODUCT = 4
"""TVM's operator pattern kOutEWiseFusable: a product or convolution (with its elementwise epilogue, once fused)."""


def is_part(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` is one block copying a part of its source to ``result[i...]``: ``source[c, i...]`` for a
    constant ``c`` (one index of a stacked axis), or ``source[i + c...]`` for constants ``c`` (a slice)."""
    if len(func.params) != 2:
        return False
    source, result = func.params
    if str(source.dtype) != str(result.dtype) or len(source.shape) not in (len(result.shape), len(result.shape) + 1):
        return False
    store = only_store(func)
    if store is None:
        return False
    load = store.value
    if not (store.buffer.same_as(result) and isinstance(load, tvm.ir.expr.TensorLoad) and load.source.same_as(source)):
        return False
    indices = list(load.indices)
    if len(indices) > len(store.indices) and not isinstance(indices.pop(0), tirx.IntImm):
        return False
    return all(_offset(index, var) for index, var in zip(indices, store.indices))


def _offset(index: tirx.PrimExpr, var: tirx.PrimExpr) -> bool:
    """Whether ``index`` is ``var`` or ``var`` plus a constant."""
    if tvm_ffi.structural_equal(index, var):
        return True
    return isinstance(index, tirx.Add) and isinstance(index.b, tirx.IntImm) and tvm_ffi.structural_equal(index.a, var)


def _callee(mod: tvm.IRModule, value: relax.Expr) -> tuple[tvm.ir.GlobalVar, list[relax.Expr]] | None:
    """The function a ``call_tir`` or a primitive function's call calls, with its tensor arguments."""
    if not isinstance(value, relax.Call):
        return None
    if isinstance(value.op, tvm.ir.GlobalVar) and isinstance(mod[value.op], relax.Function):
        return value.op, list(value.args)
    if value.op.same_as(tvm.ir.Op.get("relax.call_tir")) and len(value.args) == 2:
        if isinstance(value.args[1], relax.Tuple) and isinstance(mod[value.args[0]], tirx.PrimFunc):
            return value.args[0], list(value.args[1].fields)
    return None


def _is_product(mod: tvm.IRModule, gvar: tvm.ir.GlobalVar) -> bool:
    """Whether ``gvar`` is a product: a PrimFunc of that pattern, or a primitive function calling one."""
    func = mod[gvar]
    if isinstance(func, tirx.PrimFunc):
        return bool(func.attrs) and int(func.attrs.get("op_pattern", -1)) == _PRODUCT
    if not (func.attrs and func.attrs.get("Primitive")):
        return False
    inner = [_callee(mod, b.value) for block in func.body.blocks for b in block.bindings]
    return any(found is not None and _is_product(mod, found[0]) for found in inner)


def _parts(mod: tvm.IRModule, func: relax.Function) -> dict[relax.Var, relax.Call]:
    """Each part (:func:`is_part`) of ``func`` that only products read, with the call that copies it."""
    bindings = [b for block in func.body.blocks if isinstance(block, relax.DataflowBlock) for b in block.bindings]
    uses = variable_uses(func, bindings)
    copies = {}
    for binding in bindings:
        found = _callee(mod, binding.value)
        if found is not None and isinstance(mod[found[0]], tirx.PrimFunc) and is_part(mod[found[0]]):
            copies[binding.var] = binding.value
    read: dict[relax.Var, int] = {}
    for binding in bindings:
        found = _callee(mod, binding.value)
        if found is not None and _is_product(mod, found[0]):
            for arg in found[1]:
                if arg in copies:
                    read[arg] = read.get(arg, 0) + 1
    return {var: copy for var, copy in copies.items()
            if isinstance(var, relax.DataflowVar) and read.get(var, 0) == uses[var]}


@relax.expr_functor.mutator
class _ReadParts(relax.PyExprMutator):  # type: ignore[misc]
    """Drops the calls copying ``parts`` and has each product that reads one take it itself."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.mod = mod
        self.parts: dict[relax.Var, relax.Call] = {}
        self.count = 0

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if binding.var in self.parts:
            return
        found = _callee(self.mod, binding.value)
        if found is None or not any(arg in self.parts for arg in found[1]):
            super().visit_var_binding_(binding)
            return
        gvar, args = found
        sources = list(dict.fromkeys(self.parts[a].args[1].fields[0] if a in self.parts else a for a in args))
        joined = self._joined(gvar, args, binding.value, sources)
        new = self.builder_.emit(relax.Call(joined, [self.visit_expr(s) for s in sources]), str(binding.var.name))
        self.set_var_remap(binding.var, new)
        self.count += 1

    def _joined(self, gvar: tvm.ir.GlobalVar, args: list[relax.Expr], call: relax.Call,
                sources: list[relax.Expr]) -> tvm.ir.GlobalVar:
        """A primitive function of ``sources`` that copies the parts among ``args`` and computes ``gvar`` of them."""
        params = [relax.Var(f"p{n}", source.ty) for n, source in enumerate(sources)]
        param_of = dict(zip(sources, params))
        body = relax.BlockBuilder()
        with body.function("joined", params, attrs={"Primitive": True}, private=True):
            with body.dataflow():
                values = []
                for arg in args:
                    copy = self.parts.get(arg)
                    if copy is None:
                        values.append(param_of[arg])
                        continue
                    source = param_of[copy.args[1].fields[0]]
                    values.append(body.emit(relax.op.call_tir(copy.args[0], relax.Tuple([source]), copy.ty_args[0])))
                result = self._inlined(body, gvar, values, call)
                out = body.emit_output(result)
            body.emit_func_output(out)
        name = "fused_part_" + gvar.name_hint.removeprefix("fused_")
        return self.builder_.add_func(body.get()["joined"], name)

    def _inlined(self, body: relax.BlockBuilder, gvar: tvm.ir.GlobalVar, values: list[relax.Expr],
                 call: relax.Call) -> relax.Expr:
        """``gvar`` of ``values`` in ``body``: its ``call_tir``, or a primitive function's bindings."""
        func = self.mod[gvar]
        if isinstance(func, tirx.PrimFunc):
            out_ty = list(call.ty_args) if len(call.ty_args) > 1 else call.ty_args[0]
            return body.emit(relax.op.call_tir(gvar, relax.Tuple(values), out_ty))
        bound = func.bind_params(dict(zip(func.params, values)))
        for block in bound.body.blocks:
            for binding in block.bindings:
                body.emit_normalized(binding)
        return bound.body.body


def read_parts_in_products(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` (after FuseOps) with each part that only products read taken inside them; how many product calls do."""
    mutator = _ReadParts(mod)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function) and not (func.attrs and func.attrs.get("Primitive")):
            mutator.parts = _parts(mod, func)
            if mutator.parts:
                mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    if not mutator.count:
        return mod, 0
    return relax.transform.DeadCodeElimination()(mutator.builder_.get()), mutator.count
