"""The vector unit that CPU modules size their tiles for, as a CPU target's ``attrs`` describe it."""

from __future__ import annotations

from typing import Any

from probtune.plugin import TargetSpec

__all__ = ["vector_attrs", "vector_register_bytes", "vector_width"]

_WIDTH = "vector_width"  # fp32 lanes per vector register
_REGISTERS = "vector_registers"  # x86 AVX2: 16; AVX-512 and AArch64 NEON: 32


def vector_attrs(width: int, registers: int) -> dict[str, Any]:
    """A CPU target's ``attrs``: ``width`` fp32 lanes per vector register, ``registers`` vector registers."""
    return {_WIDTH: width, _REGISTERS: registers}


def vector_width(target: TargetSpec) -> int:
    """fp32 lanes per vector register."""
    return _read(target, _WIDTH)


def vector_register_bytes(target: TargetSpec) -> int:
    """Bytes of the vector register file: what a kernel's accumulator tile shares with its inputs."""
    return _read(target, _REGISTERS) * vector_width(target) * 4


def _read(target: TargetSpec, key: str) -> int:
    try:
        return int(target.attrs[key])
    except KeyError:
        raise ValueError(
            f"target {target.name!r} has no {key!r} in its attrs, which CPU modules need "
            "(a CPU target sets them with probtune_cpu.vector_unit.vector_attrs)"
        ) from None
