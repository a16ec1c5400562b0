"""Split-K: a tensor-core product with few output tiles and a long reduction, its reduction split over thread blocks.

A product such as a transformer's second feed-forward layer at batch 1
(128 x 768 outputs, 3072 deep) gives a GPU a few dozen output tiles: most
of its multiprocessors idle while each tile's block walks the whole
reduction. Split into ``parts`` (``rfactor``), each part of the reduction
becomes a slice of a batch of partial products, ``parts`` times as many
thread blocks, computed on the tensor cores like any batched product; a
second kernel sums each output's partials and finishes the product's
epilogue (bias, residual, activation, cast) on the way.

Whether a product may be split depends only on its shape and the target:
its tiles of ``TILE_EDGE`` square would leave more than half the target's
multiprocessors idle, and its reduction is longer than either output side
and than ``MIN_DEPTH``. Such a product's space has two sketches, the
product computed whole and split (a trace's steps cannot depend on a
sampled value), so the measurements choose; the number of parts is sampled
(2 to ``MAX_PARTS``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from probtune.plugin import SPATIAL, BlockRV, LoopRV, Schedule, SpaceContext, loop_kinds
from probtune_cuda.multi_level_tiling import elementwise_consumer

__all__ = ["MAX_PARTS", "MIN_DEPTH", "MIN_PART_DEPTH", "TILE_EDGE", "bind_partial_sums", "multiprocessors", "split_choices"]

TILE_EDGE = 64
"""The output tile, rows and columns, against which the target's multiprocessors are counted."""

MIN_DEPTH = 1024
"""A product with a shorter reduction is not split: one tile's thread block walks it in about a kernel launch's time,
which the kernel summing the partials would add."""

MIN_PART_DEPTH = 128
"""A part's reduction at least this deep: several shared-memory stages, so its pipeline still overlaps."""

MAX_PARTS = 16

_PARTIAL_SUM_THREADS = (64, 128, 256)
_FEW_TILES = 0.5  # split where the output's tiles would occupy at most this share of the multiprocessors


def multiprocessors(ctx: SpaceContext) -> int:
    """The target's streaming multiprocessors, as its ``multiprocessors`` attribute states them; 0 where it does not."""
    return int(ctx.target.attrs.get("multiprocessors", 0))


def split_choices(extents: Sequence[int], tile_loops: tuple[int, int, int], ctx: SpaceContext, tile: int) -> list[int]:
    """The numbers of parts to sample for a product with these loop extents, or [] where it is not split.

    ``tile_loops`` index the product's rows, columns and reduction among
    ``extents``; the other loops are a batch. Each part's depth stays a
    multiple of ``tile`` (the intrinsic's) and at least ``MIN_PART_DEPTH``.
    """
    rows, columns, depth = (extents[index] for index in tile_loops)
    batch = math.prod(extent for n, extent in enumerate(extents) if n not in tile_loops)
    tiles = batch * -(-rows // TILE_EDGE) * -(-columns // TILE_EDGE)
    if tiles > _FEW_TILES * multiprocessors(ctx) or depth <= max(rows, columns, MIN_DEPTH - 1):
        return []
    parts = [2**n for n in range(1, int(math.log2(MAX_PARTS)) + 1)]
    choices = [n for n in parts if depth % (n * tile) == 0 and depth // n >= MIN_PART_DEPTH]
    return choices


def bind_partial_sums(sch: Schedule, block: BlockRV) -> None:
    """Sum an output's partials in one thread, then finish the block's elementwise consumers there.

    ``block`` is what ``rfactor`` left of the product: each output the sum
    of its parts' partials, reduced innermost. Its leading spatial loops
    are spread over thread blocks of a sampled number of threads; its
    consumers that read it element for element (the copy out of the
    intrinsic's layout, the epilogue) run under the same thread, so the
    sum stays in a register and the output is written once.
    """
    loops = sch.get_loops(block)
    kinds = loop_kinds(sch.tvm, sch.resolve(block), [sch.resolve(loop) for loop in loops])
    spatial = [loop for loop, kind in zip(loops, kinds) if kind == SPATIAL]
    grid, lanes = sch.split(sch.fuse(*spatial), [None, sch.sample_uniform(_PARTIAL_SUM_THREADS)])
    sch.bind(grid, "blockIdx.x")
    sch.bind(lanes, "threadIdx.x")
    _finish_in_thread(sch, block, lanes)


def _finish_in_thread(sch: Schedule, block: BlockRV, lanes: LoopRV) -> None:
    """Move the chain of ``block``'s elementwise consumers under ``lanes``; ``block``'s own output then lives in registers."""
    consumer = elementwise_consumer(sch.tvm, sch.resolve(block))
    if consumer is None:
        return
    sch.set_scope(block, 0, "local")
    first = sch.get_sblock(consumer)
    sch.reverse_compute_at(first, lanes)
    while (later := elementwise_consumer(sch.tvm, sch.resolve(first))) is not None:
        sch.reverse_compute_inline(sch.get_sblock(later))
