"""Lowerings that TVM 0.27's legalization lacks or does less well, passed to its ``LegalizeOps`` before its own.

``ConvertLayout`` moves a transposed convolution that follows a channels-last
convolution to NHWC too, but TVM legalizes ``conv2d_transpose`` only in
NCHW/IOHW: the model would then fail to compile; here every layout the pass
converts to still compiles, without a transpose around the operator. An
inference batch norm with constant statistics becomes a multiply-add with a
scale and shift computed once, where TVM's takes a square root and a division
per element.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import tvm
from tvm import relax, te, topi

__all__ = ["LEGALIZATIONS", "conv2d_transpose_nhwc", "legalize"]


def conv2d_transpose_nhwc(
    data: te.Tensor, kernel: te.Tensor, strides: Sequence[int], padding: Sequence[int],
    output_padding: Sequence[int], dilation: Sequence[int], groups: int, out_dtype: str,
) -> te.Tensor:
    """A transposed convolution of NHWC ``data`` with an IOHW ``kernel`` (in, out / groups, height, width).

    As TOPI's NCHW form computes it: the input dilated by the strides and
    padded, then convolved with the kernel turned by 180 degrees. ``padding``
    is (top, left, bottom, right), as Relax's attributes give it; the other pairs are (height, width).
    """
    batch, _, _, in_channels = data.shape
    _, group_out, kernel_h, kernel_w = (int(d) for d in kernel.shape)
    group_in = int(in_channels) // groups
    span_h, span_w = (kernel_h - 1) * dilation[0] + 1, (kernel_w - 1) * dilation[1] + 1
    top, left, bottom, right = padding
    dilated = topi.nn.dilate(data, [1, strides[0], strides[1], 1], name="data_dilate")
    padded = topi.nn.pad(
        dilated, [0, span_h - 1 - top, span_w - 1 - left, 0],
        [0, span_h - 1 - bottom + output_padding[0], span_w - 1 - right + output_padding[1], 0], name="data_pad",
    )
    out_h, out_w = int(padded.shape[1]) - span_h + 1, int(padded.shape[2]) - span_w + 1
    rc = te.reduce_axis((0, group_in), name="rc")
    rh = te.reduce_axis((0, kernel_h), name="rh")
    rw = te.reduce_axis((0, kernel_w), name="rw")

    def output(b: te.Var, y: te.Var, x: te.Var, c: te.Var) -> te.PrimExpr:
        channel = c // group_out * group_in + rc
        pixel = padded[b, y + rh * dilation[0], x + rw * dilation[1], channel].astype(out_dtype)
        weight = kernel[channel, c % group_out, kernel_h - 1 - rh, kernel_w - 1 - rw].astype(out_dtype)
        return te.sum(pixel * weight, axis=[rc, rh, rw])

    return te.compute((batch, out_h, out_w, group_out * groups), output, name="conv2d_transpose_nhwc")


def _conv2d_transpose(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """NHWC data, IOHW kernel and NHWC output through :func:`conv2d_transpose_nhwc`; any other form as TVM does."""
    attrs = call.attrs
    if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NHWC", "IOHW", "NHWC"):
        return relax.transform.legalize_ops.nn._nn_conv2d_transpose(bb, call)

    def compute(data: te.Tensor, kernel: te.Tensor) -> te.Tensor:
        return conv2d_transpose_nhwc(
            data, kernel, [int(s) for s in attrs.strides], [int(p) for p in attrs.padding],
            [int(p) for p in attrs.output_padding], [int(d) for d in attrs.dilation], int(attrs.groups),
            str(call.ty.dtype),
        )

    return bb.call_te(compute, call.args[0], call.args[1], primfunc_name_hint="conv2d_transpose")


def _batch_norm(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """An inference batch norm with constant statistics as one multiply-add per element.

    The scale ``gamma / sqrt(var + eps)`` and shift ``beta - mean * scale`` are
    computed once here, in float64, instead of a square root and a division
    per element in every call (a convolution's batch norm is already folded
    into its weights by the exporter; one after a concatenation or a pooling
    is not). Any other form as TVM lowers it.
    """
    data, gamma, beta, mean, var = call.args
    stats = (gamma, beta, mean, var)
    if call.attrs.training or not all(isinstance(arg, tvm.ir.expr.Constant) for arg in stats):
        return relax.transform.legalize_ops.nn._nn_batch_norm(bb, call)
    dtype, axis, rank = str(data.ty.dtype), int(call.attrs.axis), len(data.ty.shape)
    g, b, m, v = (arg.value.numpy().astype("float64") for arg in stats)
    scale = g / np.sqrt(v + float(call.attrs.epsilon)) if call.attrs.scale else 1.0 / np.sqrt(v + float(call.attrs.epsilon))
    shift = (b if call.attrs.center else 0.0) - m * scale
    shape = [1] * rank
    shape[axis % rank] = -1
    scale_c, shift_c = (relax.const(x.astype(dtype).reshape(shape), dtype) for x in (scale, shift))
    normalized = bb.call_te(lambda x, s, t: topi.add(topi.multiply(x, s), t), data, scale_c, shift_c,
                            primfunc_name_hint="batch_norm")
    return relax.Tuple([normalized, mean, var])


LEGALIZATIONS: dict[str, Callable[[relax.BlockBuilder, relax.Call], relax.Expr]] = {
    "relax.nn.batch_norm": _batch_norm,
    "relax.nn.conv2d_transpose": _conv2d_transpose,
}
"""Relax operator -> its lowering, for the forms TVM's legalization leaves unlowered."""


def legalize(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every operator lowered to TIR, :data:`LEGALIZATIONS` first and TVM's own for the rest."""
    lowered = relax.transform.LegalizeOps(customize_legalize_map=LEGALIZATIONS)(mod)
    return relax.transform.CanonicalizeBindings()(lowered)  # a tuple built here and read at once: no tuple
