"""AArch64 targets for probtune, cross-compiled from any host through TVM's LLVM.

``arm-neon`` describes a Cortex-A72 class board (Raspberry Pi 4, AWS
Graviton 1): 4 cores, 128-bit NEON registers, so 4 fp32 lanes. ``mcpu`` only
tunes LLVM's instruction scheduling; the code runs on any ARMv8-A core with
NEON. That code cannot run on the tuning machine, so the target is measured
through the ``rpc`` runner, on AArch64 servers of a TVM RPC tracker
(``--rpc-tracker``, ``--rpc-key``); its shared libraries are linked here by
``AARCH64_LINKER``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from probtune.plugin import TargetSpec, hookimpl
from probtune_cpu.codegen import LLVMCompiler
from probtune_cpu.defaults import (
    DEFAULT_GRAPH_REWRITES,
    DEFAULT_LAYOUTS,
    DEFAULT_MODULES,
    DEFAULT_MUTATORS,
    DEFAULT_VALIDATORS,
)
from probtune_cpu.host_cpu import CPURequirement, cpu_model
from probtune_cpu.vector_unit import vector_attrs

__all__ = ["AARCH64_LINKER", "make_targets"]

AARCH64_LINKER = "aarch64-linux-gnu-gcc"
"""Debian's cross compiler (package gcc-aarch64-linux-gnu), which links the candidates' shared libraries."""


def make_targets() -> list[TargetSpec]:
    return [
        TargetSpec(
            name="arm-neon",
            description="AArch64 with NEON (Cortex-A72 class, 4 cores), 4 fp32 lanes; measured over RPC",
            tvm_target={
                "kind": "llvm",
                "mtriple": "aarch64-linux-gnu",
                "mcpu": "cortex-a72",
                "mattr": ["+neon"],
                "num-cores": 4,
            },
            modules=DEFAULT_MODULES,
            validators=DEFAULT_VALIDATORS,
            mutators=DEFAULT_MUTATORS,
            layouts=DEFAULT_LAYOUTS,
            graph_rewrites=DEFAULT_GRAPH_REWRITES,
            concat_in_place=True,
            attrs=vector_attrs(width=4, registers=32),
            compiler=LLVMCompiler(linker=AARCH64_LINKER),  # 32 registers of 16 bytes: under TVM's own stack cut-off
            runs_here=CPURequirement(("aarch64", "arm64"), ("asimd",)),
            local_device=cpu_model,
            runner="rpc",
        ),
    ]


@hookimpl
def probtune_register_targets(register: Callable[[Any], None]) -> None:
    for target in make_targets():
        register(target)
