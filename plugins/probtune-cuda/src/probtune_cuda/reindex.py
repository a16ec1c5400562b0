"""A convolution (or any contraction over several loops) rewritten as the matmul a tensor intrinsic computes.

A tensor-core tile multiplies ``A[i, k]`` by ``B[k, j]`` into ``C[i, j]``.
A 2-D convolution computes the same sums, with ``i`` running over a batch
and an image's rows and columns, ``k`` over the kernel's window and the
input channels, ``j`` over the output channels: TVM's
``get_auto_tensorize_mapping_info`` says which of the block's iterators feed
each of ``i``, ``j`` and ``k``. :func:`transform_to_intrinsic` fuses them:
each operand and the output is first copied through a buffer indexed by the
block's iterators (``reindex``), those buffers are laid out as the
intrinsic's ``[i, k]``, ``[k, j]`` and ``[i, j]`` (``transform_layout``),
and the block and the copies iterate in that space
(``transform_block_layout``). The operand copies gather the convolution's
windows (an im2col the tiling inlines into its shared-memory copies); the
output copy scatters the matmul's rows back into the image.

Unlike MetaSchedule, the whole reduction, the kernel's window included,
becomes the matmul's ``k``: a first layer's three input channels
otherwise make a 16-deep tile of mostly padding, and a 3x3 window nine
separate matmuls.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import TensorIntrin
from tvm.s_tir.schedule.analysis import get_auto_tensorize_mapping_info

from probtune.plugin import BlockRV, InstructionKind, as_list, identity, variable_ids

__all__ = ["TRANSFORM_TO_INTRINSIC", "contiguous_widths", "intrinsic_layout", "transform_to_intrinsic"]


def intrinsic_layout(raw: s_tir.Schedule, block_rv: s_tir.schedule.SBlockRV, intrinsic: str) -> Any | None:
    """The block's iteration space as the intrinsic's (batch..., i, j, k), with the reduction fused into ``k``.

    None where TVM finds no mapping, or where the block already iterates as
    the intrinsic does (each of ``i``, ``j`` and ``k`` one of its loops and
    each buffer indexed by them: a matmul, dense or batch matmul needs no
    transform).
    """
    found = _layout_and_mapping(raw, block_rv, intrinsic)
    return None if found is None else found[0]


def _layout_and_mapping(raw: s_tir.Schedule, block_rv: s_tir.schedule.SBlockRV, intrinsic: str) -> tuple[Any, Any] | None:
    """:func:`intrinsic_layout`, and TVM's mapping of the block onto the intrinsic it was made from."""
    sblock = raw.get(block_rv)
    if len(sblock.reads) != 2 or len(sblock.writes) != 1:
        return None
    info = get_auto_tensorize_mapping_info(raw, block_rv, TensorIntrin.get(intrinsic).desc)
    if info is None or len(info.mappings) != 1:
        return None
    mapping = info.mappings[0]
    initial, final = list(mapping.initial_indices), list(mapping.final_indices)
    extents = {identity(var): int(iv.dom.extent) for var, iv in zip(initial, info.lhs_iters)}
    reducing = {identity(var) for var, iv in zip(initial, info.lhs_iters) if int(iv.iter_type) == tirx.IterVar.CommReduce}
    outer, (i, j, k) = final[: len(final) - 3], final[len(final) - 3 :]
    window = [index for index in outer if isinstance(index, tirx.Var) and identity(index) in reducing]
    k_extent = math.prod(extents[var] for var in variable_ids(k))
    for index in reversed(window):  # the window's loops, outermost first, fused in front of k
        k, k_extent = index * k_extent + k, k_extent * extents[identity(index)]
    batch = [index for index in outer if not any(index.same_as(w) for w in window)]
    if not all(isinstance(index, tirx.Var) for index in batch):
        return None
    if not window and all(isinstance(index, tirx.Var) for index in (i, j, k)) and _plain(sblock):
        return None
    analyzer = tvm.sym.Analyzer()
    return tirx.IndexMap(initial, [*batch, *(analyzer.simplify(index) for index in (i, j, k))], None), info


def _plain(sblock: Any) -> bool:
    """Whether each of the block's buffers is indexed by its iterators or constants alone (not ``A[i, p * 768 + k]``,
    as a split reduction reads its operands)."""
    regions = [*sblock.reads, *sblock.writes]
    return all(isinstance(r.min, (tirx.Var, tirx.IntImm)) for region in regions for r in region.region)


