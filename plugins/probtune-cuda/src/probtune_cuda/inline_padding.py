"""Padding computed where it is read: a GPU thread predicates the load, so a padded copy is no kernel of its own.

``auto-inline`` keeps a padding block (``if_then_else`` of an input's load
and a constant) apart in a function that reduces, because on a CPU the branch
in the innermost loop costs vectorization. On a GPU each thread evaluates its
own condition, and a padded copy of its own costs a kernel launch and a round
trip of the whole padded tensor through memory (a max pool's, a depthwise
convolution's). ``gpu-inline-padding`` runs after the tilings went through
the padding's readers (consumers come first): the tensor cores have already
taken a convolution's padding into their shared-memory copy, and what is left
(a pooling window, a thread-tiled convolution's copy) reads the input through
the condition. MetaSchedule's AutoInline allows ``if_then_else`` on CUDA for
the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx

from probtune.plugin import BlockRV, Schedule, SpaceContext, allows, at_root, is_spatial

__all__ = ["GPUInlinePadding", "is_padding"]


def is_padding(sblock: s_tir.SBlock) -> bool:
    """Whether the block stores ``if_then_else(condition, input[...], constant)`` (either way round)."""
    body = sblock.body
    if not isinstance(body, tirx.BufferStore) or not isinstance(body.value, tvm.ir.Call):
        return False
    call = body.value
    if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "prim.if_then_else"):
        return False
    values = list(call.args[1:])
    loads = [v for v in values if isinstance(v, tvm.ir.expr.TensorLoad)]
    constants = [v for v in values if isinstance(v, (tirx.IntImm, tirx.FloatImm))]
    return len(loads) == 1 and len(constants) == 1


@dataclass(frozen=True)
class GPUInlinePadding:
    """Inline a padding block still at the root into the blocks that read it."""

    name: str = "gpu-inline-padding"

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> None:
        raw, block_rv = sch.tvm, sch.resolve(block)
        sblock = raw.get(block_rv)
        if not (at_root(raw, block_rv) and is_spatial(sblock) and len(sblock.writes) == 1 and is_padding(sblock)):
            return
        if allows(raw, lambda trial: trial.compute_inline(block_rv)):
            sch.compute_inline(block)
