"""A CUDA target's per-block limits and compute capability, as its TVM target states them.

Every target of this plugin states them; a target made elsewhere that omits
one gets the limits every CUDA GPU since Kepler has without opting in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_VECTOR_BYTES", "block_limit", "compute_capability"]

MAX_VECTOR_BYTES = 16
"""The widest load or store of one GPU thread (a float4), which must be aligned to its own width."""

_FALLBACK = {"max_threads_per_block": 1024, "max_shared_memory_per_block": 48 * 1024}


def block_limit(tvm_target: Mapping[str, Any], name: str) -> int:
    """The target's ``max_threads_per_block`` or ``max_shared_memory_per_block``."""
    return int(tvm_target.get(name, _FALLBACK[name]))


def compute_capability(tvm_target: Mapping[str, Any]) -> int:
    """The target's architecture as a number (90 for ``sm_90`` or ``sm_90a``); 0 where it names none."""
    found = re.fullmatch(r"sm_(\d+)a?", str(tvm_target.get("arch", "")))
    return int(found.group(1)) if found else 0
