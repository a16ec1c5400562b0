"""Multi-level tiling: the loop structure behind fast CPU reductions (matmul, conv).

After tiling, the block's results are written back tile by tile (MetaSchedule's
"may reuse" write cache): an elementwise consumer such as a bias add or a ReLU
is fused into the tile, or, for a block writing a function output, a write
cache is added and its copy-out is fused into the tile. Either way the
accumulator stays in cache while it is finished and stored.

Which tile level the write-back sits under is sampled (``sample_categorical``),
but a trace cannot pick a loop by a sampled value, so the module records the
sample as a block annotation and the post-processor
``rewrite-write-back-location`` does the ``reverse_compute_at`` on every
replayed program; the trace's structure never depends on sampled values.

An input that the innermost (vectorized) loop walks with a stride, such as
dense's ``W[j, k]`` along ``j``, is packed: each outermost tile of that loop
copies its slice into a buffer laid out in panels, ``[j // w, k, j % w]``
with ``w`` the kernel's vector tile (``rewrite-packed-layout`` lays it out;
traces have no layout instruction), so that the kernel loads whole vectors,
one panel after the other, instead of gathering lanes. The copy is read by
every row of the tile, so it costs little next to the gathers it saves: tunes
found faster programs with it than without, and with panels than with the
slice laid out ``[k, j]`` (bench/results/NOTES.md).

An input that the vectorized loop reads contiguously but a reduction loop
walks with a stride, such as matmul's ``B[k, j]`` along ``k``, may be packed
into the same panels (a sampled choice), which the kernel reads as one
sequential stream, as vendor BLAS kernels do; tunes found faster programs
with the choice than without (bench/results/NOTES.md). Either packing copy sits
under the outermost tile of the vectorized loop, which goes first among the
outer tiles: each slice is copied once and read by every row tile.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import tvm_ffi
from tvm import DataType, ir, s_tir, tirx

from probtune.plugin import (
    REDUCTION,
    SPATIAL,
    UNROLL_KEY,
    BlockRV,
    ExprRV,
    LoopRV,
    Schedule,
    SpaceContext,
    at_root,
    contiguous_along,
    indexing_dims,
    is_spatial,
    last_line,
    layout_free_params,
    loop_kinds,
    reuses_data,
    sblock_names,
)
from probtune_cpu.parallel_vectorize import PARALLEL_KEY, VECTORIZE_KEY
from probtune_cpu.tensorize import TENSORIZE_KEY
from probtune_cpu.vector_unit import vector_register_bytes, vector_width

__all__ = [
    "OFF_REGISTER_TILE_WEIGHT",
    "PACKED_DIM_KEY",
    "PANEL_DIM_KEY",
    "PANEL_KEY",
    "REGISTER_TILE",
    "WRITE_BACK_DEPTH_KEY",
    "MultiLevelTiling",
    "RewritePackedLayout",
    "RewriteWriteBackLocation",
    "accumulator_bytes",
    "order_levels",
    "write_back_per_tile",
]

REGISTER_TILE = (0.25, 0.5)
"""The share of the vector register file (low, high) that a fresh draw's accumulator tiles are favoured to take."""

OFF_REGISTER_TILE_WEIGHT = 0.1
"""The probability a fresh draw with an accumulator tile outside ``REGISTER_TILE`` is kept."""

WRITE_BACK_DEPTH_KEY = "probtune.write_back_depth"
"""Block annotation: the write-back goes under this many of the tiled block's outer loops."""

PACKED_DIM_KEY = "probtune.packed_dim"
"""Block annotation on a packing copy: this dimension of the buffer it writes becomes the last one.

Traces recorded before ``PANEL_DIM_KEY`` carry it; it keeps replaying them to the programs that were measured.
"""

PANEL_DIM_KEY = "probtune.panel_dim"
"""Block annotation on a packing copy: this dimension of the buffer it writes is cut into panels of the kernel's vector tile."""

PANEL_KEY = "probtune.panel"
"""Block annotation on a panel copy, sampled: 1 lays its buffer out in panels of the kernel's vector tile, 0 inlines the copy."""


