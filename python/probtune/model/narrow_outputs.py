"""A task writes the narrow value it computed, not its widening; the one task that reads it widens it itself.

In a quantized (QDQ) model a convolution's result is quantized to 8 bits and
dequantized again before its reader. Where that reader is its only one (a
residual add after a downsampling convolution, a pool after the stem, the
final mean), TVM's FuseOps fuses the dequantization into the producer, which
then writes float32: four times the bytes of the 8-bit value, and a task of
its own for a convolution that otherwise matches the rest of its stage. After
FuseOps and before FuseTIR, such a producer returns the narrow value and the
widening steps (elementwise or broadcast calls of that value and constants)
are computed inside its reader's function (:mod:`probtune.model.prologues`),
as FuseOps already places them where the narrow value has several readers.

Readers that would widen an element for several outputs (a product's operand,
which a schedule tiles rather than recomputes) keep the widened tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax, tirx
from tvm.ir.expr import Constant

from probtune.model.concat_in_place import variable_uses
from probtune.model.prologues import Name, callee, join_producers, op_pattern, plain_bindings, single_result_primfunc
from probtune.schedule.analysis import is_one, program_blocks

__all__ = ["NARROW_OUTPUTS", "narrow_outputs"]

NARROW_OUTPUTS = "narrow-outputs"
"""The name under which the fused module counts the tasks that write a narrow value their reader widens."""

_BROADCAST = 1
"""TVM's operator pattern kBroadcast: widening steps are elementwise or broadcast calls."""


@dataclass(frozen=True)
class _Widening:
    """A primitive function's result computed from its narrower value ``narrow`` by ``steps`` (one chain of
    elementwise calls), which read besides that value only the function's parameters ``params``."""

    narrow: relax.Var
    steps: list[relax.VarBinding]
    params: list[relax.Var]


def _bits(var: relax.Var) -> int:
    """The bits of an element of tensor ``var`` (0 for anything else)."""
    ty = var.ty
    return tvm.DataType(ty.dtype).bits if isinstance(ty, relax.TensorType) and ty.dtype else 0


def _step_input(mod: tvm.IRModule, binding: relax.VarBinding, made: dict[relax.Var, relax.VarBinding],
                params: set[relax.Var]) -> relax.Var | None:
    """The one value of its function that ``binding`` reads, if it is an elementwise or broadcast call whose other
    arguments are the function's parameters; else None."""
    gvar = single_result_primfunc(mod, binding.value)
    pattern = op_pattern(mod, gvar) if gvar is not None else None
    if pattern is None or not 0 <= pattern <= _BROADCAST:
        return None
    args = list(binding.value.args[1].fields)
    inputs = [a for a in args if a in made]
    if len(inputs) != 1 or not all(a in made or a in params for a in args):
        return None
    return inputs[0]


def _widening(mod: tvm.IRModule, func: relax.Function) -> _Widening | None:
    """How ``func``'s result widens the narrowest value of the chain of elementwise calls that ends in it, or None."""
    bindings = plain_bindings(func)
    if len(func.body.blocks) != 1 or not bindings or not isinstance(func.body.body, relax.Var):
        return None
    made, uses, params = {b.var: b for b in bindings}, variable_uses(func, bindings), set(func.params)
    result = func.body.body
    current = made.get(result)
    chain: list[relax.VarBinding] = []
    best: tuple[int, int] | None = None  # (bits, steps) of the narrowest cut so far
    while current is not None and (source := _step_input(mod, current, made, params)) is not None:
        chain.append(current)
        same_shape = list(source.ty.shape) == list(result.ty.shape)
        if same_shape and 0 < _bits(source) < _bits(result) and (best is None or _bits(source) < best[0]):
            best = (_bits(source), len(chain))
        if uses[source] != 1:
            break
        current = made[source]
    if best is None:
        return None
    steps = chain[:best[1]][::-1]
    narrow = next(a for a in steps[0].value.args[1].fields if a in made)
    read = dict.fromkeys(a for step in steps for a in step.value.args[1].fields if a in params)
    return _Widening(narrow, steps, list(read))


def _reads_each_once(prim: tirx.PrimFunc, index: int) -> bool:
    """Whether every block of ``prim`` that reads its ``index``-th parameter reads each element for one output: its
    reads use every spatial iterator of more than one value (a pool's or a mean's do, a product's operands do not)."""
    buffer = prim.params[index]
    for block in program_blocks(prim):
        spatial = [iv.var for iv in block.iter_vars
                   if int(iv.iter_type) == tirx.IterVar.DataPar and not is_one(iv.dom.extent)]
        for read in block.reads:
            if not read.source.same_as(buffer):
                continue
            used = [var for r in read.region for var in tirx.analysis.undefined_vars(r.min)]
            if any(not any(var.same_as(u) for u in used) for var in spatial):
                return False
    return True


def _reader_widens_once(mod: tvm.IRModule, gvar: tvm.ir.GlobalVar, index: int) -> bool:
    """Whether the function ``gvar`` (a PrimFunc, or a primitive function of calls) reads its ``index``-th argument
    only in calls of PrimFuncs that read each element for one output (:func:`_reads_each_once`)."""
    func = mod[gvar]
    if isinstance(func, tirx.PrimFunc):
        return _reads_each_once(func, index)
    param = func.params[index]
    readers = [(found[0], found[1]) for b in plain_bindings(func) if (found := callee(mod, b.value)) is not None
               and any(arg.same_as(param) for arg in found[1])]
    return bool(readers) and all(
        isinstance(mod[inner], tirx.PrimFunc) and _reads_each_once(mod[inner], n)
        for inner, args in readers for n, arg in enumerate(args) if arg.same_as(param)
    )


