"""Software pipelining of a tensor-core reduction: the next tiles are fetched while the warps multiply the current ones.

The tensor-core tiling samples, per block, how many shared-memory buffers
each operand gets (``PIPELINE_KEY`` on its outer reduction loop, a
categorical decision that the mutators move):

- 1: no pipelining;
- 2: each thread loads the next tile into registers while the warps
  multiply the current one, then stores it into the other buffer (double
  buffering; any tensor-core GPU);
- 3: the copies are asynchronous (``cp.async``, Ampere and later) and run
  two tiles ahead.

Pipelined, the fragments of the next reduction step are also loaded while
the current ones are multiplied. ``rewrite-software-pipeline`` writes the
stages and order that TVM's ``InjectSoftwarePipeline`` reads, as
MetaSchedule's tensor-core rule does with ``use_software_pipeline``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx

from probtune.plugin import SpaceContext, child_stmts, iter_stmts, nested_sblocks
from probtune_cuda.limits import compute_capability

__all__ = [
    "ASYNC_COPY",
    "ASYNC_COPY_MIN_ARCH",
    "NO_PIPELINE",
    "PIPELINE_KEY",
    "REGISTER_STAGED",
    "RewriteSoftwarePipeline",
    "loop_buffers",
    "pipeline_choices",
    "uses_async_copies",
]

PIPELINE_KEY = "probtune.software_pipeline"
"""Loop annotation: the shared-memory buffers per operand of the tensor-core reduction under it (1, 2 or 3)."""

NO_PIPELINE, REGISTER_STAGED, ASYNC_COPY = 1, 2, 3

ASYNC_COPY_MIN_ARCH = 80
"""``cp.async`` needs Ampere (sm_80) or later."""

_LOCAL_STAGE_KEY = "tirx.manifest_shared_memory_local_stage"  # TVM: copy through registers (ManifestSharedMemoryLocalStage)
_DOUBLE_BUFFER_KEY = "double_buffer_scope"
_STAGE_KEY = "software_pipeline_stage"
_ORDER_KEY = "software_pipeline_order"
_ASYNC_KEY = "software_pipeline_async_stages"

# Stage and order of each statement of the outer reduction loop's body, by buffer count and whether the inner loop
# is pipelined too. Register-staged, each operand's copy is two statements (to registers, then to shared memory);
# asynchronous, one. Then the inner loop: its pipeline's prologue, body and epilogue, or the loop itself.
_OUTER = {
    (REGISTER_STAGED, True): ((0, 0, 0, 0, 0, 1, 1), (0, 3, 1, 4, 5, 2, 6)),
    (REGISTER_STAGED, False): ((0, 0, 0, 0, 1), (0, 3, 1, 4, 2)),
    (ASYNC_COPY, True): ((0, 0, 1, 2, 2), (0, 1, 3, 2, 4)),
    (ASYNC_COPY, False): ((0, 0, 2), (0, 1, 2)),
}
_INNER = ((0, 0, 1), (0, 1, 2))  # the fragment loads of A and B one step ahead of the multiply


def pipeline_choices(arch: int) -> tuple[int, ...]:
    """The buffer counts the tiling samples from on a GPU of compute capability ``arch`` (90 for sm_90)."""
    return (NO_PIPELINE, REGISTER_STAGED, ASYNC_COPY) if arch >= ASYNC_COPY_MIN_ARCH else (NO_PIPELINE, REGISTER_STAGED)


def uses_async_copies(mod: tvm.IRModule) -> bool:
    """Whether ``mod``'s ``main`` has a loop pipelined with asynchronous copies (TVM then needs ``tirx.use_async_copy``)."""
    return any(isinstance(stmt, tirx.For) and _ASYNC_KEY in stmt.annotations for stmt in iter_stmts(mod["main"].body))


@dataclass(frozen=True)
class _Pipeline:
    """A reduction loop to pipeline: its two operand copies, and its inner loop (None where that has one iteration)."""

    copies: tuple[s_tir.schedule.SBlockRV, s_tir.schedule.SBlockRV]
    inner: s_tir.schedule.LoopRV | None


