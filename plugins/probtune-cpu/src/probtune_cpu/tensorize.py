"""Blocks a module marked for a CPU tensor intrinsic (a dot-product instruction), replaced by it after the search.

A module that maps a loop nest onto an instruction blockizes the nest the
instruction computes and annotates that block with the intrinsic's name
(``TENSORIZE_KEY``, TVM MetaSchedule's annotation); the other CPU modules
and rewrites leave such a block's inside alone. ``rewrite-cpu-tensorize``
then replaces the block by the intrinsic, once ``rewrite-reduction-block``
has split its initialisation out (``<name>_init``, the rest ``<name>_update``),
and vectorizes that initialisation.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import s_tir

from probtune.plugin import SpaceContext, last_line, sblock_names

__all__ = ["TENSORIZE_KEY", "RewriteCPUTensorize", "is_tensorized"]

TENSORIZE_KEY = "meta_schedule.auto_tensorize"
"""Block annotation naming the tensor intrinsic (registered in TVM's table) that replaces the block."""


def is_tensorized(sblock: s_tir.SBlock) -> bool:
    """Whether a module marked the block for a tensor intrinsic."""
    return TENSORIZE_KEY in sblock.annotations


@dataclass(frozen=True)
class RewriteCPUTensorize:
    """Replace each block marked with ``TENSORIZE_KEY`` by its intrinsic; vectorize its initialisation's inner loop.

    Must run after ``rewrite-reduction-block``, which gives the block's
    initialisation a block of its own (``<name>_init``, carrying the annotation too).
    """

    name: str = "rewrite-cpu-tensorize"

    def check(self, sch: s_tir.Schedule, ctx: SpaceContext) -> str | None:
        for name in sblock_names(sch):
            block = sch.get_sblock(name)
            intrinsic = sch.get(block).annotations.get(TENSORIZE_KEY)
            if intrinsic is None:
                continue
            try:
                sch.unannotate(block, TENSORIZE_KEY)
                if name.endswith("_init"):  # split out of a marked block (whose update is ``<name>_update``)
                    inner = sch.get_child_blocks(block)  # the tile's own initialisation, in loops of its own
                    if inner:
                        sch.vectorize(sch.get_loops(inner[0])[-1])
                else:
                    sch.tensorize(block, str(intrinsic))
            except (RuntimeError, ValueError) as exc:  # TVM schedule errors
                return f"block {name} does not match its tensor intrinsic {intrinsic}: {last_line(exc)}"
        return None
