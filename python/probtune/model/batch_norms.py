"""Inference batch norms with constant statistics written as a multiply and an add, before a model's graph rewrites.

Relax's batch norm is one operator returning a tuple, lowered late
(:mod:`probtune.model.legalize`). After a matrix product that an exporter
reshapes around (LeViT's linear layers and their BatchNorm1d: the tokens
flattened to 2-D for the norm and back), the reshape between them ends the
product's kernel, and no rewrite carries a reshape past an operator that is
not elementwise. As a multiply and an add by per-channel constants, the
scale ``gamma / sqrt(var + eps)`` and shift ``beta - mean * scale``
computed once in float64, the norm is elementwise: the graph rewrites see
through it (``sink-reshapes`` on the GPU) and fusion joins it to the
product's epilogue, as it does after a convolution.
"""

from __future__ import annotations

import tvm
from tvm import relax

from probtune.model.legalize import batch_norm_affine
from probtune.model.transposes import mutated

__all__ = ["AFFINE_BATCH_NORMS", "affine_batch_norms"]

AFFINE_BATCH_NORMS = "affine-batch-norms"
"""The name under which the fused module counts the batch norms written as a multiply and an add."""


@relax.expr_functor.mutator
class _AffineBatchNorms(relax.PyExprMutator):  # type: ignore[misc]
    """Binds a batch norm's normalized output (item 0 of its tuple) to ``data * scale + shift``."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.batch_norm = tvm.ir.Op.get("relax.nn.batch_norm")
        self.changed = 0

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        affine = self._affine(binding.value)
        if affine is None:
            super().visit_var_binding_(binding)
            return
        self.changed += 1
        self.set_var_remap(binding.var, self.builder_.emit(affine, str(binding.var.name)))

    def _affine(self, value: relax.Expr) -> relax.Expr | None:
        """``value`` as a multiply and an add where it is item 0 of a batch norm that has an affine form."""
        if not isinstance(value, relax.TupleGetItem) or value.index != 0 or not isinstance(value.tuple_value, relax.Var):
            return None
        call = self.lookup_binding(value.tuple_value)
        if not isinstance(call, relax.Call) or not call.op.same_as(self.batch_norm):
            return None
        found = batch_norm_affine(call)
        if found is None:
            return None
        dtype = str(call.args[0].ty.dtype)
        scale, shift = (relax.const(x.astype(dtype), dtype) for x in found)
        data = self.visit_expr(call.args[0])
        return relax.op.add(relax.op.multiply(data, scale), shift)


def affine_batch_norms(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` with its inference batch norms of constant statistics as a multiply and an add; how many."""
    mutator = _AffineBatchNorms(mod)
    return mutated(mod, mutator), mutator.changed
