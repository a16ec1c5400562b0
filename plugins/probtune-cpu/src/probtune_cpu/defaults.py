"""The module, validator and mutator lists, the model layouts and graph rewrites every CPU target uses by default.

Target plugins (probtune-x86, probtune-arm) import these, so that a module
added to the CPU space reaches every CPU target at once.
"""

from __future__ import annotations

__all__ = ["DEFAULT_GRAPH_REWRITES", "DEFAULT_LAYOUTS", "DEFAULT_MODULES", "DEFAULT_MUTATORS", "DEFAULT_VALIDATORS"]

# auto-inline first, so tiling sees single elementwise consumers; add-rfactor before tiling splits the
# loop nest; transpose tiling before parallel-vectorize, which vectorizes its column tile;
# random-compute-location last, since its inline decision removes the block
DEFAULT_MODULES = (
    "auto-inline",
    "add-rfactor",
    "multi-level-tiling",
    "transpose-tiling",
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
    "verify-no-recompute",
)

DEFAULT_MUTATORS = {"tile_size": 0.9, "categorical": 0.05, "compute_location": 0.05}
"""Mutators by probability, after TVM MetaSchedule's CPU defaults (tile sizes 0.9; the rest share 0.1)."""

# Channels last: a convolution's output channels are the innermost, vectorized dimension, a whole number
# of vectors at any feature-map size (NCHW vectorizes the width, 7 or 14 in late CNN stages), and HWIO
# weights are contiguous along them. Pooling and elementwise operators follow their input's layout. A 1-D
# convolution (a speech model's front end) is then also already the (batch, time, channels) sequence that the
# transformer after it reads, and a 3-D one (video) vectorizes its channels as a 2-D one does.
DEFAULT_LAYOUTS = {"relax.nn.conv2d": ("NHWC", "HWIO"), "relax.nn.conv1d": ("NWC", "WIO"),
                   "relax.nn.conv3d": ("NDHWC", "DHWIO")}

DEFAULT_GRAPH_REWRITES = ("padded-taps", "pad-channels", "winograd-conv2d")
"""Dilated convolutions split where most of their taps read padding (:mod:`probtune_cpu.padded_taps`), convolutions'
channels padded to whole vectors (:mod:`probtune_cpu.pad_channels`), then 3x3 convolutions where Winograd's form
needs far fewer multiplies (:mod:`probtune_cpu.winograd`), padded ones included."""
