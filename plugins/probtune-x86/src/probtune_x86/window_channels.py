"""A bfloat16 convolution with few input channels reads its window's columns as channels, so that AMX tiles take it.

An AMX tile product sums 32 bfloat16 terms per row, and a convolution sums
its input channels at each tap: an image model's first convolution has 3
(4 once padded to the dot product's depth), too few for a tile (``amx_plan``
leaves it to the vector instruction). The graph rewrite
``fold-window-columns`` computes a convolution of kernel ``kh x kw``, stride
``(sh, sw)`` and ``C`` input channels as one of kernel ``kh x 1`` and stride
``(sh, 1)`` over

    x'[n, h, ox, rx * C + c] = x[n, h, ox * sw + rx - left, c]

(the input padded along its width, ``kw`` strided slices of it concatenated
along the channels, then zero channels up to a whole tile of terms), with the
kernel reshaped to ``[kh, 1, kw * C, O]`` and padded with zeros alike. The
output is the same. ``x'`` is ``kw / sw`` times the input, written by the
input's own injective task.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant

from probtune.plugin import TargetSpec, mutated, static_shape
from probtune_cpu.llvm_features import llvm_target_has
from probtune_cpu.relax_calls import has_call
from probtune_x86.amx import AMX_BF16, BF16_TILE, TILE_COLUMNS, tile_rows

__all__ = ["MIN_TERMS_USED", "FoldWindowColumns", "folded_channels"]

MIN_TERMS_USED = 1 / 4
"""The least share of a folded convolution's tile terms that are its own (not zero channels): a tile product
computed several times the vector dot product's sums per operator (``bench/amx.py``), so a tile a quarter full still
gains; ResNet's 7x7 stem over 4 channels uses 28 of 32 bfloat16 terms."""


def folded_channels(columns: int, channels: int, terms: int) -> int | None:
    """The input channels of a convolution whose ``columns`` x ``channels`` window row is folded into its channels,
    padded to whole tiles of ``terms``; None where they would be mostly zeros (``MIN_TERMS_USED``) or the convolution
    already fills a tile's terms."""
    if channels >= terms or columns < 2:
        return None
    padded = -(-columns * channels // terms) * terms
    return padded if columns * channels >= padded * MIN_TERMS_USED else None


def _folds_on(call: relax.Call, target: TargetSpec) -> bool:
    """Whether ``call`` is a convolution of bfloat16 operands summed in float32 and ``target``'s CPU has AMX-BF16.
    An 8-bit tile takes 64 terms, and ResNet's stem folded onto one (28 of them its own) ran slower than its unfolded
    ``vpdpbusd`` program tuned with the same trials (``bench/amx.py --stem``): 8-bit convolutions are not folded."""
    if not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.nn.conv2d" or len(call.args) != 2:
        return False
    types = tuple(str(getattr(expr.ty, "dtype", "")) for expr in (*call.args, call))
    return (types == (AMX_BF16.a_dtype, AMX_BF16.b_dtype, AMX_BF16.accumulator)
            and llvm_target_has(dict(target.tvm_target), AMX_BF16.llvm_feature))


def _plan(call: relax.Call, target: TargetSpec) -> int | None:
    """The folded input channels of a convolution this rewrite folds (module docstring); None for any other: it must
    be channels-last, ungrouped and undilated, with static shapes, output rows a tile's and channels whole tiles'."""
    if not _folds_on(call, target):
        return None
    attrs = call.attrs
    data, out = static_shape(call.args[0].ty.shape), static_shape(call.ty.shape)
    kernel = static_shape(call.args[1].ty.shape)
    if (
        (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NHWC", "HWIO", "NHWC")
        or int(attrs.groups) != 1
        or any(int(d) != 1 for d in attrs.dilation)
        or data is None or out is None or kernel is None
        or out[3] % TILE_COLUMNS
        or tile_rows(out[2]) is None
    ):
        return None
    return folded_channels(kernel[1], data[3], BF16_TILE.terms)


@relax.expr_functor.mutator
class _FoldWindowColumns(relax.PyExprMutator):  # type: ignore[misc]
    """Folds each eligible convolution's window columns into its channels."""

    def __init__(self, mod: tvm.IRModule, target: TargetSpec) -> None:
        super().__init__(mod)
        self.target = target
        self.changed = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        channels = _plan(call, self.target)
        if channels is None or not isinstance(call.args[1], Constant):
            return call
        self.changed += 1
        return self.folded(call, channels)

    def folded(self, call: relax.Call, channels: int) -> relax.Expr:
        """``call`` as a ``kh x 1`` convolution over its input's window rows laid out as ``channels`` channels."""
        attrs, (data, weight) = call.attrs, call.args
        kernel = weight.value.numpy()  # HWIO
        kh, kw, cin, cout = kernel.shape
        top, left, bottom, right = (int(p) for p in attrs.padding)
        sh, sw = (int(s) for s in attrs.strides)
        width = int(call.ty.shape[2])  # the output's columns: static, as _plan found
        wide = relax.op.nn.pad(data, [0, 0, 0, 0, left, right, 0, 0]) if left or right else data
        columns = [
            relax.op.strided_slice(wide, [2], [rx], [rx + sw * (width - 1) + 1], [sw], assume_inbound=True)
            for rx in range(kw)
        ]
        rows = relax.op.concat(columns, axis=3)
        rows = relax.op.nn.pad(rows, [0, 0] * 3 + [0, channels - kw * cin]) if channels > kw * cin else rows
        folded = np.zeros((kh, 1, channels, cout), kernel.dtype)
        folded[:, 0, : kw * cin] = kernel.reshape(kh, kw * cin, cout)
        return relax.op.nn.conv2d(
            rows, relax.const(folded, str(kernel.dtype)), (sh, 1), (top, 0, bottom, 0), (1, 1), 1,
            "NHWC", "HWIO", "NHWC", attrs.out_dtype or None,
        )


@dataclass(frozen=True)
class FoldWindowColumns:
    """Graph rewrite ``fold-window-columns``: bfloat16 convolutions with too few input channels for an AMX tile read
    their window's columns as channels (module docstring); on a target whose CPU has no tiles it changes nothing."""

    name: str = "fold-window-columns"

    def rewrite(self, mod: tvm.IRModule, target: TargetSpec) -> tuple[tvm.IRModule, int]:
        """``mod`` with its eligible convolutions folded, and how many."""
        if not has_call(mod, lambda call: _plan(call, target) is not None):
            return mod, 0
        folded = relax.transform.FoldConstant()(mod)  # kernels the layout pass transposes become constants
        mutator = _FoldWindowColumns(folded, target)
        rewritten = mutated(folded, mutator)
        return (rewritten, mutator.changed) if mutator.changed else (mod, 0)
