"""The built-in workloads: common deep-learning operators, written with ``tvm.te``.

Every entry builds a PrimFunc named ``main`` whose parameters are the inputs followed by
the output, with readable block names, and carries a numpy reference (computed in
float64, then cast to the dtype; it takes the shape parameters, then the input arrays)
and a FLOP count for GFLOPS figures.

Shape parameters, in the order the shape is written:

=======================  ====================================  ===========================
name                     shape parameters                      tensors
=======================  ====================================  ===========================
matmul                   M, N, K                               A[M,K] @ B[K,N] -> C[M,N]
batch_matmul             B, M, N, K                            A[B,M,K] @ B[B,K,N] -> C[B,M,N]
dense_bias_relu          M, N, K                               relu(X[M,K] W[N,K]^T + bias[N])
conv2d_nchw              N, C, H, W, K, R, S, stride, pad      data[N,C,H,W], weight[K,C,R,S]
conv2d_nhwc              N, C, H, W, K, R, S, stride, pad      data[N,H,W,C], weight[R,S,C,K]
depthwise_conv2d_nchw    N, C, H, W, R, S, stride, pad         data[N,C,H,W], weight[C,1,R,S]
softmax                  M, N                                  softmax of X[M,N] over N
layer_norm               M, N                                  X[M,N], gamma[N], beta[N]
=======================  ====================================  ===========================

Both conv2d layouts take the same parameters in the same order (C = input channels,
K = output channels, R x S = kernel), so one tuple names one convolution problem in
either layout.  Output sizes are ``(H + 2*pad - R) // stride + 1`` (floor, as in
PyTorch and ONNX); padding is zero padding on all four sides.

FLOP counts (one multiply-add = 2 FLOPs, an exp, max, divide or compare = 1):
matmul ``2MNK``; batch_matmul ``2BMNK``; dense_bias_relu ``2MNK + 2MN``;
conv2d ``2 N K OH OW C R S``; depthwise ``2 N C OH OW R S``; softmax ``5MN``
(max, subtract, exp, sum, divide); layer_norm ``8MN`` (mean: add; variance:
subtract, square, add; output: subtract, scale, times gamma, plus beta).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import te

from probtune.errors import UnknownWorkloadError, WorkloadShapeError
from probtune.workloads.workload import Workload, WorkloadLike, count_inputs, parse_shape

__all__ = ["BUILTIN_WORKLOADS", "WorkloadSpec", "resolve_workload"]

Shape = tuple[int, ...]

_FLOAT_DTYPES = ("float32", "float64")
_CONTRACTION_DTYPES = (*_FLOAT_DTYPES, "float16")  # float16 products are summed in float32
_MATMUL_DTYPES = (*_CONTRACTION_DTYPES, "int8")  # int8 products are summed in int32, kept as ONNX's MatMulInteger keeps them
_LAYER_NORM_EPS = 1e-5


@dataclass(frozen=True)
class WorkloadSpec:
    """A family of workloads: one operator, instantiated at any valid shape and dtype.

    ``reference(shape, *inputs)`` computes the outputs with numpy; it gets the shape
    because inputs alone do not determine e.g. a convolution's stride and padding.
    Every shape parameter must be positive except those in ``zero_allowed``;
    ``check_shape`` adds the operator's own constraints (e.g. the kernel must fit).
    """

    name: str
    description: str
    shape_params: tuple[str, ...]
    default_shape: Shape
    small_shape: Shape
    build: Callable[[Shape, str], tvm.tirx.PrimFunc]
    flops: Callable[[Shape], float]
    reference: Callable[..., list[np.ndarray]]
    dtypes: tuple[str, ...] = ("float32",)
    zero_allowed: tuple[str, ...] = ()
    check_shape: Callable[[Shape], None] | None = None  # raises WorkloadShapeError
    baseline: Callable[..., object] | None = None  # numpy at the workload's dtype, for speed comparisons

    def instantiate(self, shape: Sequence[int], dtype: str = "float32") -> Workload:
        """The workload at ``shape`` and ``dtype``, after checking both."""
        shape = self._validated_shape(shape)
        if dtype not in self.dtypes:
            raise WorkloadShapeError(
                f"{self.name} supports dtypes {list(self.dtypes)}, got {dtype!r}"
            )
        func = self.build(shape, dtype)
        return Workload(
            name=self.name,
            shape=shape,
            dtype=dtype,
            mod=tvm.IRModule({"main": func}),
            num_inputs=count_inputs(func, self.name),
            flops=float(self.flops(shape)),
            reference=functools.partial(self.reference, shape),
            baseline=None if self.baseline is None else functools.partial(self.baseline, shape),
        )

    def _validated_shape(self, shape: Sequence[int]) -> Shape:
        shape = tuple(shape)
        if len(shape) != len(self.shape_params):
            raise WorkloadShapeError(
                f"{self.name} takes {len(self.shape_params)} shape parameters "
                f"({', '.join(self.shape_params)}), got {len(shape)}: {shape}"
            )
        for param, value in zip(self.shape_params, shape):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise WorkloadShapeError(
                    f"{self.name} shape parameter {param} must be an integer, got {value!r}"
                )
            lowest = 0 if param in self.zero_allowed else 1
            if value < lowest:
                bound = "non-negative" if lowest == 0 else "positive"
                raise WorkloadShapeError(
                    f"{self.name} shape parameter {param} must be {bound}, got {value}"
                )
        shape = tuple(int(value) for value in shape)
        if self.check_shape is not None:
            self.check_shape(shape)
        return shape


# ---------------------------------------------------------------- matmul family


def _accumulator(dtype: str) -> str:
    """The type products are summed in: float32 for float16 inputs and int32 for int8, as tensor cores and cuBLAS do."""
    return {"float16": "float32", "int8": "int32"}.get(dtype, dtype)


def _product_dtype(dtype: str) -> str:
    """A matrix product's output type: integer sums are kept (int8 -> int32), float ones rounded to the inputs' type."""
    return "int32" if dtype == "int8" else dtype


def _widened(value: tvm.tirx.PrimExpr, dtype: str) -> tvm.tirx.PrimExpr:
    return value if value.dtype == dtype else value.astype(dtype)


def _rounded(tensor: te.Tensor, dtype: str, name: str) -> te.Tensor:
    """``tensor`` rounded to ``dtype`` by an elementwise block named ``name``, or itself if it already has that type."""
    if tensor.dtype == dtype:
        return tensor
    return te.compute(tensor.shape, lambda *i: tensor(*i).astype(dtype), name=name)


def _build_matmul(shape: Shape, dtype: str) -> tvm.tirx.PrimFunc:
    m, n, k = shape
    a = te.placeholder((m, k), dtype, name="A")
    b = te.placeholder((k, n), dtype, name="B")
    r = te.reduce_axis((0, k), name="k")
    acc = _accumulator(dtype)
    c = te.compute((m, n), lambda i, j: te.sum(_widened(a[i, r], acc) * _widened(b[r, j], acc), axis=r), name="C")
    return te.create_prim_func([a, b, _rounded(c, _product_dtype(dtype), "C_rounded")])


def _reference_matmul(_shape: Shape, a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    return [_exact_product(a, b)]


def _exact_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` summed exactly (int64 for integers, float64 for floats), in the product's output type."""
    wide = np.int64 if np.issubdtype(a.dtype, np.integer) else np.float64
    return (a.astype(wide) @ b.astype(wide)).astype(_product_dtype(a.dtype.name))


