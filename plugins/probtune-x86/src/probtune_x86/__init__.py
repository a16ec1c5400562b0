"""x86 and generic LLVM targets for probtune.

``host`` picks the widest vector ISA this CPU supports, so that tuning on any
x86 machine works out of the box, and on a CPU with AVX-512 VNNI or
AVX512-BF16 adds their dot products (:mod:`probtune_x86.vnni`,
:mod:`probtune_x86.bf16`; bf16 also offers the precision ``bf16``); the named
ISA targets make a tuning record portable to machines of that class.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from probtune.plugin import TARGET_PRECISIONS, TargetSpec, hookimpl
from probtune_cpu.codegen import TVM_STACK_BYTES, LLVMCompiler
from probtune_cpu.defaults import (
    DEFAULT_GRAPH_REWRITES,
    DEFAULT_LAYOUTS,
    DEFAULT_MODULES,
    DEFAULT_MUTATORS,
    DEFAULT_VALIDATORS,
)
from probtune_cpu.host_cpu import CPURequirement, cpu_features, cpu_model
from probtune_cpu.vector_unit import vector_attrs
from probtune_x86.amx import AMXBF16DotProduct, AMXDotProduct, RewriteAMXBF16Layout, RewriteAMXLayout
from probtune_x86.bf16 import BF16DotProduct, PadBF16Channels, RewriteBF16Layout
from probtune_x86.features import X86Features
from probtune_x86.row_gather import GATHER_ROWS
from probtune_x86.tile_config import configure_tiles
from probtune_x86.vnni import PadVNNIChannels, RewriteVNNILayout, VNNIDotProduct
from probtune_x86.window_channels import FoldWindowColumns

__all__ = ["AMX_BF16_FEATURE", "AMX_FEATURE", "BF16_FEATURE", "VNNI_FEATURE", "dot_product_space", "full_width_mattr", "host_mattr",
           "make_targets"]

VNNI_FEATURE = "avx512_vnni"
"""The CPU flag (``/proc/cpuinfo``) of AVX-512 VNNI, which ``vpdpbusd`` needs."""

BF16_FEATURE = "avx512_bf16"
"""The CPU flag of AVX512-BF16, which ``vdpbf16ps`` needs."""

AMX_FEATURE = "amx_int8"
"""The CPU flag of AMX-INT8, which ``tdpbusd`` needs."""

AMX_BF16_FEATURE = "amx_bf16"
"""The CPU flag of AMX-BF16, which ``tdpbf16ps`` needs."""


AVX512_REGISTER_FILE_BYTES = 32 * 64
"""32 zmm registers of 64 bytes: a buffer smaller than this may stay on the stack, and so in registers
(AVX2's 16 ymm registers hold 512 bytes, under TVM's own 1 KB cut-off)."""

X86_64 = ("x86_64", "AMD64")  # platform.machine() on Linux and Windows

_LLVM_FEATURES = {
    "avx512_vnni": "avx512vnni", "avx512_bf16": "avx512bf16", "avx512_fp16": "avx512fp16", "avx_vnni": "avxvnni",
    "amx_tile": "amx-tile", "amx_int8": "amx-int8", "amx_bf16": "amx-bf16",
}
"""The CPU flags of the dot-product and tile instructions, by their LLVM feature names."""


def host_mattr(cpu: str, flags: frozenset[str]) -> list[str]:
    """The LLVM features (``+name``) this CPU's flags list but LLVM's model ``cpu`` lacks: a virtual machine may
    report a Sapphire Rapids' AMX and AVX512-BF16 under a CPU model LLVM reads as an older part (Rocket Lake)."""
    from tvm.target import Target, codegen

    known = set(codegen.llvm_get_cpu_features(Target({"kind": "llvm", "mcpu": cpu})))
    return [f"+{llvm}" for flag, llvm in _LLVM_FEATURES.items() if flag in flags and llvm not in known]


def full_width_mattr(cpu: str, flags: frozenset[str]) -> list[str]:
    """``-prefer-256-bit`` where the CPU has AVX-512 but LLVM's model ``cpu`` prefers 256-bit vectors (Intel's server
    parts): the space tiles for 16 fp32 lanes, and LLVM would otherwise split each such vector loop (a requantizing
    epilogue, say) into 8-lane halves."""
    from tvm.target import Target, codegen

    if "avx512f" not in flags:
        return []
    return ["-prefer-256-bit"] if "prefer-256-bit" in codegen.llvm_get_cpu_features(Target({"kind": "llvm", "mcpu": cpu})) else []


