"""What a graph rewrite asks of a model before it changes anything: whether it makes a call of interest."""

from __future__ import annotations

from collections.abc import Callable

import tvm
import tvm_ffi
from tvm import relax

__all__ = ["has_call"]


def has_call(mod: tvm.IRModule, wanted: Callable[[relax.Call], bool]) -> bool:
    """Whether a Relax function of ``mod`` makes a call that ``wanted`` accepts."""
    found: list[relax.Call] = []
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            tvm_ffi.structural_walk(func, (relax.Call, lambda call: found.append(call) if wanted(call) else None))
    return bool(found)
