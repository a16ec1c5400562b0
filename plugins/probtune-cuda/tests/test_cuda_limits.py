"""A CUDA target's per-block limits and compute capability: read from the target, with one fallback for a limit it omits."""

from __future__ import annotations

import pytest

from probtune.targets import resolve_target
from probtune_cuda.limits import block_limit, compute_capability


def test_the_targets_limits_are_read_and_an_omitted_one_falls_back() -> None:
    sm90 = resolve_target("cuda-sm90").tvm_target
    assert block_limit(sm90, "max_shared_memory_per_block") == 232448
    assert block_limit(sm90, "max_threads_per_block") == 1024
    bare = {"kind": "cuda", "arch": "sm_75"}
    assert block_limit(bare, "max_shared_memory_per_block") == 48 * 1024
    assert block_limit(bare, "max_threads_per_block") == 1024
    with pytest.raises(KeyError):
        block_limit(bare, "registers_per_block")  # not a limit with a fallback


def test_the_compute_capability_is_read_from_the_architecture() -> None:
    assert compute_capability(resolve_target("cuda-sm90").tvm_target) == 90
    assert compute_capability(resolve_target("cuda-sm80").tvm_target) == 80
    assert compute_capability({"kind": "cuda", "arch": "sm_90a"}) == 90
    assert compute_capability({"kind": "cuda"}) == compute_capability({"kind": "cuda", "arch": "compute_90"}) == 0
