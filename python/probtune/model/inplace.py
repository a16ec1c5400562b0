"""Write a tuned program's output over an input that it reads element for element and that nothing reads afterwards.

A convolution with a residual add (ResNet's blocks, MobileNetV2's inverted
residuals) reads the residual where it writes its output. Storing into a
fresh buffer makes the CPU fetch each output line from memory before
overwriting it; storing over the residual, whose lines the same loop has just
read, does not (onnxruntime's fused Conv+Sum does the same). Such a call
becomes Relax's ``call_tir_inplace`` of a version of the program without its
output parameter, whose output buffer is the residual's
(``PrimFunc.specialize``).

Only where it is safe. In the program, every block that writes the output
reads the input at exactly the one element it writes, no other block reads that
input, and nothing reads the output (no accumulation in it). In the model,
the input is the fresh result of an earlier call (not a model input, a
constant or a view of another tensor), passed once, and no later binding or
the model's result uses it.
"""

from __future__ import annotations

from collections.abc import Iterator

import tvm
import tvm_ffi
from tvm import ir, relax, s_tir, tirx

from probtune.model.prepack import global_for

__all__ = ["bindings_of", "overwritable_inputs", "write_in_place"]

_INPLACE_SUFFIX = "_inplace"


def overwritable_inputs(func: tirx.PrimFunc) -> list[int]:
    """The positions of the inputs that ``func`` (one output, its last parameter) may write its output over."""
    *inputs, output = func.params
    return [
        position
        for position, param in enumerate(inputs)
        if _same_tensor_type(param, output) and _read_where_written(func, param, output)
    ]


def write_in_place(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` with each call that may write over an input (see the module's doc) made in place; how many calls."""
    main = mod["main"]
    positions = {
        gv.name_hint: found
        for gv, func in mod.functions.items()
        if isinstance(func, tirx.PrimFunc) and (found := overwritable_inputs(func))
    }
    calls = _calls_in_place(main, positions)
    if not calls:
        return mod, 0
    functions = dict(mod.functions)
    callees: dict[tuple[str, int], tvm.ir.GlobalVar] = {}
    for name, position in sorted({(name, position) for _, name, position in calls}):
        func = mod[name]
        specialized = func.specialize({func.params[-1]: func.params[position]})
        gv = global_for(f"{name}{_INPLACE_SUFFIX}{position}", specialized, mod.get_global_var(name))
        functions[gv] = specialized.with_attr("global_symbol", gv.name_hint)
        callees[name, position] = gv
    functions[mod.get_global_var("main")] = _InPlace(mod, calls, callees).visit_expr(main)
    updated = relax.transform.DeadCodeElimination()(tvm.IRModule(functions, attrs=mod.attrs))
    return updated, len(calls)


def _same_tensor_type(a: tirx.Var, b: tirx.Var) -> bool:
    """Whether both parameters are buffers of one dtype and shape (a scalar parameter is no buffer)."""
    if not all(isinstance(v.ty, tirx.buffer.BufferType) for v in (a, b)):
        return False
    return str(a.dtype) == str(b.dtype) and bool(tvm_ffi.structural_equal(list(a.shape), list(b.shape)))


def _blocks(func: tirx.PrimFunc) -> list[s_tir.SBlock]:
    found: list[s_tir.SBlock] = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, found.append))
    return found


def _read_where_written(func: tirx.PrimFunc, param: tirx.Var, output: tirx.Var) -> bool:
    """Whether every block writing ``output`` reads ``param`` at the region it writes, and no other access conflicts."""
    wrote = False
    for block in _blocks(func):
        reads_param = [r for r in block.reads if r.source.same_as(param)]
        writes = [w for w in block.writes if w.source.same_as(output)]
        if any(r.source.same_as(output) for r in block.reads) or (writes and block.init is not None):
            return False
        if not writes:
            if reads_param:
                return False  # read by a block that does not write the output: it may see overwritten elements
            continue
        wrote = True
        if len(writes) != 1 or not reads_param:
            return False
        if not _is_point(writes[0]) or not all(tvm_ffi.structural_equal(r.region, writes[0].region) for r in reads_param):
            return False
    return wrote


def _is_point(region: ir.TensorRegion) -> bool:
    """Whether ``region`` is one element (the block's accesses stay inside its declared regions)."""
    return all(isinstance(r.extent, tirx.IntImm) and int(r.extent) == 1 for r in region.region)


def _calls_in_place(main: relax.Function, positions: dict[str, list[int]]) -> list[tuple[relax.Call, str, int]]:
    """The ``call_tir`` calls of ``main`` that may write over an input, each with its callee's name and the input's position."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    bindings = list(bindings_of(main))
    last_use: dict[relax.Var, int] = {}
    for index, binding in enumerate(bindings):
        for var in relax.analysis.free_vars(binding.value):
            last_use[var] = index
    for var in relax.analysis.free_vars(main.body.body):
        last_use[var] = len(bindings)
    fresh = {binding.var for binding in bindings if _is_call_tir(binding.value)}
    calls: list[tuple[relax.Call, str, int]] = []
    for index, binding in enumerate(bindings):
        call = binding.value
        if not isinstance(call, relax.Call) or not call.op.same_as(call_tir) or not isinstance(call.args[1], relax.Tuple):
            continue
        if isinstance(binding.var.ty, relax.TupleType):
            continue  # several outputs: overwritable_inputs reads only a program of one
        name, args = call.args[0].name_hint, list(call.args[1].fields)
        position = next((p for p in positions.get(name, []) if _dead_after(args, p, index, fresh, last_use)), None)
        if position is not None:
            calls.append((call, name, position))
    return calls


def _dead_after(
    args: list[relax.Expr], position: int, index: int, fresh: set[relax.Var], last_use: dict[relax.Var, int]
) -> bool:
    """Whether ``args[position]`` is a fresh tensor, passed once, that no binding after the ``index``-th uses."""
    arg = args[position]
    return (
        isinstance(arg, relax.Var) and arg in fresh and last_use.get(arg) == index and sum(a.same_as(arg) for a in args) == 1
    )


def bindings_of(main: relax.Function) -> Iterator[relax.Binding]:
    """Every binding of ``main``'s body, in order of execution."""
    body = main.body
    if not isinstance(body, relax.SeqExpr):
        return
    for block in body.blocks:
        yield from block.bindings


def _is_call_tir(value: relax.Expr) -> bool:
    """Whether ``value`` is a call that writes a tensor of its own (not a view, an input or a constant)."""
    ops = (tvm.ir.Op.get("relax.call_tir"), tvm.ir.Op.get("relax.call_tir_inplace"))
    return isinstance(value, relax.Call) and any(value.op.same_as(op) for op in ops)


@relax.expr_functor.mutator
class _InPlace(relax.PyExprMutator):  # type: ignore[misc]
    """Replaces each chosen ``call_tir`` by a ``call_tir_inplace`` of the program's in-place version."""

    def __init__(
        self, mod: tvm.IRModule, calls: list[tuple[relax.Call, str, int]], callees: dict[tuple[str, int], tvm.ir.GlobalVar]
    ) -> None:
        super().__init__(mod)
        self.calls = calls
        self.callees = callees

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        chosen = next(((name, position) for c, name, position in self.calls if c.same_as(call)), None)
        if chosen is None:
            return super().visit_call_(call)
        name, position = chosen
        args = relax.Tuple([self.visit_expr(arg) for arg in call.args[1].fields])
        return relax.op.call_tir_inplace(self.callees[name, position], args, [position], list(call.ty_args))