def _dense(shape: Shape, dtype: str) -> tuple[te.Tensor, te.Tensor, te.Tensor]:
    """The inputs of ``X[M,K] @ W[N,K]^T`` and its value, in the accumulator's type (block ``T_dense``)."""
    m, n, k = shape
    x = te.placeholder((m, k), dtype, name="X")
    w = te.placeholder((n, k), dtype, name="W")
    r = te.reduce_axis((0, k), name="k")
    acc = _accumulator(dtype)
    dense = te.compute((m, n), lambda i, j: te.sum(_widened(x[i, r], acc) * _widened(w[j, r], acc), axis=r), name="T_dense")
    return x, w, dense


def _build_dense(shape: Shape, dtype: str) -> tvm.tirx.PrimFunc:
    x, w, dense = _dense(shape, dtype)
    return te.create_prim_func([x, w, _rounded(dense, _product_dtype(dtype), "T_rounded")])


def _reference_dense(_shape: Shape, x: np.ndarray, w: np.ndarray) -> list[np.ndarray]:
    return [_exact_product(x, w.T)]


def _build_batch_matmul(shape: Shape, dtype: str) -> tvm.tirx.PrimFunc:
    batch, m, n, k = shape
    a = te.placeholder((batch, m, k), dtype, name="A")
    b = te.placeholder((batch, k, n), dtype, name="B")
    r = te.reduce_axis((0, k), name="k")
    acc = _accumulator(dtype)
    c = te.compute(
        (batch, m, n), lambda p, i, j: te.sum(_widened(a[p, i, r], acc) * _widened(b[p, r, j], acc), axis=r), name="C"
    )
    return te.create_prim_func([a, b, _rounded(c, _product_dtype(dtype), "C_rounded")])


