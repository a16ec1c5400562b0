"""An elementwise step that only a row reduction reads, computed inside the reduction's function.

An RMS norm as exported (``x * x``, a mean, ``1 / sqrt``, a product with
``x``) or a layer norm written out in operators squares its input before a
mean. TVM annotates a mean (a sum, then a division) as a product's pattern,
and FuseOps fuses no elementwise step into a product's input, so the square
would be a task (on a GPU, a kernel) of its own that writes a whole float32
tensor for the mean to read back. After FuseOps and before FuseTIR, each
elementwise or broadcast call whose only reader is a row reduction (a
reduction in which no input serves several outputs: a mean, a softmax, a norm;
not a matmul or a convolution) is computed inside that reader's function
(:mod:`probtune.model.prologues`); the space inlines it into the reduction.
"""

from __future__ import annotations

import tvm
from tvm import relax

from probtune.model.concat_in_place import variable_uses
from probtune.model.prologues import callee, join_producers, op_pattern, plain_bindings, primfuncs_of, single_result_primfunc
from probtune.schedule.analysis import is_spatial, program_blocks, reuses_data

__all__ = ["REDUCTION_INPUTS", "is_row_reduction", "reduction_inputs"]

REDUCTION_INPUTS = "reduction-inputs"
"""The name under which the fused module counts the row reductions that compute their elementwise inputs."""

_BROADCAST = 1
"""TVM's operator pattern kBroadcast: kinds up to it (elementwise, broadcast) are moved into their reader."""


def is_row_reduction(mod: tvm.IRModule, gvar: tvm.ir.GlobalVar) -> bool:
    """Whether ``gvar`` (a PrimFunc, or a primitive function of calls) reduces somewhere, and no reduction of it reads
    an input whose elements serve several outputs (as a matmul's or a convolution's do)."""
    blocks = [block for inner in primfuncs_of(mod, gvar) for block in program_blocks(mod[inner])]
    reductions = [block for block in blocks if not is_spatial(block)]
    return bool(reductions) and not any(reuses_data(block, unit_iterators=False) for block in reductions)


def _elementwise(mod: tvm.IRModule, value: relax.Expr) -> bool:
    """Whether ``value`` is a ``call_tir`` of one result to a PrimFunc of an elementwise or broadcast pattern."""
    gvar = single_result_primfunc(mod, value)
    pattern = op_pattern(mod, gvar) if gvar is not None else None
    return pattern is not None and 0 <= pattern <= _BROADCAST


def _inputs(mod: tvm.IRModule, func: relax.Function) -> dict[relax.Var, relax.Call]:
    """Each elementwise call of ``func`` that one row reduction's call alone reads, with that call."""
    bindings = plain_bindings(func)
    uses = variable_uses(func, bindings)
    steps = {b.var: b.value for b in bindings if isinstance(b.var, relax.DataflowVar) and _elementwise(mod, b.value)}
    chosen: dict[relax.Var, relax.Call] = {}
    for binding in bindings:
        found = callee(mod, binding.value)
        if found is None or binding.var in steps or not any(arg in steps for arg in found[1]):
            continue
        if not is_row_reduction(mod, found[0]):
            continue
        for var in dict.fromkeys(arg for arg in found[1] if arg in steps):
            if sum(arg.same_as(var) for arg in found[1]) == uses[var]:
                chosen[var] = steps[var]
    return chosen


def reduction_inputs(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` (after FuseOps) with each elementwise step that a row reduction alone reads computed inside it; how
    many reductions' calls do."""
    def name(reader: tvm.ir.GlobalVar, producers: list[tvm.ir.GlobalVar]) -> str:
        return "_".join(["fused", *(gvar.name_hint.removeprefix("fused_") for gvar in [*producers, reader])])

    return join_producers(mod, _inputs, name)
