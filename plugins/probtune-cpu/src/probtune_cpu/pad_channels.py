"""Channels padded to whole vectors: a convolution with 58 or 116 output channels computes 64 or 128.

A channels-last convolution vectorizes its output channels. Where their
number is not a multiple of the target's vector (58, 116, 232; 72 for
16-lane vectors), every tiling of that loop leaves vectors partly empty or
the loop scalar, which costs more than computing a few added channels.
Vendor libraries pad channels to blocks of the vector width for this reason
(onnxruntime's NCHWc layout).

The rewrite gives such a convolution a kernel with zero output channels
added up to a whole number of vectors (:func:`padded_channels`), and takes
the model's channels back with a crop (a ``strided_slice`` of the first
ones). The crop is then carried forward, as the transposes are
(:mod:`probtune.model.transposes`), past operators that treat each channel
alike (elementwise operators with constants or other padded tensors,
pooling, resizing, reductions over other axes) and into the next
convolution: a kernel with zero input channels added reads the padded
tensor whole, and a depthwise (grouped) convolution gets zero groups of its
own. The padded channels hold finite values (each of these operators keeps
a finite value finite), so the zero weights that read them add nothing. A
crop is left where any other operator reads the tensor (a concatenation, a
reshape) and fuses into it or into the operator before it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant

from probtune.plugin import TargetSpec, mutated, static_shape
from probtune_cpu.relax_calls import has_call
from probtune_cpu.vector_unit import vector_width

__all__ = ["MAX_EXTRA_WORK", "ChannelPolicy", "PadChannels", "VectorChannels", "padded_channels"]

MAX_EXTRA_WORK = 1 / 8
"""Pad only where the added channels are at most this share of the model's: 116 to 128 (10%) is, 18 to 24 is not."""

_UNARY = ("relax.nn.relu", "relax.sigmoid", "relax.tanh", "relax.nn.silu", "relax.nn.gelu", "relax.nn.gelu_tanh",
          "relax.clip", "relax.nn.leakyrelu", "relax.erf", "relax.negative", "relax.abs", "relax.round", "relax.astype")
"""Operators of one tensor that treat each channel alike and keep a finite value finite, whatever it is."""

_BINARY = ("relax.add", "relax.subtract", "relax.multiply", "relax.maximum", "relax.minimum", "relax.divide")
"""Elementwise operators of two tensors a crop is carried past (a divisor must be a constant: ones are added)."""

_POOLS = ("relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.nn.adaptive_avg_pool2d", "relax.image.resize2d")
"""Channel-wise spatial operators: carried past in a channels-last layout."""

_REDUCTIONS = ("relax.mean", "relax.sum", "relax.max", "relax.min")
"""Reductions: carried past where they keep the channel axis."""