def transform_to_intrinsic(raw: s_tir.Schedule, block_rv: s_tir.schedule.SBlockRV, intrinsic: str) -> list[Any]:
    """Rewrite the block as the intrinsic's matmul; the copies it reads and writes through (output, A, B).

    Raises ``ValueError`` where :func:`intrinsic_layout` finds no layout.
    """
    found = _layout_and_mapping(raw, block_rv, intrinsic)
    if found is None:
        raise ValueError(f"block {raw.get(block_rv).name_hint!r} has no layout as the intrinsic {intrinsic!r}")
    layout, info = found
    before = raw.get(block_rv)
    roles = {identity(buf): info.lhs_buffer_map[buf] for buf in info.lhs_buffer_map}
    rhs_indices = {identity(buf): as_list(info.rhs_buffer_indices[buf]) for buf in info.rhs_buffer_indices}
    store = raw.reindex(block_rv, ("write", 0))
    operands = [raw.reindex(block_rv, ("read", n)) for n in range(2)]
    sub_maps = {}
    for kind, index, region in [("read", n, r) for n, r in enumerate(before.reads)] + [("write", 0, before.writes[0])]:
        rhs = roles[identity(region.source)]
        now = (raw.get(block_rv).reads if kind == "read" else raw.get(block_rv).writes)[index]
        sub_maps[(kind, index)] = _buffer_map(layout, info, now.region, rhs_indices[identity(rhs)])
        raw.transform_layout(block_rv, (kind, index), sub_maps[(kind, index)], assume_injective_transform=True)
    raw.transform_block_layout(store, sub_maps[("write", 0)])
    for n, operand in enumerate(operands):
        raw.transform_block_layout(operand, sub_maps[("read", n)])
    raw.transform_block_layout(block_rv, layout)
    return [store, *operands]


def _buffer_map(layout: Any, info: Any, region: Any, rhs_indices: list[Any]) -> Any:
    """The layout of one reindexed buffer: its block iterators to the batch iterators it has, then its intrinsic indices.

    Iterators the buffer is not indexed by (unit loops TVM's ``reindex``
    leaves out) are zero in it.
    """
    initial = list(layout.initial_indices)
    of_block = {identity(iv.var): var for iv, var in zip(info.lhs_iters, initial)}
    source = [of_block[identity(r.min)] for r in region]
    present = {identity(var) for var in source}
    final = list(layout.map_indices([var if identity(var) in present else 0 for var in initial]))
    batch = len(final) - 3
    rhs_axes = {identity(iv.var): n for n, iv in enumerate(info.rhs_iters)}
    target = [index for index in final[:batch] if isinstance(index, tirx.Var) and identity(index) in present]
    target += [final[batch + rhs_axes[identity(index)]] for index in rhs_indices]
    analyzer = tvm.sym.Analyzer()
    return tirx.IndexMap(source, [analyzer.simplify(index) for index in target], None)


def contiguous_widths(raw: s_tir.Schedule, block_rv: s_tir.schedule.SBlockRV, widths: list[int]) -> list[int]:
    """The widths ``w`` at which a copy block reads each input ``w`` consecutive, aligned elements at a time.

    The block's innermost iterator, split into aligned groups of ``w``,
    must move through consecutive addresses of every input, starting at a
    multiple of ``w``. A matmul's operands allow any width; a convolution's
    window gather only some: NHWC images those dividing the input channels,
    NCHW filters read along the window those dividing its size, NCHW images
    none (the window runs along an image's rows). There a vector would be a
    gather of scalars, whose index vectors TVM's GPU check refuses as too
    wide.
    """
    sblock = raw.get(block_rv)
    iters = [iv.var for iv in sblock.iter_vars]
    extent, dtype = int(sblock.iter_vars[-1].dom.extent), str(sblock.iter_vars[-1].dom.extent.ty)
    found = []
    for width in widths:
        if extent % width:
            continue
        group, lane = tirx.Var("group", dtype), tirx.Var("lane", dtype)
        analyzer = tvm.sym.Analyzer()
        analyzer.bind(group, tvm.ir.Range(0, extent // width))
        analyzer.bind(lane, tvm.ir.Range(0, width))
        split = [*iters[:-1], group * width + lane]
        if all(_consecutive(read, iters, split, lane, width, analyzer) for read in sblock.reads):
            found.append(width)
    return found


def _consecutive(read: Any, iters: list[Any], split: list[Any], lane: Any, width: int, analyzer: Any) -> bool:
    """Whether the read's address is an aligned start plus ``lane``, its block's iterators written as ``split``."""
    indices = tirx.IndexMap(iters, [r.min for r in read.region], None).map_indices(split)
    address = functools.reduce(lambda total, pair: total * pair[0] + pair[1], zip(read.source.shape, indices), 0)
    start = analyzer.simplify(address - lane)
    return identity(lane) not in variable_ids(start) and analyzer.can_prove_equal(tirx.floormod(start, width), 0)


def _apply(sch: s_tir.Schedule, inputs: list[Any], attrs: dict[str, Any]) -> list[Any]:
    return transform_to_intrinsic(sch, inputs[0], attrs["intrinsic"])


TRANSFORM_TO_INTRINSIC = InstructionKind("transform_to_intrinsic", _apply, BlockRV, many=True)
"""Rewrite a block as a tensor intrinsic's matmul (:func:`transform_to_intrinsic`); outputs the output's and operands' copies."""
