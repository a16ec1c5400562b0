"""Winograd's minimal filtering for 3x3 convolutions: fewer multiplies, as batched matrix products.

A stride-1 3x3 convolution computes each m x m output tile from an n x n
input tile (n = m + 2). Winograd's F(m x m, 3 x 3) transforms the input tile
(``V = Bᵀ d B``), multiplies it elementwise with the transformed kernel
(``U = G g Gᵀ``, computed once, when the model is compiled, since the weights
are constants) summing over input channels, and transforms the sums back
(``Y = Aᵀ M A``). The sum over channels at each of the n² tile positions is a
batched matrix product, ``[n², tiles, Cin] x [n², Cin, Cout]``: n² x tiles x
Cin x Cout multiplies against the direct convolution's 9 x m² x tiles x Cin x
Cout. F(4x4, 3x3) needs 4x fewer.

Each convolution becomes three tasks the tuner knows how to schedule: the
input transform (padding included), a batch matmul with a constant weight,
and the output transform, into which the convolution's elementwise epilogue
(bias, ReLU) fuses. Both transforms are written as small dense products with
the Kronecker products of the transform matrices, so they vectorize over
channels like any reduction.

Applied where it cuts the work: a stride-1, undilated, ungrouped 3x3 float
convolution in NHWC/HWIO layout with a constant kernel, summing in its
operands' type (a float16 or bfloat16 model's convolutions, which sum in
float32, keep the direct form). Output tiles are
4 x 4 (F(4x4, 3x3): float32 results within about 1e-5 of the direct
convolution's scale), or 2 x 2 where 4 x 4 tiles would be fewer than
:data:`MIN_TILES`; with fewer still the convolution is kept. The transformed
kernel is n²/9 times the kernel's size, and each of its elements is used
once per tile: with few tiles, the product waits on memory for it. The form's
multiplies (product and transforms) must also be at most
:data:`MAX_WORK_RATIO` of the direct ones, and the convolution must have
channels enough (:data:`MIN_CHANNEL_MEAN`) for the product's multiplies to
outweigh the passes over the transformed tensors between the three tasks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import tvm
from tvm import relax, te, topi
from tvm.ir.expr import Constant

from probtune.plugin import TargetSpec
from probtune_cpu.relax_calls import has_call

__all__ = ["MAX_WORK_RATIO", "MIN_CHANNEL_MEAN", "MIN_TILES", "TILE_SIZES", "WinogradConv2D", "winograd_matrices"]

KERNEL = 3
MAX_WORK_RATIO = 1 / 2
"""Rewrite only where the Winograd form's multiplies are at most this share of the direct convolution's: the rest
of its cost (three tasks instead of one, a transformed kernel n²/9 times the size) must be paid for."""

MIN_CHANNEL_MEAN = 64
"""Least harmonic mean of the input and output channels. Per tile position the transformed input and product
(written, then read back by the next task) hold ``cin + cout`` values against the product's ``cin x cout``
multiplies: ``1/cin + 1/cout`` values moved per multiply, which the direct convolution does not pay."""

MIN_TILES = 16
"""Fewest output tiles (rows of the batched product) a Winograd form may have: each element of the transformed kernel
is then used for at least this many multiplies."""
TILE_SIZES = (4, 2)
"""Output tile sizes, preferred first: F(4x4, 3x3) needs fewer multiplies, F(2x2, 3x3) makes more tiles."""

OUT_EWISE_FUSABLE = 4  # TVM's op pattern kOutEWiseFusable: elementwise consumers fuse into the function's output

_POINTS = (Fraction(0), Fraction(1), Fraction(-1), Fraction(2), Fraction(-2), Fraction(1, 2), Fraction(-1, 2))
"""Interpolation points of the Cook-Toom construction, in the usual order (small integers first, for accuracy)."""


def winograd_matrices(m: int, r: int = KERNEL) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(Aᵀ, Bᵀ, G)`` of F(m, r): ``y = Aᵀ ((G g) * (Bᵀ d))`` is the correlation of ``d`` (m + r - 1) with ``g`` (r).

    ``Aᵀ`` evaluates at the points and at infinity, ``G`` interpolates
    (Lagrange); ``Bᵀ`` is then the unique solution of the linear identity.
    """
    n = m + r - 1
    points = _POINTS[: n - 1]
    if len(points) < n - 1:
        raise ValueError(f"F({m}, {r}) needs {n - 1} interpolation points; {len(_POINTS)} are known")
    a_t = np.zeros((m, n))
    g = np.zeros((n, r))
    for j, p in enumerate(points):
        scale = math.prod((p - q for q in points if q != p), start=Fraction(1))
        a_t[:, j] = [float(p**i) for i in range(m)]
        g[j] = [float(p**k / scale) for k in range(r)]
    a_t[m - 1, n - 1] = g[n - 1, r - 1] = 1.0
    return a_t, _solve_input_transform(a_t, g, m, r), g


