"""x86 and generic LLVM targets for probtune.

``host`` picks the widest vector ISA this CPU supports, so that tuning on any
x86 machine works out of the box; the named ISA targets make a tuning record
portable to machines of that class.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from probtune import TargetSpec, hookimpl
from probtune.interfaces import TVM_STACK_BYTES
from probtune.targets import cpu_features
from probtune_cpu.defaults import DEFAULT_LAYOUTS, DEFAULT_MODULES, DEFAULT_VALIDATORS

__all__ = ["make_targets"]


AVX512_REGISTER_FILE_BYTES = 32 * 64
"""32 zmm registers of 64 bytes: a buffer smaller than this may stay on the stack, and so in registers
(AVX2's 16 ymm registers hold 512 bytes, under TVM's own 1 KB cut-off)."""


def _host_target(cores: int) -> TargetSpec:
    from tvm.target import codegen

    features = cpu_features()
    width = 16 if "avx512f" in features else 8 if "avx2" in features else 4
    return TargetSpec(
        name="host",
        description=f"this machine's CPU ({codegen.llvm_get_system_cpu()}, {width} fp32 lanes)",
        tvm_target={"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu(), "num-cores": cores},
        vector_width=width,
        vector_registers=32 if width == 16 else 16,
        modules=DEFAULT_MODULES,
        validators=DEFAULT_VALIDATORS,
        layouts=DEFAULT_LAYOUTS,
        stack_buffer_bytes=AVX512_REGISTER_FILE_BYTES if width == 16 else TVM_STACK_BYTES,
    )


def make_targets() -> list[TargetSpec]:
    cores = os.cpu_count() or 1
    return [
        TargetSpec(
            name="x86-avx512",
            description="x86-64 with AVX-512 (Zen 4 / Skylake-AVX512 class), 16 fp32 lanes",
            tvm_target={"kind": "llvm", "mcpu": "znver4", "num-cores": cores},
            vector_width=16,
            vector_registers=32,
            modules=DEFAULT_MODULES,
            validators=DEFAULT_VALIDATORS,
            layouts=DEFAULT_LAYOUTS,
            required_cpu_features=("avx512f", "avx512bw", "avx512vl"),
            stack_buffer_bytes=AVX512_REGISTER_FILE_BYTES,
        ),
        TargetSpec(
            name="x86-avx2",
            description="x86-64 with AVX2 and FMA (Haswell / Zen 2-3 class), 8 fp32 lanes",
            tvm_target={"kind": "llvm", "mcpu": "core-avx2", "num-cores": cores},
            vector_width=8,
            modules=DEFAULT_MODULES,
            validators=DEFAULT_VALIDATORS,
            layouts=DEFAULT_LAYOUTS,
            required_cpu_features=("avx2", "fma"),
        ),
        TargetSpec(
            name="llvm",
            description="generic LLVM CPU code for the host architecture, no ISA assumptions",
            tvm_target={"kind": "llvm", "num-cores": cores},
            vector_width=4,
            modules=DEFAULT_MODULES,
            validators=DEFAULT_VALIDATORS,
            layouts=DEFAULT_LAYOUTS,
        ),
        _host_target(cores),
    ]


@hookimpl
def probtune_register_targets(register: Callable[[Any], None]) -> None:
    for target in make_targets():
        register(target)