def _dense_bias(shape: Shape, dtype: str) -> tuple[list[te.Tensor], te.Tensor]:
    """The inputs of ``X[M,K] @ W[N,K]^T + bias[N]`` and its value, in the accumulator's type (dense, bias add)."""
    x, w, dense = _dense(shape, dtype)
    bias = te.placeholder((shape[1],), dtype, name="bias")
    biased = te.compute(dense.shape, lambda i, j: dense[i, j] + _widened(bias[j], dense.dtype), name="T_bias_add")
    return [x, w, bias], biased


def _build_dense_bias_relu(shape: Shape, dtype: str) -> tvm.tirx.PrimFunc:
    inputs, biased = _dense_bias(shape, dtype)
    zero = tvm.tirx.const(0, biased.dtype)
    relu = te.compute(biased.shape, lambda i, j: te.max(biased[i, j], zero), name="T_relu")
    return te.create_prim_func([*inputs, _rounded(relu, dtype, "T_rounded")])


def _build_dense_bias_gelu(shape: Shape, dtype: str) -> tvm.tirx.PrimFunc:
    inputs, biased = _dense_bias(shape, dtype)
    half, root_half = tvm.tirx.const(0.5, biased.dtype), tvm.tirx.const(math.sqrt(0.5), biased.dtype)
    gelu = te.compute(
        biased.shape, lambda i, j: half * biased[i, j] * (1 + te.erf(biased[i, j] * root_half)), name="T_gelu"
    )
    return te.create_prim_func([*inputs, _rounded(gelu, dtype, "T_rounded")])


def _reference_dense_bias_gelu(
    _shape: Shape, x: np.ndarray, w: np.ndarray, bias: np.ndarray
) -> list[np.ndarray]:
    dense = x.astype(np.float64) @ w.astype(np.float64).T + bias.astype(np.float64)
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return [(0.5 * dense * (1.0 + erf(dense * math.sqrt(0.5)))).astype(x.dtype)]


def _reference_dense_bias_relu(
    _shape: Shape, x: np.ndarray, w: np.ndarray, bias: np.ndarray
) -> list[np.ndarray]:
    dense = x.astype(np.float64) @ w.astype(np.float64).T + bias.astype(np.float64)
    return [np.maximum(dense, 0.0).astype(x.dtype)]


# ---------------------------------------------------------------- convolutions


