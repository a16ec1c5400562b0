"""The precision a model is compiled in: as its file has it, or its products in float16 or bfloat16 with float32 sums.

``fp16`` and ``bf16`` cast the operands of float32 convolutions and matrix
products to float16 or bfloat16, the weights once at compile time, and sum
them in float32 (as tensor cores do, and OpenVINO's bf16 inference precision
on CPUs with bf16 dot products); every other operator computes in float32,
so a softmax's and a normalization's statistics stay in float32. A
depthwise convolution, which sums no channels, reads its input in the
narrow type and keeps its weight in float32. A tensor that a product reads
is stored once, in the narrow type, and its other readers (a residual
connection) read that and widen it, so that its producer's task writes one
output and no task of its own casts it; one that reshapes, transposes,
splits and concatenations alone make from tensors that nothing else reads
(attention's queries, keys and values; MixNet's channel groups; Inception's
branches) is made from those tensors stored narrow. A tensor that something
else reads through no product stays float32 for that reader: a layer norm's
output that the residual connection also reads is cast by a task of its own
rather than rounding the residual stream, which deep models carry to their
outputs. The model's
inputs and outputs keep their types, and its outputs are checked with the
precision's tolerance (``TOLERANCES``). A target names the precisions it offers
(``TargetSpec.precisions``); another is refused before tuning starts. An
ONNX file whose tensors are already float16 is compiled as it is.
"""

from __future__ import annotations

from collections import Counter

import tvm
from tvm import relax

from probtune.defaults import PRECISIONS
from probtune.errors import TuningConfigError
from probtune.interfaces import TargetSpec
from probtune.model.concat_in_place import variable_uses
from probtune.model.transposes import static_shape
from probtune.plugins import get_registry

__all__ = ["PRECISIONS", "TOLERANCES", "check_precision", "convert_precision"]

TOLERANCES = {"fp32": (1e-3, 1e-3), "fp16": (1e-2, 1e-2), "bf16": (5e-2, 5e-1)}
"""(rtol, atol as a share of the output's RMS) per precision: float16 keeps 11 bits, so a product of hundreds of
terms rounded at each layer drifts by about 1e-3 relative per layer, 1e-2 over a deep model. bfloat16 keeps 8 bits:
OpenVINO's own bf16 outputs of image classifiers on random inputs lie up to a quarter of the RMS from float32's
(1-3% for transformers), so bf16 allows twice that; a wrong program is off by about the whole RMS."""

_NARROW = {"fp16": "float16", "bf16": "bfloat16"}
"""The type a precision's products read their operands in."""

_LAYOUT_OPS = ("relax.reshape", "relax.permute_dims", "relax.nn.max_pool1d", "relax.nn.max_pool2d", "relax.nn.max_pool3d")
"""Operators that only lay values out or pick one of them, which move narrow values as well as wide ones: rounding
keeps order, so the largest of rounded values is the rounded largest."""

_CONVOLUTIONS = ("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d")
_PRODUCTS = (*_CONVOLUTIONS, "relax.matmul")


