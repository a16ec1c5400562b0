"""A target's graph rewrites (``TargetSpec.graph_rewrites``), applied to a model before it is fused into tasks.

How many operators each rewrite changed is kept on the fused module, so that
a tuning result can say what became of the model.
"""

from __future__ import annotations

from collections.abc import Sequence

import tvm

from probtune.errors import ModelImportError
from probtune.interfaces import GraphRewrite, TargetSpec
from probtune.space.space_generator import resolve_graph_rewrites

__all__ = ["REWRITES_ATTR", "apply_graph_rewrites", "rewrite_counts"]

REWRITES_ATTR = "probtune_graph_rewrites"


def apply_graph_rewrites(
    mod: tvm.IRModule, target: TargetSpec, rewrites: Sequence[str | GraphRewrite] | None = None
) -> tuple[tvm.IRModule, dict[str, int]]:
    """``mod`` through the target's graph rewrites (or ``rewrites``), in order; how many operators each changed.

    A rewrite that raises is named in a :class:`ModelImportError`.
    """
    counts: dict[str, int] = {}
    for rewrite in resolve_graph_rewrites(target, rewrites):
        try:
            mod, counts[rewrite.name] = rewrite.rewrite(mod, target)
        except Exception as exc:
            raise ModelImportError(
                f"graph rewrite {rewrite.name!r} failed on the model: {type(exc).__name__}: {exc}. Leave it out to go "
                "on without it (tune-model --graph-rewrites with the others' names; Python: graph_rewrites=[...])"
            ) from exc
    return mod, counts


def rewrite_counts(fused: tvm.IRModule) -> dict[str, int]:
    """What :func:`~probtune.model.tasks.fuse` recorded: operators changed, by graph rewrite."""
    recorded = fused.attrs.get(REWRITES_ATTR) if fused.attrs else None
    return {str(name): int(count) for name, count in recorded.items()} if recorded else {}
