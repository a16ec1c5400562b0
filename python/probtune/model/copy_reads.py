"""A copy that only products read (a cast to float16, a transpose, a slice), computed in the products' reads.

FuseOps leaves a step that only narrows or moves a tensor's values a call of
its own where a product reads it, since it fuses nothing into a product's
inputs: the precision pass's float16 cast of a tensor that something else
reads in float32 too (in MobileBERT, a residual add's output that the next
residual add also reads; :mod:`probtune.model.cast_outputs` joins casts only
to reductions and products), the cast of a model's float32 input, or the
slice and transpose that take a head's queries, keys or values out of one
stacked product (LeViT's attention). On a target whose products copy each
operand tile into fast memory (a GPU's shared memory), such a step costs
nothing there: after FuseOps, each product's call that reads it is made a
primitive function of the step's input that computes it first
(:func:`~probtune.model.prologues.join_producers`), and the product's space
inlines it into its copy. The step's task (on a GPU, its kernel) and its
round trip through memory are gone; the product reads the wider or strided
source instead. A target asks for it with ``TargetSpec.copies_in_product_reads``.
A reshape alone is left: TVM's VM runs it as a view, no task.
"""

from __future__ import annotations

import functools

import tvm
from tvm import relax, tirx

from probtune.model.cast_outputs import narrowing_cast
from probtune.model.part_reads import only_products_read
from probtune.model.prologues import join_producers, primfuncs_of
from probtune.schedule.analysis import only_store

__all__ = ["COPY_READS", "copies", "read_copies_in_products"]

COPY_READS = "copy-reads"
"""The name under which the fused module counts the product calls that compute an operand's copy themselves."""


def read_copies_in_products(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` (after FuseOps) with each copy (:func:`copies`) that only products read computed inside them; how many
    product calls do."""
    chosen = functools.partial(only_products_read, is_copy=copies)
    return join_producers(mod, chosen, lambda reader, _: "fused_copy_" + reader.name_hint.removeprefix("fused_"))


def copies(mod: tvm.IRModule, gvar: tvm.ir.GlobalVar) -> bool:
    """Whether ``gvar`` (a PrimFunc, or a primitive function of calls) reads one tensor and only narrows or moves its
    values (a float16 cast, a transpose, a slice, a broadcast, alone or fused), and is not a reshape alone."""
    funcs = [mod[inner] for inner in primfuncs_of(mod, gvar)]
    one_input = isinstance(mod[gvar], tirx.PrimFunc) or len(mod[gvar].params) == 1
    if not (one_input and funcs and all(narrowing_cast(f) or _moves(f) for f in funcs)):
        return False
    return not all(relax.analysis.has_reshape_pattern(f) for f in funcs)


def _moves(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` is one block that stores its one input's values, unchanged, at other indices."""
    if len(func.params) != 2 or str(func.params[0].dtype) != str(func.params[1].dtype):
        return False
    store = only_store(func)
    load = store.value if store is not None else None
    return isinstance(load, tvm.ir.expr.TensorLoad) and load.source.same_as(func.params[0])
