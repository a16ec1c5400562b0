"""Lowerings that TVM 0.27's legalization lacks or does less well, passed to its ``LegalizeOps`` before its own.

``ConvertLayout`` moves a transposed convolution that follows a channels-last
convolution to NHWC too, but TVM legalizes ``conv2d_transpose`` only in
NCHW/IOHW: the model would then fail to compile; here every layout the pass
converts to still compiles, without a transpose around the operator. An
inference batch norm with constant statistics becomes a multiply-add with a
scale and shift computed once, where TVM's takes a square root and a division
per element. A bilinear upsampling is computed along the width first, for the
input's rows only, then along the height (:func:`bilinear_upsampling`). A power
by a small integer constant (a tanh-GELU's cube) is a product of its base. A
gather clamps its indices (:func:`_take`, registered as TVM's own lowering,
which constant folding uses too). A bfloat16 max pool compares in float32.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
import tvm
from tvm import relax, te, tirx, topi
from tvm.ir.expr import Constant
from tvm.topi.image.resize import get_inx

from probtune.defaults import MAX_PRODUCT_POWER

__all__ = ["LEGALIZATIONS", "SEPARABLE_MODES", "TWO_PASS_LAYOUTS", "batch_norm_affine", "bilinear_upsampling",
           "conv2d_transpose_nhwc",
           "in_two_passes", "legalize", "small_integer_exponent"]

SEPARABLE_MODES = ("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel")
"""Coordinate transformations of a bilinear resize whose source coordinates depend on one output axis each."""

TWO_PASS_LAYOUTS = ("NCHW", "NHWC")
"""The layouts :func:`bilinear_upsampling` resizes in."""

_TVM_POWER = tvm.ir.Op.get("relax.power").get_attr("FLegalize")


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


def batch_norm_affine(call: relax.Call) -> tuple[np.ndarray, np.ndarray] | None:
    """The scale and shift (float64, shaped to broadcast over the data) of an inference batch norm whose statistics
    are constants; None for a training one or one whose statistics are computed."""
    _, gamma, beta, mean, var = call.args
    if call.attrs.training or not all(isinstance(arg, Constant) for arg in (gamma, beta, mean, var)):
        return None
    g, b, m, v = (arg.value.numpy().astype("float64") for arg in (gamma, beta, mean, var))
    eps = float(call.attrs.epsilon)
    scale = g / np.sqrt(v + eps) if call.attrs.scale else 1.0 / np.sqrt(v + eps)
    shift = (b if call.attrs.center else 0.0) - m * scale
    rank = len(call.args[0].ty.shape)
    shape = [1] * rank
    shape[int(call.attrs.axis) % rank] = -1
    return np.broadcast_to(scale, m.shape).reshape(shape), np.broadcast_to(shift, m.shape).reshape(shape)


def _batch_norm(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """An inference batch norm with constant statistics as one multiply-add per element, its scale and shift
    computed once (:func:`batch_norm_affine`) instead of a square root and a division per
    element in every call; any other form as TVM lowers it.

    Most such norms are already a multiply and an add before fusion
    (:mod:`probtune.model.batch_norms`); this lowers those whose statistics
    outputs are read too.
    """
    found = batch_norm_affine(call)
    if found is None:
        return relax.transform.legalize_ops.nn._nn_batch_norm(bb, call)
    data, _, _, mean, var = call.args
    dtype = str(data.ty.dtype)
    scale_c, shift_c = (relax.const(x.astype(dtype), dtype) for x in found)
    normalized = bb.call_te(lambda x, s, t: topi.add(topi.multiply(x, s), t), data, scale_c, shift_c,
                            primfunc_name_hint="batch_norm")
    return relax.Tuple([normalized, mean, var])


def bilinear_upsampling(data: te.Tensor, size: Sequence[int], layout: str, mode: str) -> te.Tensor:
    """A bilinear resize of NCHW or NHWC ``data`` to ``size`` (height, width), in two passes: along the width for
    each input row, then along the height between the two rows each output row reads.

    It computes what TOPI's ``resize2d`` does, value for value: TOPI's
    interpolates between two rows of interpolations along the width, and the
    first pass computes exactly those. TOPI's computes every output element's
    source coordinates and reads four pixels for it; here the second pass
    reads two, at coordinates that depend on the row only, and the first
    pass runs over ``size[0] / height`` fewer elements than the output.
    """
    h_axis, w_axis = layout.index("H"), layout.index("W")
    in_h, in_w = data.shape[h_axis], data.shape[w_axis]
    out_h, out_w = (tirx.const(n, str(in_h.ty.dtype)) for n in size)

    def taps(o: tirx.PrimExpr, extent: tirx.PrimExpr, target: tirx.PrimExpr) -> tuple[tirx.PrimExpr, ...]:
        position = get_inx(o, extent, target, mode)
        first = te.floor(position).astype("int32")
        return (te.max(te.min(first, extent - 1), 0), te.max(te.min(first + 1, extent - 1), 0),
                position - first)

    def at(tensor: te.Tensor, index: list[tirx.PrimExpr], axis: int, value: tirx.PrimExpr) -> tirx.PrimExpr:
        return tensor(*(value if i == axis else v for i, v in enumerate(index)))

    def along_width(*index: tirx.PrimExpr) -> tirx.PrimExpr:
        left, right, t = taps(index[w_axis], in_w, out_w)
        return at(data, list(index), w_axis, left) * (1.0 - t) + at(data, list(index), w_axis, right) * t

    shape = list(data.shape)
    shape[w_axis] = out_w
    rows = te.compute(shape, along_width, name="resize_width")

    def along_height(*index: tirx.PrimExpr) -> tirx.PrimExpr:
        top, bottom, t = taps(index[h_axis], in_h, out_h)
        return at(rows, list(index), h_axis, top) * (1.0 - t) + at(rows, list(index), h_axis, bottom) * t

    shape[h_axis] = out_h
    return te.compute(shape, along_height, name="resize_height")


def in_two_passes(call: relax.Call) -> bool:
    """Whether ``call``, a ``resize2d``, is lowered by :func:`bilinear_upsampling`: float32, linear, a coordinate
    transformation of :data:`SEPARABLE_MODES`, :data:`TWO_PASS_LAYOUTS`, static sizes, and a taller output than input."""
    attrs, data, size = call.attrs, call.args[0], call.args[1]
    layout = str(attrs.layout)
    if layout not in TWO_PASS_LAYOUTS or not isinstance(size, relax.ShapeExpr) or str(data.ty.dtype) != "float32":
        return False
    height = data.ty.shape[layout.index("H")]
    return (isinstance(height, tirx.IntImm) and isinstance(size.values[0], tirx.IntImm)
            and int(size.values[0]) > int(height) and isinstance(size.values[1], tirx.IntImm)
            and attrs.method == "linear" and attrs.coordinate_transformation_mode in SEPARABLE_MODES)


def _resize2d(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """A resize :func:`in_two_passes` through :func:`bilinear_upsampling`; any other as TVM lowers it."""
    if not in_two_passes(call):
        return relax.transform.legalize_ops.image._image_resize2d(bb, call)
    size = [int(v) for v in call.args[1].values]
    return bb.call_te(bilinear_upsampling, call.args[0], size, str(call.attrs.layout),
                      str(call.attrs.coordinate_transformation_mode), primfunc_name_hint="resize2d")


def small_integer_exponent(call: relax.Call) -> int | None:
    """The exponent of ``power(x, c)`` where ``c`` is a float constant of one element equal to an integer from 1 to
    :data:`~probtune.defaults.MAX_PRODUCT_POWER`, broadcast over ``x`` of the same dtype; else None."""
    base, exponent = call.args
    if not isinstance(exponent, tvm.ir.expr.Constant) or not isinstance(base.ty, relax.TensorType):
        return None
    value = exponent.value.numpy()
    if value.size != 1 or base.ty.ndim < value.ndim or str(base.ty.dtype) != str(value.dtype) or value.dtype.kind != "f":
        return None
    number = float(value.reshape(()))
    return int(number) if number.is_integer() and 1 <= number <= MAX_PRODUCT_POWER else None


def _power(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``x ** c`` for a :func:`small_integer_exponent` as ``c - 1`` products of ``x``, left to right (as numpy's
    float32 ``x * x * x``); TVM lowers it to ``pow``, a scalar libm call, and warns at each call site. Any other
    power as TVM lowers it."""
    exponent = small_integer_exponent(call)
    if exponent is None:
        return _TVM_POWER(bb, call)

    def product(x: te.Tensor) -> te.Tensor:
        return te.compute(x.shape, lambda *i: functools.reduce(lambda p, _: p * x(*i), range(exponent - 1), x(*i)),
                          name="power")

    return bb.call_te(product, call.args[0], primfunc_name_hint="power")


