"""A narrowing cast of a tensor that other tasks also read, written by the tensor's producer as a second output.

Where a product reads a tensor in float16 or bfloat16 and a residual
connection reads the same tensor in float32 (a transformer's layer norm), the
precision pass casts it in a call of its own (:mod:`probtune.model.precision`):
a task that reads the whole tensor back only to round it. Joined to its
producer in a Relax primitive function, TVM's FuseTIR makes the two one
PrimFunc that writes both, so the cast is computed where the value is and
costs no task of its own (on a GPU, no kernel launch).

The join runs after operator patterns are annotated and before fusion, which
treats the joined call as opaque. So it joins only a producer that fusion
would not have joined to anything: a reduction or product (a layer norm),
which fusion extends only through elementwise readers, while the cast feeds
a product. An elementwise producer (a residual add, MobileBERT's NoNorm)
fuses into the product before it instead, and its cast stays a call.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, tirx

from probtune.model.concat_in_place import variable_uses
from probtune.model.prologues import op_pattern, single_result_primfunc
from probtune.schedule.analysis import only_store

__all__ = ["CAST_OUTPUTS", "join_cast_outputs", "narrowing_cast"]

CAST_OUTPUTS = "cast-outputs"
"""The name under which the fused module counts the casts joined to their producers."""

_NARROW = ("float16", "bfloat16")

_INJECTIVE = 2
"""TVM's operator pattern kInjective: kinds up to it (elementwise, broadcast, injective) fuse into their producer."""


def _unfused_producer(mod: tvm.IRModule, value: relax.Expr) -> bool:
    """Whether ``value`` is a one-output ``call_tir`` that fusion would not join to its own producer: a reduction or
    a product, not an elementwise, broadcast or injective step (which fuses into the product before it)."""
    callee = single_result_primfunc(mod, value)
    pattern = op_pattern(mod, callee) if callee is not None else None
    return pattern is not None and pattern > _INJECTIVE


def narrowing_cast(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` is one block that casts its one float32 input, element by element, to float16 or bfloat16."""
    if len(func.params) != 2:
        return False
    source, result = func.params
    if str(source.dtype) != "float32" or str(result.dtype) not in _NARROW or list(source.shape) != list(result.shape):
        return False
    store = only_store(func)
    if store is None:
        return False
    cast = store.value
    return (
        store.buffer.same_as(result) and isinstance(cast, tvm.ir.prim.expr.Cast)
        and isinstance(cast.value, tvm.ir.expr.TensorLoad) and cast.value.source.same_as(source)
        and _same_indices(store.indices, cast.value.indices)
    )


def _same_indices(a: list[tirx.PrimExpr], b: list[tirx.PrimExpr]) -> bool:
    return len(a) == len(b) and all(tvm_ffi.structural_equal(x, y) for x, y in zip(a, b))


def _joins(mod: tvm.IRModule, func: relax.Function) -> dict[relax.Var, relax.VarBinding]:
    """Each variable of ``func`` that a reduction or product (:func:`_unfused_producer`) makes and something besides
    a narrowing cast reads, mapped to the binding of its (first) cast."""
    bindings = [b for block in func.body.blocks if isinstance(block, relax.DataflowBlock) for b in block.bindings]
    uses, made = variable_uses(func, bindings), {b.var for b in bindings if _unfused_producer(mod, b.value)}
    joins: dict[relax.Var, relax.VarBinding] = {}
    for binding in bindings:
        callee = single_result_primfunc(mod, binding.value)
        if callee is None or not narrowing_cast(mod[callee]):
            continue
        (source,) = binding.value.args[1].fields
        if (source in made and source not in joins and uses[source] > 1
                and all(isinstance(var, relax.DataflowVar) for var in (source, binding.var))):
            joins[source] = binding
    return joins


@relax.expr_functor.mutator
class _JoinCastOutputs(relax.PyExprMutator):  # type: ignore[misc]
    """Replaces each joined producer and cast (``joins``, :func:`_joins`) by one call of a primitive function that
    returns both."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.joins: dict[relax.Var, relax.VarBinding] = {}
        self.casts: set[relax.Var] = set()
        self.count = 0

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if binding.var in self.casts:  # emitted with its producer
            return
        if binding.var not in self.joins:
            super().visit_var_binding_(binding)
            return
        cast = self.joins[binding.var]
        producer = self.builder_.normalize(self.visit_expr(binding.value))
        joined = self.builder_.emit(relax.Call(self._primitive(producer, cast.value), list(producer.args[1].fields)))
        for var, index in ((binding.var, 0), (cast.var, 1)):
            self.set_var_remap(var, self.builder_.emit(relax.TupleGetItem(joined, index), str(var.name)))
        self.count += 1

    def _primitive(self, producer: relax.Call, cast: relax.Call) -> tvm.ir.GlobalVar:
        """A primitive function of the producer's arguments returning its result and the result's cast, added to the
        module; FuseTIR makes it one PrimFunc."""
        params = [relax.Var(f"p{n}", arg.ty) for n, arg in enumerate(producer.args[1].fields)]
        body = relax.BlockBuilder()
        with body.function("joined", params, attrs={"Primitive": True}, private=True):
            with body.dataflow():
                value = body.emit(relax.op.call_tir(producer.args[0], relax.Tuple(params), producer.ty_args[0]))
                narrow = body.emit(relax.op.call_tir(cast.args[0], relax.Tuple([value]), cast.ty_args[0]))
                result = body.emit_output(relax.Tuple([value, narrow]))
            body.emit_func_output(result)
        name = f"fused_{producer.args[0].name_hint}_{cast.args[0].name_hint}"
        return self.builder_.add_func(body.get()["joined"], name)


def join_cast_outputs(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` (legalized, its PrimFuncs' patterns annotated) with each narrowing cast of a tensor that something
    else reads joined to its producer; how many were."""
    mutator = _JoinCastOutputs(mod)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function) and not (func.attrs and func.attrs.get("Primitive")):
            mutator.joins = _joins(mod, func)
            mutator.casts = {binding.var for binding in mutator.joins.values()}
            if mutator.joins:
                mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    return mutator.builder_.get(), mutator.count
