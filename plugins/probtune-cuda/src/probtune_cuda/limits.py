"""A CUDA target's per-block limits, as its TVM target states them.

Every target of this plugin states them; a target made elsewhere that omits
one gets the limits every CUDA GPU since Kepler has without opting in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["block_limit"]

_FALLBACK = {"max_threads_per_block": 1024, "max_shared_memory_per_block": 48 * 1024}


def block_limit(tvm_target: Mapping[str, Any], name: str) -> int:
    """The target's ``max_threads_per_block`` or ``max_shared_memory_per_block``."""
    return int(tvm_target.get(name, _FALLBACK[name]))