def _take(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """A gather whose indices TVM would read unchecked ("fast", an ONNX Gather's) with each index clamped to the
    table instead: a computed index out of range reads an edge row rather than any memory (a model's own inputs are
    checked before the call, :mod:`probtune.model.index_bounds`), and TOPI warns at every such call site."""
    mode = "clip" if str(call.attrs.mode) == "fast" else str(call.attrs.mode)
    return bb.call_te(topi.take, call.args[0], call.args[1], call.attrs.axis, mode=mode, primfunc_name_hint="take")


tvm.ir.register_op_attr("relax.take", "FLegalize", _take, level=11)  # over TVM's (level 10): FoldConstant uses it too


def _max_pool(dims: int) -> Callable[[relax.BlockBuilder, relax.Call], relax.Expr]:
    """The lowering of a ``dims``-d max pool: in bfloat16, comparing its input widened to float32 and rounding the
    maxima back (exact: rounding keeps order), since TVM 0.27's bfloat16 lowering cannot store a vector of bfloat16
    constants, the pool's initial value, so that no vectorized program of TVM's own form builds. Any other as TVM
    lowers it."""
    own = tvm.ir.Op.get(f"relax.nn.max_pool{dims}d").get_attr("FLegalize")
    pool = {1: topi.nn.pool1d, 2: topi.nn.pool2d, 3: topi.nn.pool3d}[dims]

    def lower(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        attrs = call.attrs
        if str(call.ty.dtype) != "bfloat16" or attrs.out_layout != attrs.layout:
            return own(bb, call)

        def pooled(x: te.Tensor) -> te.Tensor:
            wide = pool(topi.cast(x, "float32"), kernel=attrs.pool_size, stride=attrs.strides, dilation=attrs.dilation,
                        padding=attrs.padding, pool_type="max", ceil_mode=attrs.ceil_mode, layout=attrs.layout)
            return topi.cast(wide, "bfloat16")

        return bb.call_te(pooled, call.args[0], primfunc_name_hint=f"max_pool{dims}d")

    return lower


LEGALIZATIONS: dict[str, Callable[[relax.BlockBuilder, relax.Call], relax.Expr]] = {
    **{f"relax.nn.max_pool{dims}d": _max_pool(dims) for dims in (1, 2, 3)},
    "relax.nn.batch_norm": _batch_norm,
    "relax.nn.conv2d_transpose": _conv2d_transpose,
    "relax.image.resize2d": _resize2d,
    "relax.power": _power,
}
"""Relax operator -> its lowering, for the forms TVM's legalization leaves unlowered or lowers less well."""


def legalize(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every operator lowered to TIR, :data:`LEGALIZATIONS` first and TVM's own for the rest."""
    lowered = relax.transform.LegalizeOps(customize_legalize_map=LEGALIZATIONS)(mod)
    return relax.transform.CanonicalizeBindings()(lowered)  # a tuple built here and read at once: no tuple
