"""AVX512-BF16's own part: the precision the host offers with it (the tiling's tests are test_x86_dot_product.py's)."""

from __future__ import annotations

from probtune.targets import resolve_target
from probtune_cpu.host_cpu import cpu_features
from probtune_x86 import BF16_FEATURE


def test_the_host_target_offers_the_bf16_precision_where_the_cpu_has_it():
    assert ("bf16" in resolve_target("host").precisions) == (BF16_FEATURE in cpu_features())
    assert "bf16" not in resolve_target("x86-avx2").precisions
