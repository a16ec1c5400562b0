"""GPU multi-level tiling: a reduction block tiled across thread blocks, virtual threads and threads.

The structure is MetaSchedule's for CUDA, ``SSSRRSRS``: each spatial loop is
split in five (thread block, virtual thread, thread, and two levels inside a
thread), each reduction loop in three. The first three spatial levels are
fused and bound to ``blockIdx.x``, ``vthread.x`` and ``threadIdx.x``. Each
input is read through a shared-memory copy made once per outermost reduction
tile and fetched by all the block's threads together (the copy is annotated
with its vector width, at most 16 bytes; ``rewrite-cooperative-fetch`` spreads it over the
threads), and the output is accumulated in registers (a local write cache)
written back under the thread loop.

Tile sizes and fetch widths are sampled; which blocks are tiled and the shape
of the nest depend only on the program, so every replay makes the same steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx

from probtune.plugin import (
    REDUCTION,
    SPATIAL,
    BlockRV,
    LoopRV,
    Schedule,
    SpaceContext,
    is_spatial,
    loop_kinds,
    reuses_data,
    sblock_names,
    thread_tag,
)
from probtune_cuda.blocks import unbound
from probtune_cuda.limits import MAX_VECTOR_BYTES

__all__ = [
    "COOPERATIVE_FETCH_KEY",
    "MAX_ACCUMULATORS",
    "SHARED",
    "GPUMultiLevelTiling",
    "accumulators_per_thread",
    "elementwise_consumer",
    "oversized_register_tiles",
]

SHARED = "shared.dyn"
"""Shared memory allocated at launch: TVM merges its buffers by lifetime, and a block may opt in to more than the
48 KB a static allocation gets (the target's ``max_shared_memory_per_block`` is that opt-in limit)."""

COOPERATIVE_FETCH_KEY = "probtune.cooperative_fetch"
"""Block annotation on a shared-memory copy: the vector width each thread loads with."""

MAX_ACCUMULATORS = 128
"""Output values one thread may accumulate: a thread has at most 255 registers, and a larger array goes to local memory."""

_THREAD_AXES = ("blockIdx.x", "vthread.x", "threadIdx.x")


@dataclass(frozen=True)
class GPUMultiLevelTiling:
    """Tile a reduction block that reuses its inputs (matmul, convolution) for the GPU's thread hierarchy."""

    name: str = "gpu-multi-level-tiling"
    spatial_levels: int = 5
    reduction_levels: int = 3
    max_innermost_factor: int = 64
    vector_load_lens: tuple[int, ...] = (1, 2, 3, 4, 8, 16)
    max_accumulators: int = MAX_ACCUMULATORS
    off_tile_weight: float = 0.01

    def prior(self, sch: s_tir.Schedule, ctx: SpaceContext) -> float:
        """Favour fresh draws whose threads accumulate at most ``max_accumulators`` values.

        Uniformly random tile sizes mostly give a thread thousands of
        accumulators on a large matmul, and such programs keep them in local
        memory; mutations still reach every tiling.
        """
        return float(self.off_tile_weight ** len(oversized_register_tiles(sch, self.max_accumulators)))

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> None:
        raw, block_rv = sch.tvm, sch.resolve(block)
        sblock = raw.get(block_rv)
        if not _tileable(raw, block_rv, sblock):
            return
        loops = sch.get_loops(block)
        kinds = loop_kinds(raw, block_rv, [sch.resolve(loop) for loop in loops])
        epilogue = elementwise_consumer(raw, block_rv)
        levels = self._split(sch, loops, kinds)
        thread_loops = [sch.fuse(*levels[depth]) for depth in range(len(_THREAD_AXES))]
        for loop, axis in zip(thread_loops, _THREAD_AXES):
            sch.bind(loop, axis)
        if epilogue is not None:  # the epilogue writes the result back; the block's own output stays in registers
            sch.set_scope(block, 0, "local")
            sch.reverse_compute_at(sch.get_sblock(epilogue), thread_loops[-1])
        else:
            write = sch.cache_write(block, 0, "local")
            sch.reverse_compute_at(write, thread_loops[-1])
        self._read_through_shared(sch, block, len(sblock.reads), levels[len(_THREAD_AXES)][-1])

    def _split(self, sch: Schedule, loops: list[LoopRV], kinds: list[str]) -> list[list[LoopRV]]:
        """Split every loop and reorder the pieces as ``SSSRRSRS``: the loops of each level, outermost level first."""
        spatial: list[list[LoopRV]] = [[] for _ in range(self.spatial_levels)]
        reduction: list[list[LoopRV]] = [[] for _ in range(self.reduction_levels)]
        for loop, kind in zip(loops, kinds):
            parts, levels = (self.spatial_levels, spatial) if kind == SPATIAL else (self.reduction_levels, reduction)
            factors = sch.sample_perfect_tile(loop, n=parts, max_innermost_factor=self.max_innermost_factor)
            for level, piece in zip(levels, sch.split(loop, factors)):
                level.append(piece)
        order = [spatial[0], spatial[1], spatial[2], reduction[0], reduction[1], spatial[3], reduction[2], spatial[4]]
        sch.reorder(*[loop for level in order for loop in level])
        return order

    def _read_through_shared(self, sch: Schedule, block: BlockRV, num_reads: int, at: LoopRV) -> None:
        """Copy each input's tile into shared memory under the outermost reduction tile, fetched by all threads."""
        for index in range(num_reads):
            copy = sch.cache_read(block, index, SHARED)
            sch.compute_at(copy, at)
            bits = tvm.DataType(str(sch.tvm.get(sch.resolve(copy)).writes[0].source.dtype)).bits
            widths = [n for n in self.vector_load_lens if n * bits <= 8 * MAX_VECTOR_BYTES] or [1]
            sch.annotate(copy, COOPERATIVE_FETCH_KEY, sch.sample_uniform(widths))


def oversized_register_tiles(raw: s_tir.Schedule, limit: int) -> list[tuple[str, int]]:
    """(block, accumulators per thread) of each tiled block whose threads accumulate more than ``limit`` values."""
    found = []
    for name in sblock_names(raw):
        count = accumulators_per_thread(raw, raw.get_sblock(name))
        if count is not None and count > limit:
            found.append((name, count))
    return found


def accumulators_per_thread(raw: s_tir.Schedule, block_rv: s_tir.schedule.SBlockRV) -> int | None:
    """Output values one thread accumulates for a reduction block tiled under ``threadIdx``: vthreads x inner spatial tile.

    None for a block that reduces nothing or has no thread-bound loop.
    """
    if not any(int(iv.iter_type) == tirx.IterVar.CommReduce for iv in raw.get(block_rv).iter_vars):
        return None
    loops = list(raw.get_loops(block_rv))
    bound = [thread_tag(raw.get(loop)) for loop in loops]
    if "threadIdx.x" not in bound:
        return None
    inner = bound.index("threadIdx.x") + 1
    count = 1
    for loop, kind in zip(loops[inner:], loop_kinds(raw, block_rv, loops[inner:])):
        if kind == SPATIAL:
            count *= int(raw.get(loop).extent)
    for loop, tag in zip(loops, bound):
        if tag.startswith("vthread"):
            count *= int(raw.get(loop).extent)
    return count


def elementwise_consumer(raw: s_tir.Schedule, block_rv: s_tir.schedule.SBlockRV) -> str | None:
    """The name of the block's only consumer if it reads the block's output element for element and nothing else does.

    Its loops then follow the block's spatial tiles, so it can finish each
    output value in registers (a bias add, an activation), as MetaSchedule's
    write reuse does for CUDA.
    """
    consumers = raw.get_consumers(block_rv)
    output = raw.get(block_rv).writes[0].source
    if len(consumers) != 1 or any(param.same_as(output) for param in raw.mod["main"].params):
        return None
    consumer = raw.get(consumers[0])
    if not is_spatial(consumer):
        return None
    return str(consumer.name_hint) if reads_element_for_element(consumer, output) else None


def reads_element_for_element(consumer: s_tir.SBlock, buffer: tirx.Var) -> bool:
    """Whether ``consumer`` reads ``buffer`` once, at the element its own iteration writes."""
    reads = [read for read in consumer.reads if read.source.same_as(buffer)]
    own = [iv.var for iv in consumer.iter_vars]
    if len(reads) != 1 or len(reads[0].region) != len(own):
        return False
    return all(
        isinstance(r.extent, tirx.IntImm) and int(r.extent) == 1 and r.min.same_as(var)
        for r, var in zip(reads[0].region, own)
    )


def _inputs_read_elsewhere(raw: s_tir.Schedule, sblock: s_tir.SBlock) -> bool:
    """Whether another block of the program reads a buffer that ``sblock`` reads."""
    inputs = [region.source for region in sblock.reads]
    for name in sblock_names(raw):
        other = raw.get(raw.get_sblock(name))
        if not other.same_as(sblock) and any(r.source.same_as(b) for r in other.reads for b in inputs):
            return True
    return False


def _tileable(raw: s_tir.Schedule, block_rv: s_tir.schedule.SBlockRV, sblock: s_tir.SBlock) -> bool:
    """A block at the root and unbound, one output, reducing over some loop, each loop feeding spatial or reduction iterators only,
    whose inputs no other block reads (their shared-memory copies, which TVM makes for every reader, could not be
    computed under the block's loops: RoBERTa's padding mask, counted by a product and multiplied in its epilogue)."""
    if not unbound(raw, block_rv) or len(sblock.writes) != 1 or not reuses_data(sblock, unit_iterators=False):
        return False
    if _inputs_read_elsewhere(raw, sblock):
        return False
    if not any(int(iv.iter_type) == tirx.IterVar.CommReduce for iv in sblock.iter_vars):
        return False
    kinds = loop_kinds(raw, block_rv, list(raw.get_loops(block_rv)))
    return SPATIAL in kinds and all(kind in (SPATIAL, REDUCTION) for kind in kinds)
