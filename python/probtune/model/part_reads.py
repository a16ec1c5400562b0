"""A part of a stacked tensor that only products read, taken inside each product's function instead of a call of its own.

A graph rewrite that stacks products of the same input into one (a
transformer's queries, keys and values computed by one product) leaves each
part as a copy of a slice along the stacked axis. TVM's
FuseOps does not fuse such an injective step into a product that reads it, so
each copy would be a task (a kernel) of its own. After FuseOps and before
FuseTIR, each product's call that reads a part is made a primitive function of
the stacked tensor that takes the part first: FuseTIR makes it one PrimFunc,
whose space inlines the copy into the product's reads (:mod:`probtune.model.prologues`). Only a copy of one
index of the leading axis or of a slice (:func:`is_part`) is moved, only where products
alone read it, so that no other operator is computed twice.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import tvm
import tvm_ffi
from tvm import relax, tirx

from probtune.model.concat_in_place import variable_uses
from probtune.model.prologues import callee, join_producers, op_pattern, plain_bindings, primfuncs_of
from probtune.schedule.analysis import only_store

__all__ = ["PART_READS", "is_part", "only_products_read", "read_parts_in_products"]

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


def _copies_a_part(mod: tvm.IRModule, gvar: tvm.ir.GlobalVar) -> bool:
    return isinstance(mod[gvar], tirx.PrimFunc) and is_part(mod[gvar])


def _is_product(mod: tvm.IRModule, gvar: tvm.ir.GlobalVar) -> bool:
    """Whether ``gvar`` is a product: a PrimFunc of that pattern, or a primitive function calling one."""
    return any(op_pattern(mod, inner) == _PRODUCT for inner in primfuncs_of(mod, gvar))


def only_products_read(mod: tvm.IRModule, func: relax.Function, is_copy: Callable[[tvm.IRModule, tvm.ir.GlobalVar], bool]
                       ) -> dict[relax.Var, relax.Call]:
    """Each call in ``func`` of a function that ``is_copy`` accepts whose result only products read, with the call:
    what :func:`~probtune.model.prologues.join_producers` moves into the products."""
    bindings = plain_bindings(func)
    uses = variable_uses(func, bindings)
    copies = {}
    for binding in bindings:
        found = callee(mod, binding.value)
        if found is not None and is_copy(mod, found[0]):
            copies[binding.var] = binding.value
    read: dict[relax.Var, int] = {}
    for binding in bindings:
        found = callee(mod, binding.value)
        if found is not None and _is_product(mod, found[0]):
            for arg in found[1]:
                if arg in copies:
                    read[arg] = read.get(arg, 0) + 1
    return {var: copy for var, copy in copies.items()
            if isinstance(var, relax.DataflowVar) and read.get(var, 0) == uses[var]}


def read_parts_in_products(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` (after FuseOps) with each part that only products read taken inside them; how many product calls do."""
    parts = functools.partial(only_products_read, is_copy=_copies_a_part)
    return join_producers(mod, parts, lambda reader, _: "fused_part_" + reader.name_hint.removeprefix("fused_"))