def dot_product_space(
    vnni: bool, bf16: bool, amx: bool = False, amx_bf16: bool = False
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The CPU modules, validators and graph rewrites with the dot-product instructions': their tilings before
    multi-level tiling's (an AMX tile product before the vector instruction of its types, which takes its other
    sketch), their layouts and intrinsics after the weights' panels and the reductions' initialisations, their channel
    padding after the float convolutions', then the window folding that gives few-channel bf16 convolutions to the tiles.
    An AMX tile product is offered with its vector instruction only."""
    offered = (
        (AMXDotProduct, RewriteAMXLayout, amx and vnni),
        (VNNIDotProduct, RewriteVNNILayout, vnni),
        (AMXBF16DotProduct, RewriteAMXBF16Layout, amx_bf16 and bf16),
        (BF16DotProduct, RewriteBF16Layout, bf16),
    )
    tilings = [tiling.name for tiling, _, on in offered if on]
    layouts = [layout.name for _, layout, on in offered if on]
    if not tilings:
        return DEFAULT_MODULES, DEFAULT_VALIDATORS, DEFAULT_GRAPH_REWRITES
    modules = list(DEFAULT_MODULES)
    at = modules.index("multi-level-tiling")
    modules[at:at] = tilings
    validators = list(DEFAULT_VALIDATORS)
    at = validators.index("rewrite-packed-layout") + 1
    validators[at:at] = layouts
    validators.insert(validators.index("rewrite-reduction-block") + 1, "rewrite-cpu-tensorize")
    rewrites = list(DEFAULT_GRAPH_REWRITES)
    at = rewrites.index("pad-channels") + 1
    rewrites[at:at] = [r.name for r, offered in ((PadVNNIChannels, vnni), (PadBF16Channels, bf16),
                                                 (FoldWindowColumns, amx_bf16 and bf16)) if offered]
    return tuple(modules), tuple(validators), tuple(rewrites)


def _cpu_target(
    name: str,
    description: str,
    tvm_target: dict[str, Any],
    width: int,
    vnni: bool = False,
    bf16: bool = False,
    amx: bool = False,
    amx_bf16: bool = False,
    **fields: Any,
) -> TargetSpec:
    """A target with the CPU space, its vector unit (AVX-512 has 32 vector registers, the others 16), and its compiler
    (with AMX, one that configures the tiles); with ``bf16``, the precision ``bf16`` too."""
    registers = 32 if width == 16 else 16
    stack_bytes = AVX512_REGISTER_FILE_BYTES if width == 16 else TVM_STACK_BYTES
    modules, validators, rewrites = dot_product_space(vnni, bf16, amx, amx_bf16)
    tiles = (amx and vnni) or (amx_bf16 and bf16)
    if bf16:
        fields["precisions"] = (*TARGET_PRECISIONS, "bf16")
    return TargetSpec(
        name=name,
        description=description,
        tvm_target=tvm_target,
        modules=modules,
        validators=validators,
        mutators=DEFAULT_MUTATORS,
        layouts=DEFAULT_LAYOUTS,
        graph_rewrites=rewrites,
        concat_in_place=True,
        attrs=vector_attrs(width, registers),
        compiler=LLVMCompiler(stack_bytes, lowering=(configure_tiles,) if tiles else ()),
        local_device=cpu_model,
        **fields,
    )


def _host_target(cores: int) -> TargetSpec:
    from tvm.target import codegen

    features = cpu_features()
    width = 16 if "avx512f" in features else 8 if "avx2" in features else 4
    vnni = width == 16 and VNNI_FEATURE in features
    bf16 = width == 16 and BF16_FEATURE in features
    amx = vnni and AMX_FEATURE in features
    amx_bf16 = bf16 and AMX_BF16_FEATURE in features
    cpu = codegen.llvm_get_system_cpu()
    extras = [what for what, offered in (("VNNI 8-bit", vnni), ("AMX 8-bit tile", amx), ("AVX512-BF16", bf16),
                                         ("AMX bf16 tile", amx_bf16)) if offered]
    mattr = host_mattr(cpu, features) + full_width_mattr(cpu, features)
    return _cpu_target(
        "host",
        f"this machine's CPU ({cpu}, {width} fp32 lanes{''.join(', ' + e for e in extras)}"
        f"{' dot products' if extras else ''})",
        {"kind": "llvm", "mcpu": cpu, "num-cores": cores, **({"mattr": mattr} if mattr else {})},
        width,
        vnni,
        bf16,
        amx,
        amx_bf16,
    )


def make_targets() -> list[TargetSpec]:
    cores = os.cpu_count() or 1
    return [
        _cpu_target(
            "x86-avx512",
            "x86-64 with AVX-512 (Zen 4 / Skylake-AVX512 class), 16 fp32 lanes",
            {"kind": "llvm", "mcpu": "znver4", "num-cores": cores},
            16,
            runs_here=CPURequirement(X86_64, ("avx512f", "avx512bw", "avx512vl")),
        ),
        _cpu_target(
            "x86-avx2",
            "x86-64 with AVX2 and FMA (Haswell / Zen 2-3 class), 8 fp32 lanes",
            {"kind": "llvm", "mcpu": "core-avx2", "num-cores": cores},
            8,
            runs_here=CPURequirement(X86_64, ("avx2", "fma")),
        ),
        _cpu_target(
            "llvm",
            "generic LLVM CPU code for the host architecture, no ISA assumptions",
            {"kind": "llvm", "num-cores": cores},
            4,
        ),
        _host_target(cores),
    ]


@hookimpl
def probtune_register_targets(register: Callable[[Any], None]) -> None:
    for target in make_targets():
        register(target)


@hookimpl
def probtune_register_instructions(register: Callable[[Any], None]) -> None:
    register(GATHER_ROWS)


@hookimpl
def probtune_register_space_modules(register: Callable[[Any], None]) -> None:
    register(AMXDotProduct())
    register(VNNIDotProduct())
    register(AMXBF16DotProduct())
    register(BF16DotProduct())


@hookimpl
def probtune_register_validators(register: Callable[[Any], None]) -> None:
    register(RewriteAMXLayout())
    register(RewriteVNNILayout())
    register(RewriteAMXBF16Layout())
    register(RewriteBF16Layout())


@hookimpl
def probtune_register_graph_rewrites(register: Callable[[Any], None]) -> None:
    register(PadVNNIChannels())
    register(PadBF16Channels())
    register(FoldWindowColumns())


@hookimpl
def probtune_register_feature_extractors(register: Callable[[Any], None]) -> None:
    register(X86Features())
