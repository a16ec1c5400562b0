"""The precision a model is compiled in: as its file has it, or its products in float16 or bfloat16 with float32 sums.

``fp16`` casts the weights and activations of convolutions and matrix
products to float16 with float32 sums (TVM's ``ToMixedPrecision`` with float32
accumulation), and leaves in float32 what that pass keeps there (softmax and
normalization statistics). ``bf16`` casts only the operands of float32
convolutions and matrix products to bfloat16, the weights once at compile
time, and sums them in float32 (as OpenVINO's bf16 inference precision does
on CPUs with bf16 dot products); every other operator computes in float32. A
depthwise convolution, which sums no channels, reads its input in bfloat16 and
keeps its weight in float32. A tensor that a product reads is stored once, in
bfloat16, and its other readers (a residual connection) read that and widen
it, so that its producer's task writes one output and no task of its own casts
it. The model's
inputs and outputs keep their types, and its outputs are checked with the
precision's tolerance (``TOLERANCES``). A target names the precisions it offers
(``TargetSpec.precisions``); another is refused before tuning starts.
"""

from __future__ import annotations

import tvm
from tvm import relax

from probtune.defaults import PRECISIONS
from probtune.errors import TuningConfigError
from probtune.interfaces import TargetSpec
from probtune.model.transposes import static_shape
from probtune.plugins import get_registry

__all__ = ["PRECISIONS", "TOLERANCES", "check_precision", "convert_precision"]

TOLERANCES = {"fp32": (1e-3, 1e-3), "fp16": (1e-2, 1e-2), "bf16": (5e-2, 5e-1)}
"""(rtol, atol as a share of the output's RMS) per precision: float16 keeps 11 bits, so a product of hundreds of
terms rounded at each layer drifts by about 1e-3 relative per layer, 1e-2 over a deep model. bfloat16 keeps 8 bits:
OpenVINO's own bf16 outputs of image classifiers on random inputs lie up to a quarter of the RMS from float32's
(1-3% for transformers), so bf16 allows twice that; a wrong program is off by about the whole RMS."""

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
    if precision == "bf16":
        return relax.transform.FoldConstant()(_bf16_products(mod))
    return relax.transform.ToMixedPrecision(out_dtype="float32")(mod)


def _float32(expr: relax.Expr) -> bool:
    return isinstance(expr.ty, relax.TensorType) and str(expr.ty.dtype) == "float32"


def _product(call: relax.Call) -> bool:
    """Whether ``call`` is a convolution or matrix product of two float32 tensors."""
    name = str(getattr(call.op, "name", ""))
    return name in _PRODUCTS and len(call.args) == 2 and all(_float32(arg) for arg in call.args)


def _bf16_operands(call: relax.Call) -> tuple[bool, bool]:
    """Which operands of a float32 product are read in bfloat16: both, but a depthwise convolution's (one input channel
    per group) weight stays float32. Its sums run over its taps alone and gain nothing from bfloat16 dot products,
    and converting its weight at every use costs more than reading it in float32."""
    attrs, weight = call.attrs, static_shape(getattr(call.args[1].ty, "shape", None))
    if "conv" not in str(call.op.name) or int(attrs.groups) == 1 or weight is None:
        return True, True
    return True, weight[str(attrs.kernel_layout).index("I")] > 1


def _product_operands(func: relax.Function) -> set[relax.Expr]:
    """The variables that a float32 product in ``func`` reads in bfloat16."""
    operands: set[relax.Expr] = set()

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Call) and _product(expr):
            read = _bf16_operands(expr)
            operands.update(arg for arg, bf16 in zip(expr.args, read) if bf16 and isinstance(arg, relax.Var))

    relax.analysis.post_order_visit(func, visit)
    return operands


def _bf16_products(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its float32 convolutions and matrix products on bfloat16 operands, summed in float32."""
    mutator = _BF16Products(mod)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.operands = _product_operands(func)
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    return mutator.builder_.get()


@relax.expr_functor.mutator
class _BF16Products(relax.PyExprMutator):  # type: ignore[misc]
    """Casts the operands of each float32 convolution and matrix product to bfloat16, and has every other reader of an
    operand variable read its bfloat16 copy widened (see the module docstring)."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.operands: set[relax.Expr] = set()  # the function's variables that a product reads
        self.copies: dict[relax.Expr, relax.Expr] = {}  # operand variable -> its one bfloat16 copy

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
        x, y = (self.bfloat16(old, arg) if bf16 else arg for old, arg, bf16 in zip(call.args, new.args, _bf16_operands(new)))
        name = str(new.op.name)
        if name == "relax.matmul":
            return relax.op.matmul(x, y, out_dtype="float32")
        attrs = new.attrs
        convolution = getattr(relax.op.nn, name.removeprefix("relax.nn."))
        return convolution(
            x, y, attrs.strides, attrs.padding, attrs.dilation, attrs.groups,
            attrs.data_layout, attrs.kernel_layout, attrs.out_layout, "float32",
        )

    def bfloat16(self, old: relax.Expr, arg: relax.Expr) -> relax.Expr:
        """``arg`` (``old`` before this pass) cast to bfloat16: for an operand variable, its one copy."""
        if old not in self.operands:
            return self.builder_.emit(relax.op.astype(arg, "bfloat16"))
        if old not in self.copies:
            self.copies[old] = self.builder_.emit(relax.op.astype(arg, "bfloat16"))
        return self.copies[old]

    def widened(self, old: relax.Expr, arg: relax.Expr) -> relax.Expr:
        """``arg`` as a reader other than a product reads it: an operand variable's bfloat16 copy, widened."""
        if isinstance(old, relax.Tuple) and isinstance(arg, relax.Tuple):
            fields = [self.widened(o, a) for o, a in zip(old.fields, arg.fields)]
            return arg if all(f.same_as(a) for f, a in zip(fields, arg.fields)) else relax.Tuple(fields)
        if old not in self.operands:
            return arg
        return self.builder_.emit(relax.op.astype(self.bfloat16(old, arg), "float32"))
