"""Whether a target's CPU has an instruction-set feature, asked of LLVM once per target.

Rewrites that emit an LLVM intrinsic need this: where the CPU lacks the
instruction, the back end turns the intrinsic into a libm call per element
(``llvm.ldexp`` without AVX-512's ``vscalefps``), slower than what the
rewrite replaces.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import tvm

__all__ = ["llvm_target_has"]


def llvm_target_has(tvm_target: dict[str, Any], feature: str) -> bool:
    """Whether ``tvm_target`` (TVM's dict form) is an LLVM CPU target with ``feature`` (LLVM's name, e.g. "avx512f")."""
    return _has(json.dumps(tvm_target, sort_keys=True), feature)


@functools.cache
def _has(tvm_target_json: str, feature: str) -> bool:
    # building the Target costs about 135 us: too much to repeat for every candidate
    target = tvm.target.Target(json.loads(tvm_target_json))
    return target.kind.name == "llvm" and bool(tvm.target.codegen.target_has_features([feature], target))