def _splits(mod: tvm.IRModule, main: relax.Function) -> set[relax.Var]:
    """The variables of ``main`` made by a primitive function whose result widens a narrower value
    (:func:`_widening`, its other operands constants) that one call alone reads, without reusing an element."""
    bindings = plain_bindings(main)
    uses = variable_uses(main, bindings)
    readers = {arg: found for b in bindings if (found := callee(mod, b.value)) is not None for arg in found[1]}
    chosen = set()
    for binding in bindings:
        var = binding.var
        if isinstance(var, relax.DataflowVar) and uses[var] == 1 and var in readers and _widens(mod, binding.value):
            reader, args = readers[var]
            if _reader_widens_once(mod, reader, next(n for n, arg in enumerate(args) if arg.same_as(var))):
                chosen.add(var)
    return chosen


def _widens(mod: tvm.IRModule, value: relax.Expr) -> bool:
    """Whether ``value`` calls a primitive function whose result widens a narrower value, with constants."""
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar)):
        return False
    func = mod[value.op]
    if not (isinstance(func, relax.Function) and func.attrs and func.attrs.get("Primitive")):
        return False
    widening = _widening(mod, func)
    operands = dict(zip(func.params, value.args))
    return widening is not None and all(isinstance(operands[p], Constant) for p in widening.params)


def _name(gvars: list[tvm.ir.GlobalVar]) -> str:
    return "_".join(["fused", *(gvar.name_hint.removeprefix("fused_") for gvar in gvars)])


def _narrowed(func: relax.Function, widening: _Widening) -> relax.Function:
    """``func`` without the widening steps: it returns the narrow value."""
    moved = {step.var for step in widening.steps}
    builder = relax.BlockBuilder()
    with builder.function("narrowed", list(func.params), attrs={"Primitive": True}, private=True):
        with builder.dataflow():
            for binding in plain_bindings(func):
                if binding.var not in moved:
                    builder.emit_normalized(binding)
            out = builder.emit_output(widening.narrow)
        builder.emit_func_output(out)
    return builder.get()["narrowed"]


def _widen(widening: _Widening) -> relax.Function:
    """A primitive function of the narrow value and the constants the steps read, that computes the steps."""
    narrow = relax.Var("narrow", widening.narrow.ty)
    params = [relax.Var(f"p{n}", param.ty) for n, param in enumerate(widening.params)]
    remap: dict[relax.Expr, relax.Expr] = {widening.narrow: narrow, **dict(zip(widening.params, params))}
    builder = relax.BlockBuilder()
    with builder.function("widen", [narrow, *params], attrs={"Primitive": True}, private=True):
        with builder.dataflow():
            for step in widening.steps:
                call = step.value
                args = relax.Tuple([remap.get(arg, arg) for arg in call.args[1].fields])
                remap[step.var] = builder.emit(relax.op.call_tir(call.args[0], args, call.ty_args[0]))
            out = builder.emit_output(remap[widening.steps[-1].var])
        builder.emit_func_output(out)
    return builder.get()["widen"]


@relax.expr_functor.mutator
class _Split(relax.PyExprMutator):  # type: ignore[misc]
    """Replaces each chosen call by a call of its narrowed function and a call of its widening steps."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.mod = mod
        self.chosen: set[relax.Var] = set()
        self.widened: set[relax.Var] = set()  # the variables the widening calls bind

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if binding.var not in self.chosen:
            super().visit_var_binding_(binding)
            return
        call = binding.value
        func = relax.utils.copy_with_new_vars(self.mod[call.op])
        widening = _widening(self.mod, func)
        assert widening is not None  # chosen by _splits on the same function
        narrowed = _narrowed(func, widening)
        kept = [b.value.args[0] for b in plain_bindings(narrowed) if single_result_primfunc(self.mod, b.value)]
        steps = [step.value.args[0] for step in widening.steps]
        narrow_gvar = self.builder_.add_func(narrowed, _name(kept))
        widen_gvar = self.builder_.add_func(_widen(widening), _name(steps))
        args = [self.visit_expr(arg) for arg in call.args]
        narrow = self.builder_.emit(relax.Call(narrow_gvar, args), f"{binding.var.name}_narrow")
        operands = [dict(zip(func.params, args))[param] for param in widening.params]
        widened = self.builder_.emit(relax.Call(widen_gvar, [narrow, *operands]))
        self.widened.add(widened)
        self.set_var_remap(binding.var, widened)


def narrow_outputs(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` (after FuseOps) with each task that would write a widened value writing the narrow value, widened
    inside its one reader; how many readers do."""
    split = _Split(mod)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function) and not (func.attrs and func.attrs.get("Primitive")):
            split.chosen = _splits(mod, func)
            if split.chosen:
                split.builder_.update_func(gvar, split.visit_expr(func))
    if not split.widened:
        return mod, 0

    def widening_calls(_: tvm.IRModule, func: relax.Function) -> dict[relax.Var, relax.Call]:
        return {b.var: b.value for b in plain_bindings(func) if b.var in split.widened}

    name: Name = lambda reader, producers: _name([*producers, reader])  # noqa: E731 - the joined task's name
    return join_producers(split.builder_.get(), widening_calls, name, inputs_first=True)
