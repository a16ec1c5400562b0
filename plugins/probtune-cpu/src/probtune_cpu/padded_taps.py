"""Dilated convolutions computed without the taps that read only padding: each output region with the taps it reads.

A convolution dilated as wide as its input (DeepLab's atrous pyramid: rates
12, 24 and 36 over a 32 x 32 map) reads zero padding with most of its taps at
most of its outputs: at rate 36 every tap but the centre one lies outside the
map for every output, at rate 24 three quarters of the multiplies are by
padding. A direct convolution computes them all; onnxruntime's kernels skip
them.

Along each spatial axis the outputs fall into bands that read the same
range of taps (a tap reads the map for an output when its input row lies
inside it, and those taps are consecutive). The rewrite computes each pair
of a row band and a column band as a convolution of its own, with that
range of the kernel, over the slice of the input those taps read, unpadded,
and concatenates the regions back into the output. Applied to ungrouped
float NHWC/HWIO convolutions where the regions' multiplies are at most
:data:`MAX_WORK_SHARE` of the convolution's, in at most :data:`MAX_REGIONS`
regions, and where every output reads the map with some tap.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax

from probtune.plugin import TargetSpec, static_shape
from probtune_cpu.relax_calls import has_call

__all__ = ["MAX_REGIONS", "MAX_WORK_SHARE", "PaddedTaps", "bands"]

MAX_WORK_SHARE = 2 / 3
"""Rewrite only where the regions' multiplies are at most this share of the convolution's (rate 12 over a 32 x 32
map keeps 56%, rate 8 69%): each region is a task of its own, tuned with a share of the trials, and the
concatenations are passes over the output."""

MAX_REGIONS = 9
"""Most regions (row bands x column bands) a convolution is split into: three bands per axis for a 3-tap kernel."""


@dataclass(frozen=True)
class Band:
    """Outputs ``start:stop`` along one axis, which read the map with taps ``first:last + 1`` (and only those)."""

    start: int
    stop: int
    first: int
    last: int

    @property
    def taps(self) -> int:
        return self.last - self.first + 1


def bands(size: int, out: int, taps: int, stride: int, dilation: int, before: int) -> list[Band] | None:
    """The outputs along one axis grouped by the taps that read the map (of ``size``, padded by ``before`` first);
    None where an output reads only padding."""
    found: list[Band] = []
    for o in range(out):
        valid = [k for k in range(taps) if 0 <= o * stride + k * dilation - before < size]
        if not valid:
            return None
        first, last = valid[0], valid[-1]
        if found and (found[-1].first, found[-1].last) == (first, last):
            found[-1] = Band(found[-1].start, o + 1, first, last)
        else:
            found.append(Band(o, o + 1, first, last))
    return found


@dataclass(frozen=True)
class _Split:
    """A convolution's row and column bands."""

    rows: list[Band]
    cols: list[Band]


def _split(call: relax.Call) -> _Split | None:
    """The bands of an eligible convolution, if splitting it pays; else None."""
    if not _is_kind(call):
        return None
    data, weight = static_shape(call.args[0].ty.shape), static_shape(call.args[1].ty.shape)
    out = static_shape(call.ty.shape)
    if data is None or weight is None or out is None:
        return None
    attrs = call.attrs
    top, left, _, _ = (int(p) for p in attrs.padding)
    (sh, sw), (dh, dw) = ([int(s) for s in attrs.strides], [int(d) for d in attrs.dilation])
    rows = bands(data[1], out[1], weight[0], sh, dh, top)
    cols = bands(data[2], out[2], weight[1], sw, dw, left)
    if rows is None or cols is None or len(rows) * len(cols) > MAX_REGIONS:
        return None
    kept = sum((r.stop - r.start) * r.taps for r in rows) * sum((c.stop - c.start) * c.taps for c in cols)
    share = kept / (out[1] * weight[0] * out[2] * weight[1])
    return _Split(rows, cols) if share <= MAX_WORK_SHARE else None


def _is_kind(call: relax.Call) -> bool:
    """An ungrouped float NHWC/HWIO convolution, dilated (only dilation leaves taps on padding for whole outputs)."""
    if not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.nn.conv2d":
        return False
    attrs = call.attrs
    return (
        (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) == ("NHWC", "HWIO", "NHWC")
        and int(attrs.groups) == 1
        and any(int(d) > 1 for d in attrs.dilation)
        and str(call.args[1].ty.dtype).startswith("float")
    )


@relax.expr_functor.mutator
class _Rewrite(relax.PyExprMutator):  # type: ignore[misc]
    """Replaces each convolution that pays by its regions' convolutions, concatenated."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.count = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        split = _split(call)
        if split is None:
            return call
        self.count += 1
        rows = [self._row(call, band, split.cols) for band in split.rows]
        return rows[0] if len(rows) == 1 else relax.op.concat(rows, axis=1)

    def _row(self, call: relax.Call, row: Band, cols: list[Band]) -> relax.Expr:
        regions = [self.builder_.emit(self._region(call, row, col)) for col in cols]
        return regions[0] if len(regions) == 1 else self.builder_.emit(relax.op.concat(regions, axis=2))

    def _region(self, call: relax.Call, row: Band, col: Band) -> relax.Expr:
        """The outputs of ``row`` x ``col``: the kernel's range of taps over the slice of the input they read."""
        data, weight = call.args
        attrs = call.attrs
        top, left, _, _ = (int(p) for p in attrs.padding)
        (sh, sw), (dh, dw) = ([int(s) for s in attrs.strides], [int(d) for d in attrs.dilation])
        begin = [row.start * sh + row.first * dh - top, col.start * sw + col.first * dw - left]
        end = [(row.stop - 1) * sh + row.last * dh - top + 1, (col.stop - 1) * sw + col.last * dw - left + 1]
        part = self._slice(data, [1, 2], begin, end)
        taps = self._slice(weight, [0, 1], [row.first, col.first], [row.last + 1, col.last + 1])
        return relax.op.nn.conv2d(
            part, taps, attrs.strides, (0, 0, 0, 0), attrs.dilation, 1,
            data_layout="NHWC", kernel_layout="HWIO", out_layout="NHWC", out_dtype=attrs.out_dtype,
        )

    def _slice(self, tensor: relax.Expr, axes: list[int], begin: list[int], end: list[int]) -> relax.Expr:
        """``tensor`` from ``begin`` to ``end`` along ``axes``; ``tensor`` itself where that is all of it (a slice is a
        copy: the region of a wide rate that reads the whole map reads it where it lies)."""
        shape = [int(tensor.ty.shape[axis]) for axis in axes]
        if begin == [0] * len(axes) and end == shape:
            return tensor
        return self.builder_.emit(relax.op.strided_slice(tensor, axes=axes, begin=begin, end=end))


class PaddedTaps:
    """Graph rewrite ``padded-taps``: dilated convolutions split into regions without their padding taps (module doc)."""

    name = "padded-taps"

    def rewrite(self, mod: tvm.IRModule, target: TargetSpec) -> tuple[tvm.IRModule, int]:
        """``mod`` with its eligible convolutions split, and how many there were."""
        del target  # which taps read padding is a matter of the convolution's shapes
        if not has_call(mod, lambda call: _split(call) is not None):
            return mod, 0
        rewriter = _Rewrite(mod)
        for gv, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
        return relax.transform.DeadCodeElimination()(rewriter.builder_.get()), rewriter.count
