"""Quantized operators computed on integers, as onnxruntime computes them.

A QDQ model (onnxruntime's ``quantize_static``) writes each quantized
convolution or matrix product as ``dequantize -> op -> (add bias) ->
quantize``. TVM's frontend keeps that form, which computes the product in
float32: slower than integers, and not what onnxruntime runs (it fuses the
pattern into ``QLinearConv`` / ``QGemm``), so outputs land one quantization
step apart wherever float32 sums round across a half.

This rewrite computes such an operator as onnxruntime's kernels do: the
8-bit activations times the 8-bit weights summed exactly in int32 (padding
reads the activations' zero point), the zero point's share and the int32 bias
added as one constant per output channel, then the requantization: the sum
converted to float32, multiplied by ``x_scale * w_scale / y_scale`` (in that
order, in float32), rounded to nearest even, offset by the output's zero
point and saturated. Operators outside the pattern (a residual add, pooling)
keep their dequantized float32 form, and so does a pattern whose weights have
a nonzero zero point or whose bias is not quantized with ``x_scale * w_scale``.

A dynamically quantized matrix product (``quantize_dynamic``'s
MatMulInteger, which TVM's frontend widens to int32 on both sides) is
likewise computed on the bytes, its activations' zero point taken off each
column's sum of the weights.

Every quantize and dequantize left with one scale for the whole tensor is
then written as the elementwise operators it computes, which the layout
pass carries through a channels-last model (TVM's layout rules do not know
these two operators, and would leave a transpose pair around each).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant
from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

__all__ = ["INTEGER_OPERATORS", "integer_operators"]

INTEGER_OPERATORS = "integer-operators"
"""The rewrite's name in a tuning result's count of rewritten operators."""

_ACTIVATION = wildcard()
_X_SCALE, _X_ZERO, _W, _W_SCALE, _W_ZERO = is_const(), is_const(), is_const(), is_const(), is_const()
_B, _B_SCALE, _B_ZERO, _Y_SCALE, _Y_ZERO = is_const(), is_const(), is_const(), is_const(), is_const()
_X_DQ = is_op("relax.dequantize")(_ACTIVATION, _X_SCALE, _X_ZERO)
_W_DQ = is_op("relax.dequantize")(_W, _W_SCALE, _W_ZERO)
_CONV = is_op("relax.nn.conv2d")(_X_DQ, _W_DQ)
_W_T = is_op("relax.permute_dims")(_W_DQ)
_MATMUL = is_op("relax.matmul")(_X_DQ, _W_DQ | _W_T)
_PRODUCT = _CONV | _MATMUL
_B_DQ = is_op("relax.dequantize")(_B, _B_SCALE, _B_ZERO)
_BIAS = _B_DQ | is_op("relax.reshape")(_B_DQ, wildcard())
_PATTERN = is_op("relax.quantize")(_PRODUCT | is_op("relax.add")(_PRODUCT, _BIAS), _Y_SCALE, _Y_ZERO)
_A8, _A8_ZERO, _W8, _W8_ZERO = wildcard(), wildcard(), is_const(), is_const()
_A8_SHIFTED = is_op("relax.subtract")(is_op("relax.astype")(_A8), is_op("relax.astype")(_A8_ZERO))
_W8_WIDE = is_op("relax.astype")(_W8)
_MATMUL_INTEGER = is_op("relax.matmul")(
    _A8_SHIFTED, is_op("relax.subtract")(_W8_WIDE, is_op("relax.astype")(_W8_ZERO)) | _W8_WIDE
)
_RUNTIME_SCALE, _SCALE_FACTOR = wildcard(), is_const()
_SCALE_PRODUCT = is_op("relax.multiply")(_RUNTIME_SCALE, _SCALE_FACTOR)
_RESCALE = is_op("relax.multiply")(wildcard(), _SCALE_PRODUCT)
_QUANTIZE = is_op("relax.quantize")(wildcard(), is_const(), is_const())
_DEQUANTIZE = is_op("relax.dequantize")(wildcard(), is_const(), is_const())


def integer_operators(mod: tvm.IRModule) -> tuple[tvm.IRModule, int, list[str]]:
    """``mod`` with each quantized convolution and matrix product computed on integers; how many were, and the
    operators of the quantized ones left in their dequantized float32 form (``relax.nn.conv2d``, ...)."""
    rewritten = 0
    left: list[str] = []

    def counted(build: Callable[[relax.Call, dict], relax.Expr | None]) -> Callable[[relax.Call, dict], relax.Expr]:
        def rewrite(call: relax.Call, matched: dict) -> relax.Expr:
            nonlocal rewritten
            integer = build(call, matched)
            if integer is None:
                left.append(_product_name(call, matched))
                return call
            rewritten += 1
            return integer

        return rewrite

    mod = mod.clone()  # the caller's module (a Model's) stays as it was
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function) and _calls_quantize(func):
            func = relax.dpl.rewrite_call(_PATTERN, counted(_integer_call), func)
            func = relax.dpl.rewrite_call(_MATMUL_INTEGER, counted(_byte_matmul), func)
            func = relax.dpl.rewrite_call(_RESCALE, _lifted_scale, func)
            func = relax.dpl.rewrite_call(_QUANTIZE, _elementwise_quantize, func)
            mod[gv] = relax.dpl.rewrite_call(_DEQUANTIZE, _elementwise_dequantize, func)
    if rewritten:
        mod = relax.transform.DeadCodeElimination()(mod)
    return mod, rewritten, left


def _product_name(call: relax.Call, matched: dict[DFPattern, relax.Expr]) -> str:
    """The operator a matched pattern quantizes: ``relax.nn.conv2d`` or ``relax.matmul``."""
    for pattern in (_CONV, _MATMUL):
        if pattern in matched:
            return str(matched[pattern].op.name)
    return str(call.op.name)


def _calls_quantize(func: relax.Function) -> bool:
    """Whether the function quantizes anything (statically, or at run time as DynamicQuantizeLinear does)."""
    found = []
    relax.analysis.post_order_visit(
        func.body, lambda e: found.append(e) if isinstance(e, relax.Call) and e.op == tvm.ir.Op.get("relax.quantize") else None
    )
    return bool(found)


def _byte_matmul(call: relax.Call, matched: dict[DFPattern, relax.Expr]) -> relax.Expr | None:
    """MatMulInteger as the frontend writes it (both sides widened to int32, zero points subtracted) on the bytes.

    ``sum((a - za) * w) = sum(a * w) - za * sum(w)``: the product of the 8-bit
    tensors summed in int32, less the activations' zero point (a scalar,
    computed at run time by DynamicQuantizeLinear) times each column's sum of
    the weights, a constant. Only for uint8 activations and int8 weights whose
    zero points are 0, the form ``quantize_dynamic`` writes.
    """
    a, a_zero, weights = matched[_A8], matched[_A8_ZERO], matched[_W8].value.numpy()
    w_zero = matched[_W8_ZERO].value.numpy() if _W8_ZERO in matched else np.zeros(1, np.int8)
    if (
        a.ty.dtype != "uint8"
        or weights.dtype != np.int8
        or weights.ndim != 2
        or np.any(w_zero != 0)
        or any(int(d) != 1 for d in a_zero.ty.shape)
        or str(call.attrs.out_dtype) != "int32"
    ):
        return None
    column_sums = weights.astype(np.int32).sum(axis=0)
    acc = relax.op.matmul(a, relax.const(weights), out_dtype="int32")
    zero = relax.op.reshape(relax.op.astype(a_zero, "int32"), ())
    return relax.op.subtract(acc, relax.op.multiply(zero, relax.const(column_sums)))


def _lifted_scale(call: relax.Call, matched: dict[DFPattern, relax.Expr]) -> relax.Expr:
    """``x * (s * c)`` with a scalar constant ``c`` (a dynamically quantized product's weight scale times its
    activations' run-time scale) with ``c`` of ``x``'s rank: the same arithmetic, with ``c`` an argument of the
    task rather than a literal in its code, so that the layers of one shape are one task."""
    x, constant = call.args[0], matched[_SCALE_FACTOR]
    if len(constant.ty.shape) != 0 or len(matched[_SCALE_PRODUCT].ty.shape) != 0 or len(x.ty.shape) == 0:
        return call
    lifted = _parameter(float(constant.value.numpy()), constant.value.numpy().dtype.type, x)
    return relax.op.multiply(x, relax.op.multiply(matched[_RUNTIME_SCALE], lifted))


def _values(matched: dict[DFPattern, relax.Expr], pattern: DFPattern) -> np.ndarray:
    return matched[pattern].value.numpy()


def _integer_call(call: relax.Call, matched: dict[DFPattern, relax.Expr]) -> relax.Expr | None:
    """The integer form of the matched operator, or None where it does not compute what onnxruntime's does."""
    x_scale, x_zero = _values(matched, _X_SCALE), _values(matched, _X_ZERO)
    y_scale, y_zero = _values(matched, _Y_SCALE), _values(matched, _Y_ZERO)
    weights, w_scale, w_zero = _values(matched, _W), _values(matched, _W_SCALE), _values(matched, _W_ZERO)
    activation = matched[_ACTIVATION]
    layout = _kernel_layout(matched, weights)
    if (
        layout is None
        or x_scale.size != 1
        or x_zero.size != 1
        or y_zero.size != 1
        or activation.ty.dtype not in ("uint8", "int8")
        or weights.dtype != np.int8
        or np.any(w_zero != 0)
    ):
        return None
    kernel, channel_axis = layout
    channels = kernel.shape[channel_axis]
    zero = int(x_zero.reshape(()))
    product_scale = (np.float32(x_scale.reshape(())) * np.broadcast_to(w_scale.astype(np.float32), (channels,))).astype(
        np.float32
    )
    bias = _integer_bias(matched, product_scale, channels)
    if bias is None:
        return None
    sums = kernel.astype(np.int64).sum(axis=tuple(a for a in range(kernel.ndim) if a != channel_axis))
    shape: tuple[int, ...] = (1, channels, 1, 1) if _CONV in matched else (channels,)
    if _CONV in matched:
        acc = _integer_conv(matched[_CONV], activation, weights, zero)
    else:
        acc = relax.op.matmul(activation, relax.const(kernel), out_dtype="int32")
    total = relax.op.add(acc, relax.const((bias - zero * sums).astype(np.int32).reshape(shape)))
    requant = (product_scale / np.float32(y_scale.reshape(()))).astype(np.float32)
    scaled = relax.op.multiply(relax.op.astype(total, "float32"), relax.const(requant.reshape(shape)))
    return _saturated(relax.op.add(relax.op.round(scaled), _parameter(int(y_zero.reshape(())), np.float32, call)), call)


def _kernel_layout(matched: dict[DFPattern, relax.Expr], weights: np.ndarray) -> tuple[np.ndarray, int] | None:
    """The weights as the integer operator reads them (OIHW; a product's ``[K, N]``) and their output axis, or None
    for a layout or a per-channel scale along another axis than that."""
    w_axis = int(matched[_W_DQ].attrs.axis) if _values(matched, _W_SCALE).size > 1 else None
    if _CONV in matched:
        attrs = matched[_CONV].attrs
        if attrs.kernel_layout != "OIHW" or attrs.data_layout != "NCHW" or w_axis not in (None, 0):
            return None
        return weights, 0
    transposed = _W_T in matched
    if weights.ndim != 2 or w_axis not in (None, 0 if transposed else 1):
        return None
    return (weights.T if transposed else weights), 1


def _saturated(value: relax.Expr, call: relax.Call) -> relax.Expr:
    """``value`` (whole numbers in float32) clipped to the range of the quantize ``call``'s type and cast to it."""
    out_dtype = str(call.attrs.out_dtype)
    info = np.iinfo(out_dtype)
    return relax.op.astype(relax.op.clip(value, int(info.min), int(info.max)), out_dtype)


def _integer_bias(matched: dict[DFPattern, relax.Expr], product_scale: np.ndarray, channels: int) -> np.ndarray | None:
    """The int32 bias per output channel (zeros without one); None if it is not quantized with the product's scale."""
    if _B not in matched:
        return np.zeros(channels, np.int64)
    bias, scale, zero = _values(matched, _B), _values(matched, _B_SCALE), _values(matched, _B_ZERO)
    if bias.dtype != np.int32 or bias.size != channels or np.any(zero != 0):
        return None
    if not np.array_equal(np.broadcast_to(scale.astype(np.float32), (channels,)), product_scale):
        return None
    return bias.reshape(channels).astype(np.int64)


def _integer_conv(conv: relax.Call, activation: relax.Expr, weights: np.ndarray, zero: int) -> relax.Expr:
    """The convolution of the 8-bit activations and weights summed in int32, its padding reading the zero point."""
    attrs = conv.attrs
    padding = [int(p) for p in attrs.padding]
    if zero and any(padding):
        top, left, bottom, right = padding
        activation = relax.op.nn.pad(activation, [0, 0, 0, 0, top, bottom, left, right], pad_value=float(zero))
        padding = [0, 0, 0, 0]
    return relax.op.nn.conv2d(
        activation,
        relax.const(weights),
        strides=[int(s) for s in attrs.strides],
        padding=padding,
        dilation=[int(d) for d in attrs.dilation],
        groups=int(attrs.groups),
        out_dtype="int32",
    )


def _parameter(value: float, dtype: type, like: relax.Expr) -> Constant:
    """``value`` as a constant of one element and ``like``'s rank: passed to its task as an argument, not written
    into its code as a literal, so that the layers of one shape, each with scales of its own, are one task."""
    return relax.const(np.full((1,) * len(like.ty.shape), value, dtype))


def _scalar_parameters(call: relax.Call) -> tuple[Constant, float] | None:
    """The scale (a float32 constant) and zero point of a per-tensor (de)quantize; None for a per-channel one."""
    scale, zero = call.args[1].value.numpy(), call.args[2].value.numpy()
    if scale.size != 1 or zero.size != 1:
        return None
    return _parameter(float(scale.reshape(())), np.float32, call), float(zero.reshape(()))


def _elementwise_quantize(call: relax.Call, _: dict[DFPattern, relax.Expr]) -> relax.Expr:
    """``quantize`` as TVM lowers it (divide, round to nearest even, offset, saturate), in Relax operators."""
    parameters = _scalar_parameters(call)
    out_dtype = str(call.attrs.out_dtype)
    if parameters is None or call.args[0].ty.dtype != "float32" or out_dtype not in ("uint8", "int8"):
        return call
    scale, zero = parameters
    return _saturated(relax.op.add(relax.op.round(relax.op.divide(call.args[0], scale)), _parameter(zero, np.float32, call)), call)


def _elementwise_dequantize(call: relax.Call, _: dict[DFPattern, relax.Expr]) -> relax.Expr:
    """``dequantize`` to float32 as TVM lowers it (offset in int32, then scaled), in Relax operators."""
    parameters = _scalar_parameters(call)
    if parameters is None or call.args[0].ty.dtype not in ("uint8", "int8") or str(call.attrs.out_dtype) != "float32":
        return call
    scale, zero = parameters
    offset = relax.op.subtract(relax.op.astype(call.args[0], "int32"), _parameter(zero, np.int32, call))
    return relax.op.multiply(relax.op.astype(offset, "float32"), scale)
