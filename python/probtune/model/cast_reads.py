"""A narrowing cast that only products read, computed in the products' reads of its float32 source.

The precision pass casts a float32 tensor that a product reads in float16 or
bfloat16 (:mod:`probtune.model.precision`). Where something else reads the
tensor in float32 too and its producer is elementwise (in MobileBERT, a
residual add that fusion joins to the product before it, whose output the
next residual add reads too), the cast stays a call of its own
(:mod:`probtune.model.cast_outputs` joins casts only to reductions and
products); so does the cast of a model's float32 input. On a target whose products copy each operand tile into fast
memory (a GPU's shared memory), the cast costs nothing there: after FuseOps,
each product's call that reads the cast is made a primitive function of the
float32 tensor that casts it first (:func:`~probtune.model.prologues.join_producers`),
and the product's space inlines the cast into its copy. The product reads
float32 instead of float16; the cast's task (on a GPU, its kernel) and its
round trip through memory are gone. A target asks for it with
``TargetSpec.casts_in_product_reads``.
"""

from __future__ import annotations

import functools

import tvm
from tvm import tirx

from probtune.model.cast_outputs import narrowing_cast
from probtune.model.part_reads import only_products_read
from probtune.model.prologues import join_producers, primfuncs_of
from probtune.schedule.analysis import only_store

__all__ = ["CAST_READS", "narrows", "read_casts_in_products"]

CAST_READS = "cast-reads"
"""The name under which the fused module counts the product calls that cast an operand themselves."""


def read_casts_in_products(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` (after FuseOps) with each narrowing cast that only products read computed inside them; how many product
    calls do."""
    casts = functools.partial(only_products_read, is_copy=narrows)
    return join_producers(mod, casts, lambda reader, _: "fused_cast_" + reader.name_hint.removeprefix("fused_"))


def narrows(mod: tvm.IRModule, gvar: tvm.ir.GlobalVar) -> bool:
    """Whether ``gvar`` (a PrimFunc, or a primitive function of calls) narrows one tensor's values and at most lays
    them out: a narrowing cast, alone or fused with reshapes and transposes."""
    funcs = [mod[inner] for inner in primfuncs_of(mod, gvar)]
    one_input = isinstance(mod[gvar], tirx.PrimFunc) or len(mod[gvar].params) == 1
    return one_input and any(narrowing_cast(f) for f in funcs) and all(narrowing_cast(f) or _moves(f) for f in funcs)


def _moves(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` is one block that stores its one input's values, unchanged, at other indices (a reshape, a
    transpose)."""
    if len(func.params) != 2 or str(func.params[0].dtype) != str(func.params[1].dtype):
        return False
    store = only_store(func)
    load = store.value if store is not None else None
    return isinstance(load, tvm.ir.expr.TensorLoad) and load.source.same_as(func.params[0])