@dataclass(frozen=True)
class RewriteSoftwarePipeline:
    """Turn each sampled buffer count into TVM's software-pipeline annotations of the reduction loops.

    An outer loop of a single iteration has nothing to overlap: the program
    is then built unpipelined; an inner loop of one is not pipelined itself.
    """

    name: str = "rewrite-software-pipeline"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        for loop, buffers in list(_sampled_loops(sch)):
            sch.unannotate(loop, PIPELINE_KEY)
            if buffers == NO_PIPELINE:
                continue
            if buffers == ASYNC_COPY and compute_capability(ctx.target.tvm_target) < ASYNC_COPY_MIN_ARCH:
                return f"asynchronous copies need sm_{ASYNC_COPY_MIN_ARCH} or later"
            if buffers not in (REGISTER_STAGED, ASYNC_COPY):
                return f"{buffers} shared-memory buffers per operand: only 1, 2 or 3 are known"
            try:
                pipeline = _pipeline_of(sch, loop)
            except ValueError as exc:
                return str(exc)
            if pipeline is not None:
                _annotate(sch, loop, pipeline, buffers)
        return None


def _sampled_loops(sch: s_tir.Schedule) -> Iterator[tuple[s_tir.schedule.LoopRV, int]]:
    """Each loop that carries ``PIPELINE_KEY``, once, with its value."""
    seen: list[tirx.For] = []
    for block in nested_sblocks(sch):
        for loop in sch.get_loops(block):
            stmt = sch.get(loop)
            if PIPELINE_KEY in stmt.annotations and not any(stmt.same_as(other) for other in seen):
                seen.append(stmt)
                yield loop, int(stmt.annotations[PIPELINE_KEY])


def _pipeline_of(sch: s_tir.Schedule, loop: s_tir.schedule.LoopRV) -> _Pipeline | None:
    """The copies and inner loop under ``loop``; None if it has one iteration; ValueError if it is not that shape."""
    outer = sch.get(loop)
    body = child_stmts(outer)[0]
    parts = child_stmts(body) if isinstance(body, tirx.SeqStmt) else [body]
    inner = parts[-1] if len(parts) == 3 else None
    if not isinstance(inner, tirx.For) or not isinstance(inner.body, tirx.SeqStmt) or len(child_stmts(inner.body)) != 3:
        raise ValueError(f"the loop marked {PIPELINE_KEY} does not hold two operand copies and a loop of fragment loads")
    copies = (_only_block(sch, parts[0]), _only_block(sch, parts[1]))
    if _extent(outer) < 2:
        return None
    if _extent(inner) < 2:
        return _Pipeline(copies, None)
    fragment_load = _only_block(sch, child_stmts(inner.body)[0])
    return _Pipeline(copies, next(rv for rv in sch.get_loops(fragment_load) if sch.get(rv).same_as(inner)))


def _extent(loop: tirx.For) -> int:
    """A loop's iterations (a symbolic extent counts as many)."""
    return int(loop.extent) if isinstance(loop.extent, tirx.IntImm) else 2**31


def _only_block(sch: s_tir.Schedule, nest: tirx.Stmt) -> s_tir.schedule.SBlockRV:
    """The outermost block of a loop nest (a copy, a fragment load)."""
    realize = next((stmt for stmt in iter_stmts(nest) if isinstance(stmt, s_tir.SBlockRealize)), None)
    if realize is None:
        raise ValueError(f"the loop marked {PIPELINE_KEY} holds a statement without a block")
    return sch.get_sblock(str(realize.block.name_hint))


def _annotate(sch: s_tir.Schedule, loop: s_tir.schedule.LoopRV, pipeline: _Pipeline, buffers: int) -> None:
    stages, order = _OUTER[(buffers, pipeline.inner is not None)]
    if buffers == REGISTER_STAGED:
        for copy in pipeline.copies:
            sch.annotate(copy, _LOCAL_STAGE_KEY, tirx.IntImm("int32", 1))
            sch.annotate(copy, _DOUBLE_BUFFER_KEY, tirx.IntImm("int32", 0))
    else:
        sch.annotate(loop, _ASYNC_KEY, [0])
    sch.annotate(loop, _STAGE_KEY, list(stages))
    sch.annotate(loop, _ORDER_KEY, list(order))
    if pipeline.inner is not None:
        sch.annotate(pipeline.inner, _STAGE_KEY, list(_INNER[0]))
        sch.annotate(pipeline.inner, _ORDER_KEY, list(_INNER[1]))


def loop_buffers(stmt: tirx.For) -> int:
    """The shared-memory buffers per operand a sampled loop asks for (1 where it carries no ``PIPELINE_KEY``)."""
    return int(stmt.annotations.get(PIPELINE_KEY, NO_PIPELINE))

