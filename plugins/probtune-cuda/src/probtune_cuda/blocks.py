"""Facts about a program's blocks that the GPU modules share: whether one is still unbound, what it depends on, how
often its body runs."""

from __future__ import annotations

import math

from tvm import s_tir, tirx

from probtune.plugin import at_root, thread_tag

__all__ = ["iterations", "unbound", "with_dependencies"]


def unbound(raw: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """Whether the block hangs under the root with none of its loops bound to a GPU axis (no module computed it inside
    another block's kernel)."""
    return at_root(raw, block) and not any(thread_tag(raw.get(loop)) for loop in raw.get_loops(block))


def with_dependencies(raw: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> list[s_tir.schedule.SBlockRV] | None:
    """``block`` and every block it depends on, consumers first (program order reversed); None if one of them is
    bound already."""
    order = {raw.get(b).name_hint: n for n, b in enumerate(raw.get_child_blocks(raw.get_sblock("root")))}
    found: dict[str, s_tir.schedule.SBlockRV] = {}
    stack = [block]
    while stack:
        current = stack.pop()
        name = raw.get(current).name_hint
        if name in found:
            continue
        if not unbound(raw, current):
            return None
        found[name] = current
        stack.extend(raw.get_producers(current))
    return sorted(found.values(), key=lambda b: -order[raw.get(b).name_hint])


def iterations(raw: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> int | None:
    """How many times the block's body runs: the product of its loops' extents (None if one is symbolic)."""
    extents = [raw.get(loop).extent for loop in raw.get_loops(block)]
    if not all(isinstance(extent, tirx.IntImm) for extent in extents):
        return None
    return math.prod(int(extent) for extent in extents)