def check_precision(precision: str, target: TargetSpec) -> None:
    """TuningConfigError unless ``precision`` is one of ``PRECISIONS`` that ``target`` offers."""
    if precision not in PRECISIONS:
        raise TuningConfigError(f"unknown precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if precision not in target.precisions:
        offering = sorted(name for name, spec in get_registry().targets.items() if precision in spec.precisions)
        raise TuningConfigError(
            f"target {target.name!r} does not offer precision {precision}: choose one of "
            f"{', '.join(target.precisions)}, or a target that offers {precision} here ({', '.join(offering) or 'none'})"
        )


def convert_precision(mod: tvm.IRModule, precision: str) -> tvm.IRModule:
    """``mod`` in ``precision`` (one of ``PRECISIONS``); TuningConfigError for another."""
    if precision not in PRECISIONS:
        raise TuningConfigError(f"unknown precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return mod
    return relax.transform.FoldConstant()(_narrow_products(mod, _NARROW[precision]))


def _float32(expr: relax.Expr) -> bool:
    return isinstance(expr.ty, relax.TensorType) and str(expr.ty.dtype) == "float32"


def _product(call: relax.Call) -> bool:
    """Whether ``call`` is a convolution or matrix product of two float32 tensors."""
    name = str(getattr(call.op, "name", ""))
    return name in _PRODUCTS and len(call.args) == 2 and all(_float32(arg) for arg in call.args)


def _narrowed_operands(call: relax.Call) -> tuple[bool, bool]:
    """Which operands of a float32 product are read in the narrow type: both, but a depthwise convolution's (one input
    channel per group) weight stays float32. Its sums run over its taps alone and gain nothing from narrow dot
    products, and converting its weight at every use costs more than reading it in float32."""
    attrs, weight = call.attrs, static_shape(getattr(call.args[1].ty, "shape", None))
    if "conv" not in str(call.op.name) or int(attrs.groups) == 1 or weight is None:
        return True, True
    return True, weight[str(attrs.kernel_layout).index("I")] > 1


def _product_operands(func: relax.Function) -> Counter[relax.Expr]:
    """The variables that a float32 product in ``func`` reads in the narrow type, with how many such reads."""
    operands: Counter[relax.Expr] = Counter()

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Call) and _product(expr):
            read = _narrowed_operands(expr)
            operands.update(arg for arg, narrow in zip(expr.args, read) if narrow and isinstance(arg, relax.Var))

    relax.analysis.post_order_visit(func, visit)
    return operands


def _moved_from(value: relax.Expr, bound: dict[relax.Expr, relax.Expr]) -> list[relax.Expr]:
    """The float32 variables the function computes that ``value`` only moves: a reshape's, a transpose's, a max
    pooling's or a split's input, the split a part of it is taken from, or a concatenation's inputs; none for anything
    else."""
    if isinstance(value, relax.TupleGetItem):
        split = bound.get(value.tuple_value)
        splits = isinstance(split, relax.Call) and _op(split) == "relax.split" and bool(_moved_from(split, bound))
        return [value.tuple_value] if splits else []
    if isinstance(value, relax.Call) and _op(value) == "relax.concat" and isinstance(value.args[0], relax.Tuple):
        return [field for field in value.args[0].fields if field in bound and _float32(field)]
    if not isinstance(value, relax.Call) or _op(value) not in (*_LAYOUT_OPS, "relax.split"):
        return []
    return [value.args[0]] if value.args[0] in bound and _float32(value.args[0]) else []


def _layout_sources(
    func: relax.Function, operands: Counter[relax.Expr]
) -> tuple[dict[relax.Expr, relax.Expr], set[relax.Expr]]:
    """The reshape, transpose, split part or concatenation making each product operand, and each variable such steps
    make it from, out of other float32 variables the function computes that nothing else reads: narrowed before them,
    those variables' producers store them narrow and the steps move narrow values. A variable something else reads (a
    residual connection) stays float32 for that reader, and so does a parameter (no task of the function would store
    its copy); a concatenation casts such an input alone. Returns the steps by the variable they make, and the
    variables stored narrow."""
    bindings = [b for block in func.body.blocks for b in block.bindings]
    bound, uses = {b.var: b.value for b in bindings}, variable_uses(func, bindings)
    layouts = {var: (value, sources) for var, value in bound.items() if (sources := _moved_from(value, bound))}
    narrowed = set(operands)
    changed = True
    while changed:
        changed = False
        for source in {s for var, (_, made) in layouts.items() if var in narrowed for s in made} - narrowed:
            readers = [var for var, (_, made) in layouts.items()
                       if var in narrowed and any(s.same_as(source) for s in made)]
            if len(readers) + operands[source] == uses[source]:
                narrowed.add(source)
                changed = True
    # a step moves narrow values wherever what it reads is stored narrow, also where a product reads that directly
    steps = {var: value for var, (value, made) in layouts.items() if var in narrowed and any(s in narrowed for s in made)}
    # a split whose parts are narrowed splits its input's narrow copy, also where the input itself stays float32
    splits = {var: value for var, (value, _) in layouts.items()
              if var in narrowed and isinstance(value, relax.Call) and _op(value) == "relax.split"}
    return {**splits, **steps}, narrowed | {split.args[0] for split in splits.values()}


def _op(call: relax.Call) -> str:
    return str(getattr(call.op, "name", ""))


def _narrow_products(mod: tvm.IRModule, dtype: str) -> tvm.IRModule:
    """``mod`` with its float32 convolutions and matrix products on ``dtype`` operands, summed in float32."""
    mutator = _NarrowProducts(mod, dtype)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            operands = _product_operands(func)
            mutator.sources, mutator.operands = _layout_sources(func, operands)
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    return relax.transform.DeadCodeElimination()(mutator.builder_.get())  # the float32 views narrowed copies replace


@relax.expr_functor.mutator
class _NarrowProducts(relax.PyExprMutator):  # type: ignore[misc]
    """Casts the operands of each float32 convolution and matrix product to ``dtype``, and has every other reader of
    an operand variable read its narrow copy widened (see the module docstring)."""

    def __init__(self, mod: tvm.IRModule, dtype: str) -> None:
        super().__init__(mod)
        self.dtype = dtype
        self.operands: set[relax.Expr] = set()  # the function's variables stored narrow: products read them
        self.sources: dict[relax.Expr, relax.Expr] = {}  # such a variable -> the reshape, transpose or part making it
        self.copies: dict[relax.Expr, relax.Expr] = {}  # operand variable -> its one narrow copy

    def visit_dataflow_block_(self, block: relax.DataflowBlock) -> relax.BindingBlock:
        self.copies = {}  # a copy is a variable of its own block
        return super().visit_dataflow_block_(block)

    def visit_binding_block_(self, block: relax.BindingBlock) -> relax.BindingBlock:
        self.copies = {}
        return super().visit_binding_block_(block)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        new = super().visit_call_(call)
        if not _product(new):
            args = [self.widened(old, arg) for old, arg in zip(call.args, new.args)]
            changed = any(not a.same_as(b) for a, b in zip(args, new.args))
            return relax.Call(new.op, args, new.attrs, new.ty_args) if changed else new
        x, y = (self.narrowed(old, arg) if narrow else arg
                for old, arg, narrow in zip(call.args, new.args, _narrowed_operands(new)))
        name = str(new.op.name)
        if name == "relax.matmul":
            return relax.op.matmul(x, y, out_dtype="float32")
        attrs = new.attrs
        convolution = getattr(relax.op.nn, name.removeprefix("relax.nn."))
        return convolution(
            x, y, attrs.strides, attrs.padding, attrs.dilation, attrs.groups,
            attrs.data_layout, attrs.kernel_layout, attrs.out_layout, "float32",
        )

    def narrowed(self, old: relax.Expr, arg: relax.Expr) -> relax.Expr:
        """``arg`` (``old`` before this pass) cast to the narrow type: for an operand variable, its one copy, which a
        reshape, transpose or concatenation makes from its inputs' copies where those are stored narrow too."""
        if old not in self.operands:
            return self.builder_.emit(relax.op.astype(arg, self.dtype))
        if old not in self.copies and old in self.sources:
            self.copies[old] = self.builder_.emit(self.moved(self.sources[old]))
        if old not in self.copies:
            self.copies[old] = self.builder_.emit(relax.op.astype(arg, self.dtype))
        return self.copies[old]

    def moved(self, step: relax.Expr) -> relax.Expr:
        """The layout step ``step`` (of ``_layout_sources``) moving the narrow copies of what it reads."""
        if isinstance(step, relax.TupleGetItem):
            return relax.TupleGetItem(self.narrowed(step.tuple_value, self.visit_expr(step.tuple_value)), step.index)
        if _op(step) == "relax.concat":
            fields = [self.narrowed(field, self.visit_expr(field)) for field in step.args[0].fields]
            return relax.Call(step.op, [relax.Tuple(fields)], step.attrs)
        source = step.args[0]
        return relax.Call(step.op, [self.narrowed(source, self.visit_expr(source)), *step.args[1:]], step.attrs)

    def widened(self, old: relax.Expr, arg: relax.Expr) -> relax.Expr:
        """``arg`` as a reader other than a product reads it: an operand variable's narrow copy, widened."""
        if isinstance(old, relax.Tuple) and isinstance(arg, relax.Tuple):
            fields = [self.widened(o, a) for o, a in zip(old.fields, arg.fields)]
            return arg if all(f.same_as(a) for f, a in zip(fields, arg.fields)) else relax.Tuple(fields)
        if old not in self.operands:
            return arg
        return self.builder_.emit(relax.op.astype(self.narrowed(old, arg), "float32"))
