"""ONNX's QOperator forms of quantized operators (``QLinearConv``, ``QLinearMatMul``) and ``ConvInteger``, which
TVM 0.27's Relax frontend has no converter for, written as the QDQ form they compute.

``QLinearConv(x, w, B)`` is ``quantize(conv(dequantize(x), dequantize(w)) +
dequantize(B, x_scale * w_scale), y_scale, y_zero_point)``, as ONNX defines
it; :mod:`probtune.model.quantized` then computes that form on integers, as
onnxruntime's kernels do, wherever its weights are constant int8.

``ConvInteger(x, w, x_zero_point, w_zero_point)`` (``quantize_dynamic``'s
form of a convolution: a vision transformer's patch embedding, a speech
encoder's 1-D front end) is the int32 convolution of both operands less
their zero points, padding contributing zero, as ONNX defines it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from tvm import relax
from tvm.ir.expr import Constant

from probtune.errors import ModelImportError

__all__ = ["QUANTIZED_CONVERTERS", "conv_integer", "qlinear_conv", "qlinear_matmul"]


def _axis_of(scale: relax.Expr, axis: int) -> int:
    """The axis a scale applies along: ``axis`` for one scale per channel, 0 (unused) for one per tensor."""
    return axis if len(scale.ty.shape) == 1 and int(scale.ty.shape[0]) > 1 else 0


def _dequantized(x: relax.Expr, scale: relax.Expr, zero: relax.Expr | None, axis: int = 0) -> relax.Expr:
    zero = zero if zero is not None else relax.const(0, x.ty.dtype)
    return relax.op.dequantize(x, scale, zero, axis=_axis_of(scale, axis), out_dtype="float32")


def _quantized(x: relax.Expr, scale: relax.Expr, zero: relax.Expr | None, out_dtype: str) -> relax.Expr:
    zero = zero if zero is not None else relax.const(0, out_dtype)
    return relax.op.quantize(x, scale, zero, axis=0, out_dtype=out_dtype)


def _bias_scale(x_scale: relax.Expr, w_scale: relax.Expr) -> relax.Expr:
    """``x_scale * w_scale``, computed here in float32 when both are constants (as onnxruntime's quantizer wrote the
    bias with it), else in the graph."""
    if isinstance(x_scale, Constant) and isinstance(w_scale, Constant):
        product = np.float32(x_scale.value.numpy().reshape(())) * w_scale.value.numpy().astype(np.float32)
        return relax.const(product.astype(np.float32))
    return relax.op.multiply(x_scale, w_scale)


def _check_convolution(op_type: str, x: relax.Expr, attrs: dict[str, Any], ranks: tuple[int, ...]) -> None:
    """ModelImportError unless ``x`` has one of ``ranks`` and the convolution's padding is explicit (or none)."""
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    rank = len(x.ty.shape)
    if rank not in ranks or auto_pad not in ("NOTSET", "VALID"):
        dims = " and ".join(f"{r - 2}-D" for r in ranks)
        raise ModelImportError(
            f"{op_type} with a {rank}-D input or auto_pad {auto_pad} is not supported ({dims} convolutions with "
            "explicit padding are): export the model with explicit pads"
        )


def qlinear_conv(bb: relax.BlockBuilder, inputs: Sequence[Any], attrs: dict[str, Any], opset: int) -> relax.Expr:
    """ONNX QLinearConv (2-D, explicit or no padding) as dequantize -> conv2d (+ bias) -> quantize."""
    x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero = inputs[:8]
    bias = inputs[8] if len(inputs) > 8 else None
    _check_convolution("QLinearConv", x, attrs, (4,))
    conv = relax.op.nn.conv2d(
        _dequantized(x, x_scale, x_zero),
        _dequantized(w, w_scale, w_zero, axis=0),
        strides=list(attrs.get("strides", [1, 1])),
        padding=list(attrs.get("pads", [0, 0, 0, 0])),
        dilation=list(attrs.get("dilations", [1, 1])),
        groups=int(attrs.get("group", 1)),
    )
    if bias is not None:
        channels = int(w.ty.shape[0])
        dequantized_bias = _dequantized(bias, _bias_scale(x_scale, w_scale), None, axis=0)
        conv = relax.op.add(conv, relax.op.reshape(dequantized_bias, [1, channels, 1, 1]))
    return _quantized(conv, y_scale, y_zero, str(y_zero.ty.dtype) if y_zero is not None else "uint8")


def qlinear_matmul(bb: relax.BlockBuilder, inputs: Sequence[Any], attrs: dict[str, Any], opset: int) -> relax.Expr:
    """ONNX QLinearMatMul as dequantize -> matmul -> quantize (per-column scales of ``b`` along its last axis)."""
    a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero = inputs[:8]
    product = relax.op.matmul(
        _dequantized(a, a_scale, a_zero), _dequantized(b, b_scale, b_zero, axis=len(b.ty.shape) - 1)
    )
    return _quantized(product, y_scale, y_zero, str(y_zero.ty.dtype) if y_zero is not None else "uint8")


def _shifted(x: relax.Expr, zero: relax.Expr | None, channels_axis: int | None = None) -> relax.Expr:
    """``x - zero`` in int32; a zero point per output channel (a 1-D ``zero``) broadcast along ``channels_axis``."""
    wide = relax.op.astype(x, "int32")
    if zero is None:
        return wide
    per_channel = channels_axis is not None and len(zero.ty.shape) == 1 and int(zero.ty.shape[0]) > 1
    zero = relax.op.astype(zero, "int32")
    if per_channel:
        zero = relax.op.reshape(zero, [-1] + [1] * (len(x.ty.shape) - 1))
    return relax.op.subtract(wide, zero)


def conv_integer(bb: relax.BlockBuilder, inputs: Sequence[Any], attrs: dict[str, Any], opset: int) -> relax.Expr:
    """ONNX ConvInteger (1-D or 2-D, explicit or no padding): the int32 convolution of both operands less their zero
    points."""
    x, w = inputs[0], inputs[1]
    x_zero = inputs[2] if len(inputs) > 2 else None
    w_zero = inputs[3] if len(inputs) > 3 else None
    _check_convolution("ConvInteger", x, attrs, (3, 4))
    spatial = len(x.ty.shape) - 2
    conv = relax.op.nn.conv1d if spatial == 1 else relax.op.nn.conv2d
    return conv(
        _shifted(x, x_zero),
        _shifted(w, w_zero, channels_axis=0),
        strides=list(attrs.get("strides", [1] * spatial)),
        padding=list(attrs.get("pads", [0] * 2 * spatial)),
        dilation=list(attrs.get("dilations", [1] * spatial)),
        groups=int(attrs.get("group", 1)),
        out_dtype="int32",
    )


QUANTIZED_CONVERTERS = {"ConvInteger": conv_integer, "QLinearConv": qlinear_conv, "QLinearMatMul": qlinear_matmul}
