"""Schedule instructions this plugin adds to probtune's schedule language (``probtune_register_instructions``)."""

from __future__ import annotations

from typing import Any

from tvm import s_tir

from probtune.plugin import InstructionKind

__all__ = ["PAD_EINSUM"]


def _pad_einsum(sch: s_tir.Schedule, inputs: list[Any], attrs: dict[str, Any]) -> None:
    sch.pad_einsum(inputs[0], [int(factor) for factor in attrs["padding"]])


PAD_EINSUM = InstructionKind("pad_einsum", _pad_einsum)
"""TVM's ``pad_einsum``: pad each iterator of an einsum block up to a multiple of its factor.

The block then reads zero-padded copies of its inputs (producer blocks
``<buffer>_pad``) and writes a padded output that a consumer block trims:
a matmul of any shape becomes whole 16x16x16 tensor-core tiles.
"""