def _conv_output_size(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


def _check_conv_window(height: int, width: int, r: int, s: int, pad: int) -> None:
    """The kernel must fit inside the padded input at least once."""
    if height + 2 * pad < r or width + 2 * pad < s:
        raise WorkloadShapeError(
            f"a {r}x{s} kernel does not fit a {height}x{width} input padded by {pad}"
        )


def _check_conv2d(shape: Shape) -> None:
    _, _, h, w, _, r, s, _, pad = shape
    _check_conv_window(h, w, r, s, pad)


def _check_depthwise(shape: Shape) -> None:
    _, _, h, w, r, s, _, pad = shape
    _check_conv_window(h, w, r, s, pad)


def _padded(data: te.Tensor, pad: int, spatial_axes: tuple[int, int]) -> te.Tensor:
    """Zero padding of the two spatial axes as its own block, or ``data`` when pad is 0."""
    if pad == 0:
        return data
    padded_shape = tuple(
        extent + 2 * pad if axis in spatial_axes else extent
        for axis, extent in enumerate(data.shape)
    )

    def padded_value(*index: tvm.tirx.Var) -> tvm.tirx.Expr:
        inside = te.all(
            *(
                te.all(index[axis] >= pad, index[axis] < data.shape[axis] + pad)
                for axis in spatial_axes
            )
        )
        source = [idx - pad if axis in spatial_axes else idx for axis, idx in enumerate(index)]
        return te.if_then_else(inside, data[tuple(source)], tvm.tirx.const(0, data.dtype))

    return te.compute(padded_shape, padded_value, name="pad_temp")


def _padded_numpy(data: np.ndarray, pad: int, spatial_axes: tuple[int, int]) -> np.ndarray:
    widths = [(pad, pad) if axis in spatial_axes else (0, 0) for axis in range(data.ndim)]
    return np.pad(data.astype(np.float64), widths)


def _build_conv2d_nchw(shape: Shape, dtype: str) -> tvm.tirx.PrimFunc:
    n, c, h, w, k, r, s, stride, pad = shape
    acc = _accumulator(dtype)
    oh, ow = _conv_output_size(h, r, stride, pad), _conv_output_size(w, s, stride, pad)
    data = te.placeholder((n, c, h, w), dtype, name="data")
    weight = te.placeholder((k, c, r, s), dtype, name="weight")
    padded = _padded(data, pad, spatial_axes=(2, 3))
    rc = te.reduce_axis((0, c), name="rc")
    ry = te.reduce_axis((0, r), name="ry")
    rx = te.reduce_axis((0, s), name="rx")
    out = te.compute(
        (n, k, oh, ow),
        lambda b, f, y, x: te.sum(
            _widened(padded[b, rc, y * stride + ry, x * stride + rx], acc) * _widened(weight[f, rc, ry, rx], acc),
            axis=[rc, ry, rx],
        ),
        name="conv2d_nchw",
    )
    return te.create_prim_func([data, weight, _rounded(out, dtype, "conv2d_rounded")])


def _reference_conv2d_nchw(
    shape: Shape, data: np.ndarray, weight: np.ndarray
) -> list[np.ndarray]:
    stride, pad = shape[-2:]
    k, _, r, s = weight.shape
    padded = _padded_numpy(data, pad, spatial_axes=(2, 3))
    oh = (padded.shape[2] - r) // stride + 1
    ow = (padded.shape[3] - s) // stride + 1
    out = np.zeros((data.shape[0], k, oh, ow))
    for dy in range(r):
        for dx in range(s):
            window = padded[:, :, dy : dy + stride * oh : stride, dx : dx + stride * ow : stride]
            out += np.einsum("nchw,kc->nkhw", window, weight[:, :, dy, dx].astype(np.float64))
    return [out.astype(data.dtype)]


def _build_conv2d_nhwc(shape: Shape, dtype: str) -> tvm.tirx.PrimFunc:
    n, c, h, w, k, r, s, stride, pad = shape
    acc = _accumulator(dtype)
    oh, ow = _conv_output_size(h, r, stride, pad), _conv_output_size(w, s, stride, pad)
    data = te.placeholder((n, h, w, c), dtype, name="data")
    weight = te.placeholder((r, s, c, k), dtype, name="weight")
    padded = _padded(data, pad, spatial_axes=(1, 2))
    ry = te.reduce_axis((0, r), name="ry")
    rx = te.reduce_axis((0, s), name="rx")
    rc = te.reduce_axis((0, c), name="rc")
    out = te.compute(
        (n, oh, ow, k),
        lambda b, y, x, f: te.sum(
            _widened(padded[b, y * stride + ry, x * stride + rx, rc], acc) * _widened(weight[ry, rx, rc, f], acc),
            axis=[ry, rx, rc],
        ),
        name="conv2d_nhwc",
    )
    return te.create_prim_func([data, weight, _rounded(out, dtype, "conv2d_rounded")])


def _reference_conv2d_nhwc(
    shape: Shape, data: np.ndarray, weight: np.ndarray
) -> list[np.ndarray]:
    stride, pad = shape[-2:]
    r, s, _, k = weight.shape
    padded = _padded_numpy(data, pad, spatial_axes=(1, 2))
    oh = (padded.shape[1] - r) // stride + 1
    ow = (padded.shape[2] - s) // stride + 1
    out = np.zeros((data.shape[0], oh, ow, k))
    for dy in range(r):
        for dx in range(s):
            window = padded[:, dy : dy + stride * oh : stride, dx : dx + stride * ow : stride, :]
            out += window @ weight[dy, dx].astype(np.float64)
    return [out.astype(data.dtype)]


def _build_depthwise_conv2d_nchw(shape: Shape, dtype: str) -> tvm.tirx.PrimFunc:
    n, c, h, w, r, s, stride, pad = shape
    oh, ow = _conv_output_size(h, r, stride, pad), _conv_output_size(w, s, stride, pad)
    data = te.placeholder((n, c, h, w), dtype, name="data")
    weight = te.placeholder((c, 1, r, s), dtype, name="weight")
    padded = _padded(data, pad, spatial_axes=(2, 3))
    ry = te.reduce_axis((0, r), name="ry")
    rx = te.reduce_axis((0, s), name="rx")
    out = te.compute(
        (n, c, oh, ow),
        lambda b, ch, y, x: te.sum(
            padded[b, ch, y * stride + ry, x * stride + rx] * weight[ch, 0, ry, rx],
            axis=[ry, rx],
        ),
        name="depthwise_conv2d_nchw",
    )
    return te.create_prim_func([data, weight, out])


def _reference_depthwise_conv2d_nchw(
    shape: Shape, data: np.ndarray, weight: np.ndarray
) -> list[np.ndarray]:
    stride, pad = shape[-2:]
    _, _, r, s = weight.shape
    padded = _padded_numpy(data, pad, spatial_axes=(2, 3))
    oh = (padded.shape[2] - r) // stride + 1
    ow = (padded.shape[3] - s) // stride + 1
    out = np.zeros((data.shape[0], data.shape[1], oh, ow))
    for dy in range(r):
        for dx in range(s):
            window = padded[:, :, dy : dy + stride * oh : stride, dx : dx + stride * ow : stride]
            out += window * weight[:, 0, dy, dx].astype(np.float64)[None, :, None, None]
    return [out.astype(data.dtype)]


# ---------------------------------------------------------------- normalisations


def _build_softmax(shape: Shape, dtype: str) -> tvm.tirx.PrimFunc:
    m, n = shape
    x = te.placeholder((m, n), dtype, name="X")
    r_max = te.reduce_axis((0, n), name="k")
    row_max = te.compute((m,), lambda i: te.max(x[i, r_max], axis=r_max), name="T_softmax_maxelem")
    exp = te.compute((m, n), lambda i, j: te.exp(x[i, j] - row_max[i]), name="T_softmax_exp")
    r_sum = te.reduce_axis((0, n), name="k")
    exp_sum = te.compute((m,), lambda i: te.sum(exp[i, r_sum], axis=r_sum), name="T_softmax_expsum")
    out = te.compute((m, n), lambda i, j: exp[i, j] / exp_sum[i], name="T_softmax_norm")
    return te.create_prim_func([x, out])


def _reference_softmax(_shape: Shape, x: np.ndarray) -> list[np.ndarray]:
    shifted = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    return [(shifted / shifted.sum(axis=1, keepdims=True)).astype(x.dtype)]


def _build_layer_norm(shape: Shape, dtype: str) -> tvm.tirx.PrimFunc:
    """Two-pass layer norm (mean first, then squared deviations) for numerical stability."""
    m, n = shape
    x = te.placeholder((m, n), dtype, name="X")
    gamma = te.placeholder((n,), dtype, name="gamma")
    beta = te.placeholder((n,), dtype, name="beta")
    inv_n = tvm.tirx.const(1.0 / n, dtype)
    eps = tvm.tirx.const(_LAYER_NORM_EPS, dtype)
    r_mean = te.reduce_axis((0, n), name="k")
    row_sum = te.compute((m,), lambda i: te.sum(x[i, r_mean], axis=r_mean), name="T_layer_norm_sum")
    r_var = te.reduce_axis((0, n), name="k")
    sq_dev_sum = te.compute(
        (m,),
        lambda i: te.sum(
            (x[i, r_var] - row_sum[i] * inv_n) * (x[i, r_var] - row_sum[i] * inv_n), axis=r_var
        ),
        name="T_layer_norm_sq_dev_sum",
    )
    out = te.compute(
        (m, n),
        lambda i, j: (x[i, j] - row_sum[i] * inv_n)
        * te.rsqrt(sq_dev_sum[i] * inv_n + eps)
        * gamma[j]
        + beta[j],
        name="T_layer_norm",
    )
    return te.create_prim_func([x, gamma, beta, out])


def _reference_layer_norm(
    _shape: Shape, x: np.ndarray, gamma: np.ndarray, beta: np.ndarray
) -> list[np.ndarray]:
    x64 = x.astype(np.float64)
    centered = x64 - x64.mean(axis=1, keepdims=True)
    variance = (centered * centered).mean(axis=1, keepdims=True)
    normalized = centered / np.sqrt(variance + _LAYER_NORM_EPS)
    return [(normalized * gamma.astype(np.float64) + beta.astype(np.float64)).astype(x.dtype)]


# ---------------------------------------------------------------- numpy baselines


def _numpy_matmul(_shape: Shape, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a @ b


def _numpy_dense(_shape: Shape, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x @ w.T


def _numpy_dense_bias_relu(_shape: Shape, x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    return np.maximum(x @ w.T + bias, 0)


def _numpy_softmax(_shape: Shape, x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# ---------------------------------------------------------------- the catalog




def _matmul_flops(shape: Shape) -> float:
    m, n, k = shape
    return 2.0 * m * n * k


def _conv2d_flops(shape: Shape) -> float:
    n, c, h, w, k, r, s, stride, pad = shape
    oh, ow = _conv_output_size(h, r, stride, pad), _conv_output_size(w, s, stride, pad)
    return 2.0 * n * k * oh * ow * c * r * s


def _depthwise_flops(shape: Shape) -> float:
    n, c, h, w, r, s, stride, pad = shape
    oh, ow = _conv_output_size(h, r, stride, pad), _conv_output_size(w, s, stride, pad)
    return 2.0 * n * c * oh * ow * r * s


_CONV2D_PARAMS = ("N", "C", "H", "W", "K", "R", "S", "stride", "pad")

BUILTIN_WORKLOADS: tuple[WorkloadSpec, ...] = (
    WorkloadSpec(
        name="matmul",
        description="C[M,N] = A[M,K] @ B[K,N]",
        shape_params=("M", "N", "K"),
        default_shape=(512, 512, 512),
        small_shape=(24, 40, 56),
        build=_build_matmul,
        flops=_matmul_flops,
        reference=_reference_matmul,
        baseline=_numpy_matmul,
        dtypes=_MATMUL_DTYPES,
    ),
    WorkloadSpec(
        name="batch_matmul",
        description="C[b] = A[b] @ B[b] with A: B x M x K, B: B x K x N",
        shape_params=("B", "M", "N", "K"),
        default_shape=(12, 128, 128, 64),
        small_shape=(3, 16, 24, 40),
        build=_build_batch_matmul,
        flops=lambda shape: 2.0 * shape[0] * shape[1] * shape[2] * shape[3],
        reference=_reference_matmul,
        baseline=_numpy_matmul,
        dtypes=_MATMUL_DTYPES,
    ),
    WorkloadSpec(
        name="dense",
        description="Y[M,N] = X[M,K] @ W[N,K]^T, a layer's weights stored as ONNX Gemm's transB stores them",
        shape_params=("M", "N", "K"),
        default_shape=(128, 3072, 768),
        small_shape=(16, 48, 40),
        build=_build_dense,
        flops=_matmul_flops,
        reference=_reference_dense,
        baseline=_numpy_dense,
        dtypes=_MATMUL_DTYPES,
    ),
    WorkloadSpec(
        name="dense_bias_relu",
        description="relu(X[M,K] @ W[N,K]^T + bias[N]) as three blocks (dense, bias add, relu)",
        shape_params=("M", "N", "K"),
        default_shape=(128, 3072, 768),
        small_shape=(16, 48, 40),
        build=_build_dense_bias_relu,
        flops=lambda shape: 2.0 * shape[0] * shape[1] * shape[2] + 2.0 * shape[0] * shape[1],
        reference=_reference_dense_bias_relu,
        baseline=_numpy_dense_bias_relu,
        dtypes=_CONTRACTION_DTYPES,
    ),
    WorkloadSpec(
        name="dense_bias_gelu",
        description="gelu(X[M,K] @ W[N,K]^T + bias[N]), the exact (erf) GELU of BERT's feed-forward layer",
        shape_params=("M", "N", "K"),
        default_shape=(128, 3072, 768),
        small_shape=(16, 48, 40),
        build=_build_dense_bias_gelu,
        flops=lambda shape: 2.0 * shape[0] * shape[1] * shape[2] + 8.0 * shape[0] * shape[1],
        reference=_reference_dense_bias_gelu,
        dtypes=_CONTRACTION_DTYPES,
    ),
    WorkloadSpec(
        name="conv2d_nchw",
        description="2-D convolution, data N x C x H x W, weight K x C x R x S, zero padding block",
        shape_params=_CONV2D_PARAMS,
        default_shape=(1, 64, 56, 56, 64, 3, 3, 1, 1),
        small_shape=(2, 8, 11, 11, 12, 3, 3, 2, 1),
        build=_build_conv2d_nchw,
        flops=_conv2d_flops,
        reference=_reference_conv2d_nchw,
        dtypes=_CONTRACTION_DTYPES,
        zero_allowed=("pad",),
        check_shape=_check_conv2d,
    ),
    WorkloadSpec(
        name="conv2d_nhwc",
        description="2-D convolution, data N x H x W x C, weight R x S x C x K (HWIO)",
        shape_params=_CONV2D_PARAMS,
        default_shape=(1, 64, 56, 56, 64, 1, 1, 1, 0),
        small_shape=(2, 8, 11, 11, 12, 3, 3, 2, 1),
        build=_build_conv2d_nhwc,
        flops=_conv2d_flops,
        reference=_reference_conv2d_nhwc,
        dtypes=_CONTRACTION_DTYPES,
        zero_allowed=("pad",),
        check_shape=_check_conv2d,
    ),
    WorkloadSpec(
        name="depthwise_conv2d_nchw",
        description="depthwise 2-D convolution, data N x C x H x W, weight C x 1 x R x S",
        shape_params=("N", "C", "H", "W", "R", "S", "stride", "pad"),
        default_shape=(1, 64, 56, 56, 3, 3, 1, 1),
        small_shape=(2, 8, 12, 12, 3, 3, 1, 1),
        build=_build_depthwise_conv2d_nchw,
        flops=_depthwise_flops,
        reference=_reference_depthwise_conv2d_nchw,
        dtypes=_FLOAT_DTYPES,
        zero_allowed=("pad",),
        check_shape=_check_depthwise,
    ),
    WorkloadSpec(
        name="softmax",
        description="numerically stable softmax of X[M,N] over the last axis",
        shape_params=("M", "N"),
        default_shape=(1024, 1024),
        small_shape=(16, 40),
        build=_build_softmax,
        flops=lambda shape: 5.0 * shape[0] * shape[1],
        reference=_reference_softmax,
        baseline=_numpy_softmax,
        dtypes=_FLOAT_DTYPES,
    ),
    WorkloadSpec(
        name="layer_norm",
        description="layer normalisation of X[M,N] over the last axis, gamma/beta[N], eps=1e-5",
        shape_params=("M", "N"),
        default_shape=(512, 768),
        small_shape=(16, 48),
        build=_build_layer_norm,
        flops=lambda shape: 8.0 * shape[0] * shape[1],
        reference=_reference_layer_norm,
        dtypes=_FLOAT_DTYPES,
    ),
)


def resolve_workload(
    workload: WorkloadLike,
    shape: str | Sequence[int] | None = None,
    dtype: str = "float32",
    specs: Mapping[str, WorkloadSpec] | None = None,
) -> Workload:
    """Turn whatever the user named into a :class:`Workload`.

    ``workload`` is a catalog name (looked up in ``specs``, default: the built-in
    catalog), a ready :class:`Workload`, an IRModule or a PrimFunc.  ``shape`` (default:
    the entry's default shape) and ``dtype`` apply to catalog names only.
    """
    if isinstance(workload, str):
        if specs is None:
            specs = {spec.name: spec for spec in BUILTIN_WORKLOADS}
        spec = specs.get(workload)
        if spec is None:
            known = ", ".join(sorted(specs)) or "(none)"
            raise UnknownWorkloadError(f"unknown workload {workload!r}; known workloads: {known}")
        values = spec.default_shape if shape is None else parse_shape(shape, allow_zero=True)
        return spec.instantiate(values, dtype)
    if shape is not None:
        raise WorkloadShapeError(
            f"a shape ({shape!r}) applies only to catalog workloads, not to a given module"
        )
    if isinstance(workload, Workload):
        return workload
    if isinstance(workload, (tvm.IRModule, tvm.tirx.PrimFunc)):
        return Workload.from_module(workload)
    raise TypeError(
        "workload must be a catalog name, a Workload, an IRModule or a PrimFunc, "
        f"got {type(workload).__name__}"
    )