def padded_channels(channels: int, lanes: int) -> int:
    """``channels`` rounded up to whole vectors of ``lanes``, else to half vectors, or as it is.

    Each rounding is taken only where it adds at most :data:`MAX_EXTRA_WORK`
    to the work, and half vectors only where whole ones cost more: the CPU
    tiling vectorizes by either, whole vectors run faster.
    """
    for width in (lanes, lanes // 2):
        if width < 2 or channels % width == 0:
            return channels
        padded = -(-channels // width) * width
        if padded - channels <= channels * MAX_EXTRA_WORK:
            return padded
    return channels


class ChannelPolicy(ABC):
    """Which convolutions a channel-padding rewrite pads, to how many channels, and which operators it carries crops past.

    The default (:class:`VectorChannels`) pads float convolutions' output channels to whole vectors; a target's
    instruction with a block shape of its own (VNNI's 16 lanes of 4-deep sums) pads integer ones to that.
    """

    @abstractmethod
    def pads(self, conv: relax.Call) -> bool:
        """Whether this rewrite pads (and extends for a carried crop) the convolution ``conv``."""

    @abstractmethod
    def output_channels(self, channels: int) -> int:
        """The output channels a convolution with ``channels`` of them computes."""

    def input_channels(self, channels: int) -> int:
        """The input channels a convolution reading a tensor of ``channels`` (not a carried crop) reads: added ones are
        zeros of a ``nn.pad``."""
        return channels

    def carries(self, call: relax.Call) -> bool:
        """Whether a crop is carried past ``call`` (an operator that treats each channel alike)."""
        return str(call.ty.dtype).startswith("float")


@dataclass(frozen=True)
class VectorChannels(ChannelPolicy):
    """Float convolutions' output channels padded to whole (or half) vectors of ``lanes`` (:func:`padded_channels`)."""

    lanes: int

    def pads(self, conv: relax.Call) -> bool:
        return str(conv.ty.dtype).startswith("float")

    def output_channels(self, channels: int) -> int:
        return padded_channels(channels, self.lanes)


def _pads(call: relax.Call, policy: ChannelPolicy) -> bool:
    """Whether ``call`` is a channels-last, ungrouped convolution whose channels the rewrite pads."""
    if not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.nn.conv2d" or not policy.pads(call):
        return False
    attrs, shape = call.attrs, static_shape(call.ty.shape)
    return (
        (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) == ("NHWC", "HWIO", "NHWC")
        and int(attrs.groups) == 1
        and shape is not None
        and (
            policy.output_channels(shape[-1]) != shape[-1]
            or policy.input_channels(_channels(call.args[0])) != _channels(call.args[0])
        )
    )


def _channels(expr: relax.Expr) -> int:
    """The size of a static tensor's last axis: its channels, channels-last."""
    return int(expr.ty.shape[-1])


def _padded_constant(value: np.ndarray, axis: int, size: int, fill: float = 0.0) -> relax.Constant:
    """``value`` grown to ``size`` along ``axis`` with ``fill``."""
    widths = [(0, 0)] * value.ndim
    widths[axis] = (0, size - value.shape[axis])
    return relax.const(np.pad(value, widths, constant_values=fill), str(value.dtype))


@relax.expr_functor.mutator
class _PadChannels(relax.PyExprMutator):  # type: ignore[misc]
    """Pads eligible convolutions' output channels and carries the crops that follow them forward."""

    def __init__(self, mod: tvm.IRModule, policy: ChannelPolicy) -> None:
        super().__init__(mod)
        self.policy = policy
        self.slice = tvm.ir.Op.get("relax.strided_slice")
        self.padded: set[relax.Var] = set()  # tensors this pass padded: only their crops are carried
        self.rules = {
            "relax.nn.conv2d": self.conv2d,
            **{name: self.unary for name in _UNARY + _POOLS},
            **{name: self.binary for name in _BINARY},
            **{name: self.reduction for name in _REDUCTIONS},
        }
        self.changed = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        rule = self.rules.get(call.op.name) if isinstance(call.op, tvm.ir.Op) else None
        if rule is None or static_shape(call.ty.shape) is None:
            return call
        if not (self.policy.pads(call) if rule == self.conv2d else self.policy.carries(call)):
            return call
        return rule(call)

    def cropped(self, expr: relax.Expr) -> tuple[relax.Var, int] | None:
        """The padded tensor ``expr`` is a crop of, and the channels kept; None if it is not one of this pass's."""
        bound = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        if not (isinstance(bound, relax.Call) and bound.op.same_as(self.slice) and bound.args[0] in self.padded):
            return None
        return bound.args[0], _channels(expr)

    def crop(self, padded: relax.Expr, channels: int) -> relax.Expr:
        """``padded`` emitted, and its first ``channels`` channels: what replaces the call a crop was carried past."""
        self.changed += 1
        var = self.builder_.emit(padded)
        self.padded.add(var)
        rank = len(var.ty.shape)
        return relax.op.strided_slice(var, [rank - 1], [0], [channels], assume_inbound=True)

    def conv2d(self, call: relax.Call) -> relax.Expr:
        """A channels-last convolution with a constant kernel, on padded input channels or to padded output ones."""
        attrs, (data, weight) = call.attrs, call.args
        if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NHWC", "HWIO", "NHWC"):
            return call
        if not isinstance(weight, Constant):
            return call
        kernel = weight.value.numpy()
        found = self.cropped(data)
        cin, cout, groups = _channels(data), kernel.shape[3], int(attrs.groups)
        width = _channels(found[0]) if found is not None else cin  # the input channels it will read
        if groups == 1:
            if found is None:
                width = self.policy.input_channels(cin)
                data = relax.op.nn.pad(data, [0, 0] * 3 + [0, width - cin]) if width != cin else data
            wide = self.policy.output_channels(cout)
            kernel = np.pad(kernel, [(0, 0), (0, 0), (0, width - cin), (0, 0)])  # zero weights for added inputs
        elif (width - cin) % kernel.shape[2] == 0:  # grouped (depthwise): added channels make zero groups of their own
            groups = width // kernel.shape[2]
            wide = groups * (cout // int(attrs.groups))
        else:
            return call
        if width == cin and wide == cout:
            return call
        data = found[0] if found is not None else data
        kernel = np.pad(kernel, [(0, 0), (0, 0), (0, 0), (0, wide - cout)])
        conv = relax.op.nn.conv2d(
            data, relax.const(kernel, str(kernel.dtype)), attrs.strides, attrs.padding, attrs.dilation, groups,
            "NHWC", "HWIO", "NHWC", attrs.out_dtype or None,
        )
        if wide == cout:  # padded input channels, whole output ones
            self.changed += 1
            return conv
        return self.crop(conv, cout)

    def unary(self, call: relax.Call) -> relax.Expr:
        found = self.cropped(call.args[0])
        layouts = {getattr(call.attrs, "layout", "NHWC"), getattr(call.attrs, "out_layout", None) or "NHWC"}
        if found is None or layouts != {"NHWC"}:
            return call
        return self.crop(relax.Call(call.op, [found[0], *call.args[1:]], call.attrs, call.ty_args), found[1])

    def binary(self, call: relax.Call) -> relax.Expr:
        """``op(crop(a), b)``: ``crop(op(a, b'))`` for ``b`` a crop of the same width, a constant (grown) or a
        broadcast along the channels."""
        a, b = call.args
        found = self.cropped(a) or self.cropped(b)
        rank = len(call.ty.shape)
        if found is None:
            return call
        width = _channels(found[0])
        operands = [self.operand(arg, width, found[1], rank, divisor=index == 1 and call.op.name == "relax.divide")
                    for index, arg in enumerate((a, b))]
        if any(operand is None for operand in operands):
            return call
        return self.crop(relax.Call(call.op, operands, call.attrs), found[1])

    def operand(self, arg: relax.Expr, width: int, channels: int, rank: int, divisor: bool) -> relax.Expr | None:
        """``arg`` as an operand over ``width`` channels; None where it cannot be one."""
        found = self.cropped(arg)
        if found is not None:  # never a divisor: its padded channels may be zero
            return found[0] if _channels(found[0]) == width and not divisor else None
        shape = static_shape(getattr(arg.ty, "shape", None))
        if shape is None or len(shape) > rank or (divisor and not isinstance(arg, Constant)):
            return None
        if not shape or shape[-1] == 1:
            return arg  # a broadcast along the channels
        if not isinstance(arg, Constant) or shape[-1] != channels:
            return None
        return _padded_constant(arg.value.numpy(), -1, width, 1.0 if divisor else 0.0)

    def reduction(self, call: relax.Call) -> relax.Expr:
        found = self.cropped(call.args[0])
        rank = len(call.args[0].ty.shape)
        axes = call.attrs.axis
        if found is None or axes is None or any(int(a) % rank == rank - 1 for a in axes):
            return call
        return self.crop(relax.Call(call.op, [found[0]], call.attrs, call.ty_args), found[1])


class PadChannels:
    """Graph rewrite ``pad-channels``: convolutions' output channels padded to whole vectors (module docstring)."""

    name = "pad-channels"

    def policy(self, target: TargetSpec) -> ChannelPolicy:
        """Which convolutions are padded on ``target``, and to what: float ones to its vector width."""
        return VectorChannels(vector_width(target))

    def rewrite(self, mod: tvm.IRModule, target: TargetSpec) -> tuple[tvm.IRModule, int]:
        """``mod`` with its convolutions padded and the crops carried, and how many operators now run padded."""
        policy = self.policy(target)
        if not has_call(mod, lambda call: _pads(call, policy)):
            return mod, 0  # nothing to fold the kernels for
        folded = relax.transform.FoldConstant()(mod)  # kernels the layout pass transposes become constants
        mutator = _PadChannels(folded, policy)
        rewritten = mutated(folded, mutator)
        return (rewritten, mutator.changed) if mutator.changed else (mod, 0)