def _is_point_access(region: ir.TensorRegion, iter_vars: list[tirx.IterVar]) -> bool:
    """Whether ``region`` is the single element indexed by ``iter_vars``, in order."""
    return len(region.region) == len(iter_vars) and all(
        isinstance(r.extent, tirx.IntImm) and int(r.extent) == 1 and r.min.same_as(iv.var)
        for r, iv in zip(region.region, iter_vars)
    )


def _has_elementwise_consumer(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """Whether the block's only consumer, at the root, reads each produced element where it was produced."""
    consumers = sch.get_consumers(block)
    if len(consumers) != 1 or not at_root(sch, consumers[0]):
        return False
    producer, consumer = sch.get(block), sch.get(consumers[0])
    if len(producer.writes) != 1 or len(consumer.writes) != 1:
        return False
    if not is_spatial(consumer):
        return False
    spatial = [iv for iv in producer.iter_vars if int(iv.iter_type) == tirx.IterVar.DataPar]
    same_space = len(spatial) == len(consumer.iter_vars) and all(
        tvm_ffi.structural_equal(p.dom.extent, c.dom.extent) for p, c in zip(spatial, consumer.iter_vars)
    )
    reads = [r for r in consumer.reads if r.source.same_as(producer.writes[0].source)]
    return (
        same_space
        and bool(reads)
        and _is_point_access(producer.writes[0], spatial)
        and all(_is_point_access(r, list(consumer.iter_vars)) for r in reads)
    )


def _take_annotation(sch: s_tir.Schedule, key: str) -> Iterator[tuple[str, s_tir.schedule.SBlockRV, int]]:
    """Each block annotated with ``key``: its name, the block and the value; the annotation is removed as it is acted on."""
    for name in sblock_names(sch):
        block = sch.get_sblock(name)
        annotations = sch.get(block).annotations
        if key in annotations:
            value = int(annotations[key])
            sch.unannotate(block, key)
            yield name, block, value


def _repays_copy(sch: s_tir.Schedule, sblock: s_tir.SBlock, index: int, reused_over: list[dict]) -> bool:
    """Whether a packing copy of ``sblock``'s read ``index`` pays for itself and is safe.

    The buffer must be a function input that no other block reads, and
    either a constant whose copy is made once (``layout_free_params``: a
    model's weight, even one a GEMV reads once per call) or read the same
    for every iteration of another spatial loop (one whose
    ``indexing_dims`` in ``reused_over`` lacks it): dense's ``W`` and
    matmul's ``B`` serve every row.
    """
    source = sblock.reads[index].source
    func = sch.mod["main"]
    position = next((i for i, param in enumerate(func.params) if source.same_as(param)), None)
    return (
        position is not None
        and (position in layout_free_params(func) or any(("read", index) not in indexed for indexed in reused_over))
        and not any(
            name != sblock.name_hint and any(r.source.same_as(source) for r in sch.get(sch.get_sblock(name)).reads)
            for name in sblock_names(sch)
        )
    )


def _tileable(kinds: list[str], sblock: s_tir.SBlock) -> bool:
    """Whether a block whose loops are of ``kinds`` is one multi-level tiling tiles: a reduction over data it reuses."""
    return REDUCTION in kinds and SPATIAL in kinds and not set(kinds) - {SPATIAL, REDUCTION} and reuses_data(sblock)


def accumulator_bytes(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> int | None:
    """Bytes of output a data-reusing reduction block updates inside its innermost reduction loop: its register tile.

    The spatial loops below the innermost reduction loop of extent above 1
    make the tile (conv2d's output channels x rows x columns under its
    reduction over input channels); None for a block that is not a
    reduction over data it reuses, whose loops are not all its own, or
    whose extents are not constant.
    """
    loops = sch.get_loops(block)
    kinds = loop_kinds(sch, block, loops)
    sblock = sch.get(block)
    if not _tileable(kinds, sblock):
        return None
    elements = 1
    for loop, kind in zip(reversed(loops), reversed(kinds)):
        extent = sch.get(loop).extent
        if not isinstance(extent, tirx.IntImm):
            return None
        if kind == REDUCTION and int(extent) > 1:
            break
        if kind == SPATIAL:
            elements *= int(extent)
    return elements * DataType(sblock.writes[0].source.dtype).bits // 8


def _writes_output(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    params = sch.mod["main"].params
    return any(any(w.source.same_as(p) for p in params) for w in sch.get(block).writes)


def order_levels(levels: dict[str, list[list[LoopRV]]], structure: str) -> tuple[list[LoopRV], list[int]]:
    """The tiles of ``levels`` (per kind, outermost level first) in ``structure``'s order ("SSRSRS"), and per
    level of ``structure`` how many of them are at or above it."""
    order: list[LoopRV] = []
    level_ends: list[int] = []
    taken = {SPATIAL: 0, REDUCTION: 0}
    for letter in structure:
        kind = SPATIAL if letter == "S" else REDUCTION
        order.extend(levels[kind][taken[kind]])
        taken[kind] += 1
        level_ends.append(len(order))
    return order, level_ends


def write_back_per_tile(sch: Schedule, block: BlockRV, depths: list[int]) -> ExprRV | None:
    """Give the block a write-back that can follow it into the tile, and sample under how many loops it goes.

    The sampled depth is returned (None without a write-back), for a caller that blockizes the block to move
    onto the tile.
    """
    if not _has_elementwise_consumer(sch.tvm, sch.resolve(block)):
        if not _writes_output(sch.tvm, sch.resolve(block)):
            return None
        sch.cache_write(block, 0, "global")
    depth = sch.sample_uniform(depths)
    sch.annotate(block, WRITE_BACK_DEPTH_KEY, depth)
    return depth


@dataclass(frozen=True)
class MultiLevelTiling:
    """Tile spatial loops in ``structure``'s S levels and reduction loops in its R levels, then write back per tile.

    With the default "SSRSRS" every spatial loop is split into 4 sampled
    perfect tiles and every reduction loop into 2, then the tiles are
    reordered level by level, so that the innermost levels form a small
    register/L1-resident kernel and the outer ones walk the caches.
    ``write_back_levels`` are the (1-based) levels of ``structure`` after
    which the write-back may go; they must be S levels. With
    ``pack_strided_inputs``, function inputs read with a stride along the
    innermost spatial loop are packed per outermost tile of that loop; with
    ``pack_panels``, inputs it reads contiguously but a reduction loop walks
    with a stride may be (sampled); a constant weight (``layout_free_params``)
    always repays its copy, made once when the model is compiled. A
    reduction without data reuse (a row max or sum: every input element
    serves one output) has no tiles to keep in cache and is left alone, as
    MetaSchedule does: untiled, ``random-compute-location`` can move it into
    its consumer's loop over rows (softmax's row max, exponentials, sum and
    normalisation in one pass over each row). With
    ``align_innermost_to_vector``, the innermost tile of the loop that is
    vectorized is a whole number of target vectors (else of half vectors)
    whenever the loop's extent allows it: a random tiling otherwise mostly
    draws innermost tiles of 1-4 lanes, which leave AVX2/AVX-512/NEON
    registers partly empty. Its
    :meth:`prior` favours fresh draws whose accumulator tiles take
    ``register_tile`` (shares, low and high) of the target's vector
    registers.
    """

    name: str = "multi-level-tiling"
    structure: str = "SSRSRS"
    max_innermost_factor: int = 64
    write_back_levels: tuple[int, ...] = (1, 2)
    align_innermost_to_vector: bool = True
    pack_strided_inputs: bool = True
    pack_panels: bool = True
    register_tile: tuple[float, float] = REGISTER_TILE
    off_register_tile_weight: float = OFF_REGISTER_TILE_WEIGHT

    def prior(self, sch: s_tir.Schedule, ctx: SpaceContext) -> float:
        """Favour fresh draws whose accumulator tiles fill ``register_tile`` of the target's vector registers.

        A tiled block's accumulator tile (:func:`accumulator_bytes`) outside
        that share of the register file keeps a draw with probability
        ``off_register_tile_weight``. Random tilings mostly draw small
        innermost tiles, and in conv2d tunes the programs with tiles outside
        the range ran well slower than the best of their tune and seldom came
        near it (above a half, the inputs' vectors no longer fit beside the
        accumulators); the prior puts many more draws in the range
        (bench/results/NOTES.md). A block an instruction replaces is left
        to the module that tiled it (its iterations are the instruction's).
        """
        low, high = (share * vector_register_bytes(ctx.target) for share in self.register_tile)
        weight = 1.0
        for name in sblock_names(sch):
            block = sch.get_sblock(name)
            if TENSORIZE_KEY in sch.get(block).annotations:
                continue
            tile = accumulator_bytes(sch, block)
            if tile is not None and not low <= tile <= high:
                weight *= self.off_register_tile_weight
        return weight

    def __post_init__(self) -> None:
        s_levels = [index + 1 for index, letter in enumerate(self.structure) if letter == "S"]
        if not self.write_back_levels or not set(self.write_back_levels) <= set(s_levels):
            raise ValueError(f"write_back_levels {self.write_back_levels} must name S levels of {self.structure!r}")

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> None:
        if not at_root(sch.tvm, sch.resolve(block)):  # blockized into an instruction's tile by an earlier module
            return
        loops = sch.get_loops(block)
        kinds = loop_kinds(sch.tvm, sch.resolve(block), [sch.resolve(loop) for loop in loops])
        if not _tileable(kinds, sch.tvm.get(sch.resolve(block))) or any(sch.loop_extent(loop) is None for loop in loops):
            return
        levels: dict[str, list[list[LoopRV]]] = {
            SPATIAL: [[] for _ in range(self.structure.count("S"))],
            REDUCTION: [[] for _ in range(self.structure.count("R"))],
        }
        spatial = [loop for loop, kind in zip(loops, kinds) if kind == SPATIAL]
        reductions = [loop for loop, kind in zip(loops, kinds) if kind == REDUCTION]
        raw, block_rv = sch.tvm, sch.resolve(block)
        # the reads that are the same for every iteration of some other spatial loop (a copy of them is reused)
        reused_over = [indexing_dims(raw, block_rv, sch.resolve(loop)) for loop in spatial[:-1] if sch.loop_extent(loop) != 1]
        packed = self._packable_inputs(sch, block, spatial, reused_over)
        vector_loop, lanes = self._vector_loop(sch, block, spatial[-1], vector_width(ctx.target), packed)
        panels = self._panel_inputs(sch, block, spatial, reductions, reused_over) if vector_loop is not None else []
        lanes_loop: LoopRV | None = None
        for loop, kind in zip(loops, kinds):
            depth = len(levels[kind])
            max_innermost = self.max_innermost_factor
            if loop == vector_loop:
                loop, lanes_loop = sch.split(loop, [None, lanes])
                max_innermost = max(1, self.max_innermost_factor // lanes)
            tiles = sch.sample_perfect_tile(loop, depth, max_innermost)
            for level, tile_loop in zip(levels[kind], sch.split(loop, tiles)):
                level.append(tile_loop)
        if lanes_loop is not None:
            levels[SPATIAL][-1].append(lanes_loop)
        outer_tiles = levels[SPATIAL][0]
        if packed or panels:  # the vectorized loop's outermost tile first: a copy under it serves every row tile
            outer_tiles.insert(0, outer_tiles.pop())
        order, level_ends = order_levels(levels, self.structure)
        sch.reorder(*order)
        if lanes_loop is not None:  # the innermost tile becomes a whole number of vectors
            sch.fuse(order[-2], lanes_loop)
        for read_index, dim in packed:  # under the outermost tile of the innermost spatial loop
            copy = sch.cache_read(block, read_index, "global")
            sch.compute_at(copy, outer_tiles[0])
            sch.annotate(copy, PANEL_DIM_KEY, dim)
        for read_index in panels:
            copy = sch.cache_read(block, read_index, "global")
            sch.compute_at(copy, outer_tiles[0])
            sch.annotate(copy, PANEL_KEY, sch.sample_uniform([0, 1]))
        write_back_per_tile(sch, block, [level_ends[level - 1] for level in self.write_back_levels])

    def _packable_inputs(
        self, sch: Schedule, block: BlockRV, spatial: list[LoopRV], reused_over: list[dict]
    ) -> list[tuple[int, int]]:
        """(read index, dimension) of each input to pack: read with a stride along the innermost of ``spatial``.

        Each must be indexed by that loop in one dimension, and its copy must
        repay itself (``_repays_copy``). Empty if any strided access is not
        such a read: the loop then keeps gathering (and its vector width is
        left as sampled).
        """
        if not self.pack_strided_inputs:
            return []
        raw, block_rv = sch.tvm, sch.resolve(block)
        sblock = raw.get(block_rv)
        packed = []
        for (kind, index), dims in indexing_dims(raw, block_rv, sch.resolve(spatial[-1])).items():
            region = (sblock.reads if kind == "read" else sblock.writes)[index]
            if dims == [len(region.region) - 1]:
                continue  # contiguous along the loop
            if not (kind == "read" and len(dims) == 1 and _repays_copy(raw, sblock, index, reused_over)):
                return []
            packed.append((index, dims[0]))
        return packed

    def _panel_inputs(
        self, sch: Schedule, block: BlockRV, spatial: list[LoopRV], reductions: list[LoopRV], reused_over: list[dict]
    ) -> list[int]:
        """Read index of each input to offer panel packing: contiguous along the innermost spatial loop, strided along a reduction.

        Like a strided input's, the copy must repay itself (``_repays_copy``),
        and each of the input's dimensions must be indexed by a single loop
        (matmul's ``B[k, j]``, not a convolution's ``X[h + r, w + s]``, whose
        panels would overlap).
        """
        if not self.pack_panels:
            return []
        raw, block_rv = sch.tvm, sch.resolve(block)
        walked_by = [indexing_dims(raw, block_rv, sch.resolve(loop)) for loop in reductions]
        sblock = raw.get(block_rv)
        panels = []
        for (kind, index), dims in indexing_dims(raw, block_rv, sch.resolve(spatial[-1])).items():
            if kind != "read" or dims != [len(sblock.reads[index].region) - 1]:
                continue
            if (
                all(isinstance(r.min, tirx.Var) for r in sblock.reads[index].region)
                and any(("read", index) in walked for walked in walked_by)
                and _repays_copy(raw, sblock, index, reused_over)
            ):
                panels.append(index)
        return panels

    def _vector_loop(
        self, sch: Schedule, block: BlockRV, loop: LoopRV, lanes: int, packed: list[tuple[int, int]]
    ) -> tuple[LoopRV | None, int]:
        """``loop``, the spatial loop that ends up innermost (and vectorized), if whole vectors can tile it, and their lanes.

        Whole target vectors of ``lanes``, else half vectors (an extent such
        as 1000 or 24 that 16 lanes do not divide). Only when every buffer it
        indexes is contiguous along it, or will be once packed: vectors of a
        strided access (dense's ``W[j, k]`` along ``j``) are gathers, slower
        than the scalar code a narrower random tile leaves.
        """
        extent = sch.loop_extent(loop)
        if not self.align_innermost_to_vector or extent is None:
            return None, lanes
        width = next((w for w in (lanes, lanes // 2) if w > 1 and extent % w == 0 and extent > w), None)
        if width is None or not (packed or contiguous_along(sch.tvm, sch.resolve(block), sch.resolve(loop))):
            return None, lanes
        return loop, width


@dataclass(frozen=True)
class RewriteWriteBackLocation:
    """Compute each annotated block's only consumer (its write-back) inside the block's tile, at the sampled depth.

    The moved block joins the tiled block's loop nest: its own parallel and
    unroll requests are dropped (the nest's outer loops are parallelized and
    unrolled once, for the tiled block) and it takes the tiled block's vector
    width, so that its innermost loop is still vectorized. Must run before
    ``rewrite-parallel-vectorize-unroll``.
    """

    name: str = "rewrite-write-back-location"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        for name, block, depth in _take_annotation(sch, WRITE_BACK_DEPTH_KEY):
            consumers = sch.get_consumers(block)
            if len(consumers) != 1 or not at_root(sch, consumers[0]):
                continue  # another module already placed it
            loops = sch.get_loops(block)
            if depth > len(loops):
                return f"block {name} has {len(loops)} loops, its write-back was sampled under {depth}"
            try:
                sch.reverse_compute_at(consumers[0], loops[depth - 1], preserve_unit_loops=True)
            except RuntimeError as exc:  # TVM schedule errors
                return f"block {name}: {last_line(exc)}"
            self._join_nest(sch, block, consumers[0])
        return None

    @staticmethod
    def _join_nest(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, moved: s_tir.schedule.SBlockRV) -> None:
        own = sch.get(moved).annotations
        for key in (PARALLEL_KEY, UNROLL_KEY, VECTORIZE_KEY):
            if key in own:
                sch.unannotate(moved, key)
        lanes = sch.get(block).annotations.get(VECTORIZE_KEY)
        if lanes is not None:
            sch.annotate(moved, VECTORIZE_KEY, lanes)


@dataclass(frozen=True)
class RewritePackedLayout:
    """Give each packing copy's buffer the layout that makes it contiguous along the loop it was packed for.

    The copy writes the input's slice as it was laid out; cutting the
    annotated dimension into panels of the width ``w`` of the kernel's
    innermost (vectorized) loop, ``[x // w, other dimensions..., x % w]``,
    turns its consumer's strided reads into contiguous ones that follow each
    other in memory (``W[j, k]`` becomes ``W_packed[j // w, k, j % w]``, and
    so does ``B[k, j]`` when its panel copy was sampled to pack; one sampled
    not to is inlined back). A copy recorded with ``PACKED_DIM_KEY`` gets that
    dimension moved last instead (``W_packed[k, j]``). The compiler then
    allocates only the slice each tile reads.
    """

    name: str = "rewrite-packed-layout"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        for name, block, dim in _take_annotation(sch, PACKED_DIM_KEY):
            ndim = len(sch.get(block).writes[0].source.shape)
            order = [d for d in range(ndim) if d != dim] + [dim]
            index_map = tirx.IndexMap.from_func(lambda *indices: [indices[d] for d in order], ndim=ndim)  # noqa: B023 - called here
            try:
                sch.transform_layout(block, ("write", 0), index_map)
            except RuntimeError as exc:  # TVM schedule errors
                return f"block {name}: {last_line(exc)}"
        for key in (PANEL_DIM_KEY, PANEL_KEY):
            for name, block, value in _take_annotation(sch, key):
                try:
                    if key == PANEL_KEY and not value:
                        sch.compute_inline(block)
                    else:  # a strided copy names the dimension to cut; a panel copy's input is contiguous along its last
                        self._lay_out_in_panels(sch, block, value if key == PANEL_DIM_KEY else -1)
                except RuntimeError as exc:  # TVM schedule errors
                    return f"block {name}: {last_line(exc)}"
        return None

    @staticmethod
    def _lay_out_in_panels(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, dim: int) -> None:
        """Lay the copy's buffer out ``[x // w, other dimensions..., x % w]``, ``x`` its dimension ``dim``."""
        (kernel,) = sch.get_consumers(block)
        width = int(sch.get(sch.get_loops(kernel)[-1]).extent)
        shape = sch.get(block).writes[0].source.shape
        dim %= len(shape)
        index_map = tirx.IndexMap.from_func(  # in the buffer's index type: a cast would hide the division
            lambda *indices: [indices[dim] // width, *(x for d, x in enumerate(indices) if d != dim), indices[dim] % width],
            ndim=len(shape),
            index_dtype=str(shape[0].ty),
        )
        sch.transform_layout(block, ("write", 0), index_map)
        if dim != len(shape) - 1:
            _copy_in_square_tiles(sch, block, dim, len(shape), width)


def _copy_in_square_tiles(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, dim: int, ndim: int, width: int) -> None:
    """Copy in ``width x width`` tiles: the copy reads along its last dimension and writes along ``dim``.

    Row by row, each element of a row goes to another cache line (a panel is
    ``width`` floats wide), and a whole panel's lines (48 KB for dense's 768 x
    16) are touched before the next row comes back to them; in tiles, both
    sides stay within ``width`` lines. The best program of a dense tune ran
    faster with its copy in tiles than row by row, or than with ``w``
    innermost instead of ``k`` (contiguous writes, strided reads)
    (bench/results/NOTES.md).
    """
    loops = sch.get_loops(block)[-ndim:]  # the copy's own loops, one per dimension of the input
    rows, columns = loops[dim], loops[-1]
    if any(int(sch.get(loop).extent) % width for loop in (rows, columns)):
        return
    row_tiles, row = sch.split(rows, [None, width])
    column_tiles, column = sch.split(columns, [None, width])
    sch.reorder(row_tiles, column_tiles, row, column)