def _solve_input_transform(a_t: np.ndarray, g: np.ndarray, m: int, r: int) -> np.ndarray:
    """``Bᵀ`` with ``sum_j Aᵀ[i, j] G[j, k] Bᵀ[j, l] = [l == i + k]`` for every output i, tap k, input l."""
    n = m + r - 1
    rows = np.array([a_t[i] * g[:, k] for i in range(m) for k in range(r)])
    b_t = np.zeros((n, n))
    for l_ in range(n):
        wanted = np.array([float(l_ == i + k) for i in range(m) for k in range(r)])
        b_t[:, l_] = np.linalg.lstsq(rows, wanted, rcond=None)[0]
        if not np.allclose(rows @ b_t[:, l_], wanted, atol=1e-9):
            raise ArithmeticError(f"F({m}, {r}) has no input transform for these points")
    return np.round(b_t, 12)


@dataclass(frozen=True)
class _Conv:
    """An eligible convolution's shapes: batch, input size, padding, channels, output size and tile."""

    batch: int
    height: int
    width: int
    pad: tuple[int, int, int, int]  # top, left, bottom, right
    cin: int
    cout: int
    out_height: int
    out_width: int
    tile: int

    @property
    def alpha(self) -> int:
        return self.tile + KERNEL - 1

    @property
    def tiles(self) -> tuple[int, int]:
        return -(-self.out_height // self.tile), -(-self.out_width // self.tile)

    @property
    def tile_count(self) -> int:
        rows, cols = self.tiles
        return self.batch * rows * cols

    @property
    def channel_mean(self) -> float:
        """Harmonic mean of the input and output channels (see :data:`MIN_CHANNEL_MEAN`)."""
        return 2 * self.cin * self.cout / (self.cin + self.cout)

    def pays(self, max_work_ratio: float, min_channel_mean: float) -> bool:
        """Whether the Winograd form is expected to run faster than the direct convolution (module docstring)."""
        return self.work_ratio() <= max_work_ratio and self.channel_mean >= min_channel_mean

    def work_ratio(self) -> float:
        """Multiplies of the Winograd form (product and both dense transforms) over the direct convolution's."""
        per_tile = self.alpha**2 * (self.cin * self.cout + self.alpha**2 * self.cin + self.tile**2 * self.cout)
        direct = self.batch * self.out_height * self.out_width * KERNEL * KERNEL * self.cin * self.cout
        return self.tile_count * per_tile / direct


def _eligible(call: relax.Call, max_work_ratio: float, min_channel_mean: float) -> _Conv | None:
    """The convolution's shapes, if this call is one the rewrite applies to and pays on; else None."""
    if not _is_winograd_kind(call) or not isinstance(call.args[1], Constant):
        return None
    data, weight = call.args
    dims = [_static(d) for d in data.ty.shape]
    if min(dims) < 0:
        return None  # a dynamic shape
    batch, height, width, _ = dims
    _, _, cin, cout = (int(d) for d in weight.ty.shape)
    top, left, bottom, right = (int(p) for p in call.attrs.padding)
    out_h, out_w = height + top + bottom - KERNEL + 1, width + left + right - KERNEL + 1
    for tile in TILE_SIZES:
        conv = _Conv(batch, height, width, (top, left, bottom, right), cin, cout, out_h, out_w, tile)
        if conv.tile_count >= MIN_TILES:
            return conv if conv.pays(max_work_ratio, min_channel_mean) else None
    return None


def _is_winograd_kind(call: relax.Call) -> bool:
    """A stride-1, undilated, ungrouped 3x3 NHWC/HWIO float convolution (its kernel may still be computed) that sums in
    its operands' type: one that sums float16 or bfloat16 operands in float32 (``--precision``) keeps the direct form,
    since the transforms would round in the narrow type and amplify that rounding."""
    if not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.nn.conv2d":
        return False
    attrs, (data, weight) = call.attrs, call.args
    return (
        (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) == ("NHWC", "HWIO", "NHWC")
        and attrs.groups == 1
        and [int(s) for s in attrs.strides] == [1, 1]
        and [int(d) for d in attrs.dilation] == [1, 1]
        and [_static(d) for d in weight.ty.shape][:2] == [KERNEL, KERNEL]
        and str(weight.ty.dtype).startswith("float")
        and str(data.ty.dtype) == str(weight.ty.dtype)
        and str(getattr(call.ty, "dtype", "")) == str(weight.ty.dtype)
    )


def _static(dim: tvm.ir.PrimExpr) -> int:
    """A static dimension's size; -1 for a dynamic one."""
    return int(dim) if isinstance(dim, tvm.tirx.IntImm) else -1


def _const(array: np.ndarray, dtype: str) -> relax.Constant:
    return relax.const(np.ascontiguousarray(array).astype(dtype))


def _input_transform(conv: _Conv, data: te.Tensor, kron_b: te.Tensor) -> te.Tensor:
    """``V[e, tile, c] = sum_k kron(Bᵀ, Bᵀ)[e, k] * d_tile[k, c]`` over the zero-padded input's n x n tiles."""
    rows, cols = conv.tiles
    top, left = conv.pad[0], conv.pad[1]
    bottom = rows * conv.tile + KERNEL - 1 - conv.height - top
    right = cols * conv.tile + KERNEL - 1 - conv.width - left
    padded = topi.nn.pad(data, [0, top, left, 0], [0, bottom, right, 0], name="data_pad")
    alpha, m = conv.alpha, conv.tile
    k = te.reduce_axis((0, alpha * alpha), "k")

    def value(e: tvm.tirx.Var, p: tvm.tirx.Var, c: tvm.tirx.Var) -> tvm.tirx.PrimExpr:
        n, rest = p // (rows * cols), p % (rows * cols)
        pixel = padded[n, rest // cols * m + k // alpha, rest % cols * m + k % alpha, c]
        return te.sum(kron_b[e, k] * pixel, axis=k)

    return te.compute((alpha * alpha, conv.batch * rows * cols, conv.cin), value, name="winograd_data_pack")


def _output_transform(conv: _Conv, product: te.Tensor, kron_a: te.Tensor) -> te.Tensor:
    """``Y[n, h, w, o] = sum_e kron(Aᵀ, Aᵀ)[(h % m, w % m), e] * M[e, tile(n, h, w), o]``, cropped to the output."""
    rows, cols = conv.tiles
    m = conv.tile
    e = te.reduce_axis((0, conv.alpha * conv.alpha), "e")

    def value(n: tvm.tirx.Var, h: tvm.tirx.Var, w: tvm.tirx.Var, o: tvm.tirx.Var) -> tvm.tirx.PrimExpr:
        tile = n * rows * cols + h // m * cols + w // m
        return te.sum(kron_a[h % m * m + w % m, e] * product[e, tile, o], axis=e)

    return te.compute((conv.batch, conv.out_height, conv.out_width, conv.cout), value, name="winograd_inverse")


@relax.expr_functor.mutator
class _Rewrite(relax.PyExprMutator):  # type: ignore[misc]
    """Replaces each eligible ``relax.nn.conv2d`` by input transform, batch matmul and output transform."""

    def __init__(self, mod: tvm.IRModule, max_work_ratio: float, min_channel_mean: float) -> None:
        super().__init__(mod)
        self.count = 0
        self.limits = (max_work_ratio, min_channel_mean)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        conv = _eligible(call, *self.limits)
        if conv is None:
            return call
        self.count += 1
        data, weight = call.args
        dtype = str(weight.ty.dtype)
        a_t, b_t, g = winograd_matrices(conv.tile)
        builder = self.builder_
        kernel = relax.op.reshape(weight, (KERNEL * KERNEL, conv.cin * conv.cout))
        transformed = relax.op.matmul(_const(np.kron(g, g), dtype), builder.emit(kernel))  # U, folded at compile time
        u = builder.emit(relax.op.reshape(transformed, (conv.alpha**2, conv.cin, conv.cout)))
        pack = builder.call_te(
            lambda x, kb: _input_transform(conv, x, kb), data, _const(np.kron(b_t, b_t), dtype),
            primfunc_name_hint="winograd_data_pack",
        )
        product = builder.emit(relax.op.matmul(builder.emit(pack), u))
        out = builder.call_te(
            lambda p, ka: _output_transform(conv, p, ka), product, _const(np.kron(a_t, a_t), dtype),
            primfunc_name_hint="winograd_inverse",
        )
        return self._fusable(out)

    def _fusable(self, call: relax.Call) -> relax.Call:
        """``call``, its PrimFunc marked so that elementwise consumers (bias, ReLU) fuse into it."""
        gv = call.args[0]
        self.builder_.update_func(gv, self.builder_.get()[gv].with_attr("op_pattern", OUT_EWISE_FUSABLE))
        return call


class WinogradConv2D:
    """Graph rewrite ``winograd-conv2d``: eligible 3x3 convolutions to Winograd's F(4x4, 3x3) (module docstring)."""

    name = "winograd-conv2d"

    def __init__(self, max_work_ratio: float = MAX_WORK_RATIO, min_channel_mean: float = MIN_CHANNEL_MEAN) -> None:
        """The registered rewrite uses the module's limits; others (a benchmark forcing the form) may be given."""
        self.max_work_ratio = max_work_ratio
        self.min_channel_mean = min_channel_mean

    def rewrite(self, mod: tvm.IRModule, target: TargetSpec) -> tuple[tvm.IRModule, int]:
        """``mod`` with its eligible convolutions rewritten, and how many there were."""
        del target  # the form suits every CPU target; which convolutions pay is a matter of their shapes
        if not has_call(mod, _is_winograd_kind):
            return mod, 0  # nothing to fold the kernels for
        folded = relax.transform.FoldConstant()(mod)  # kernels an importer transposes become constants
        rewriter = _Rewrite(folded, self.max_work_ratio, self.min_channel_mean)
        for gv, func in list(folded.functions.items()):
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
        if not rewriter.count:
            return mod, 0
        return relax.transform.DeadCodeElimination()(rewriter.builder_.get()), rewriter.count
