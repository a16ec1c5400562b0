"""The module and validator lists every CPU target uses by default.

Target plugins (probtune-x86, probtune-arm) import these, so that a module
added to the CPU space reaches every CPU target at once.
"""

from __future__ import annotations

__all__ = ["DEFAULT_MODULES", "DEFAULT_VALIDATORS"]

# auto-inline first, so tiling sees single elementwise consumers; add-rfactor before tiling splits the
# loop nest; random-compute-location last, since its inline decision removes the block
DEFAULT_MODULES = (
    "auto-inline",
    "add-rfactor",
    "multi-level-tiling",
    "parallel-vectorize",
    "auto-unroll",
    "random-compute-location",
)
DEFAULT_VALIDATORS = (
    "rewrite-vector-math",
    "rewrite-exp-polynomial",
    "rewrite-invariant-division",
    "rewrite-write-back-location",  # moves blocks into tiles: before the parallel/vectorize rewrite
    "rewrite-packed-layout",
    "rewrite-spatial-innermost",  # reorders loops: before the parallel/vectorize rewrite
    "rewrite-parallel-vectorize-unroll",
    "rewrite-reduction-block",
    "rewrite-output-reuse",  # last rewrite: a block that finishes its output in place is no longer a complete block
    "verify-static-loops",
    "verify-vectorize",
    "verify-parallel",
    "verify-unroll-size",
)
