"""The host target: the CPU features its flags list are given to LLVM even where LLVM's model of the CPU lacks them."""

from __future__ import annotations

from probtune_x86 import full_width_mattr, host_mattr

SAPPHIRE_RAPIDS_FLAGS = frozenset({"avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8",
                                   "amx_bf16"})


def test_a_cpu_reported_as_an_older_model_gets_its_dot_product_and_tile_features():
    """A virtual machine's Sapphire Rapids that LLVM reads as Rocket Lake (which has VNNI but not BF16 or AMX)."""
    assert host_mattr("rocketlake", SAPPHIRE_RAPIDS_FLAGS) == [
        "+avx512bf16", "+avx512fp16", "+amx-tile", "+amx-int8", "+amx-bf16"]


def test_a_cpu_llvm_knows_whole_gets_nothing_added():
    assert host_mattr("sapphirerapids", SAPPHIRE_RAPIDS_FLAGS) == []
    assert host_mattr("znver4", frozenset({"avx512f", "avx512_vnni", "avx512_bf16"})) == []


def test_flags_the_cpu_lacks_are_not_added():
    assert host_mattr("skylake-avx512", frozenset({"avx512f"})) == []


def test_llvm_is_told_to_use_the_whole_avx512_vectors_where_its_model_prefers_halves():
    assert full_width_mattr("rocketlake", SAPPHIRE_RAPIDS_FLAGS) == ["-prefer-256-bit"]
    assert full_width_mattr("sapphirerapids", SAPPHIRE_RAPIDS_FLAGS) == ["-prefer-256-bit"]
    assert full_width_mattr("znver4", frozenset({"avx512f"})) == []  # LLVM's Zen 4 uses 512-bit vectors already
    assert full_width_mattr("haswell", frozenset({"avx2"})) == []  # no AVX-512: 256 bits is the width
