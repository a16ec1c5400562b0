"""How a CUDA target compiles a candidate: TVM's CUDA code, then NVRTC to a cubin, linted before it is kept.

TVM builds the module (its kernels as CUDA source) on any machine, with the
pass options of :mod:`probtune_cuda.lowering`. The
compiler also compiles that source to machine code for the target's
architecture, as the GPU would run it, and refuses a candidate whose kernels
spill registers to local memory, keep arrays in local memory (a stack frame)
or use more registers per thread than the block's size allows: such a
candidate fails its build with that reason and is recorded as a build error,
never timed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import tvm

from probtune.plugin import DeviceCode
from probtune_cuda.cupy_runtime import KIND
from probtune_cuda.launch import UnsupportedLaunch, kernel_launches
from probtune_cuda.lowering import build_options
from probtune_cuda.nvrtc import KernelResources, compile_cubin, kernel_resources

__all__ = ["CUDALintError", "NVRTCCompiler", "lint"]


class CUDALintError(RuntimeError):
    """A candidate's machine code breaks a rule of the target (spills, local memory, registers)."""


def lint(resources: list[KernelResources], tvm_target: Mapping[str, Any], threads: Mapping[str, int]) -> list[str]:
    """What is wrong with each kernel's resources: spills, local memory, registers beyond the register file."""
    problems = []
    registers = int(tvm_target.get("registers_per_block", 65536))
    for kernel in resources:
        if kernel.spill_store_bytes or kernel.spill_load_bytes:
            problems.append(
                f"{kernel.kernel} spills registers ({kernel.spill_store_bytes} bytes stored, {kernel.spill_load_bytes} loaded)"
            )
        if kernel.stack_bytes:
            problems.append(f"{kernel.kernel} keeps {kernel.stack_bytes} bytes in local memory (a stack frame)")
        block = threads.get(kernel.kernel, 1)
        if kernel.registers * block > registers:
            problems.append(
                f"{kernel.kernel} needs {kernel.registers} registers x {block} threads, more than the {registers} of a block"
            )
    return problems


@dataclass(frozen=True)
class NVRTCCompiler:
    """A CUDA target's ``compiler``: ``tvm.compile``, then the kernels compiled by NVRTC and linted.

    A dataclass, so that it pickles into builder processes. ``lint_cubin``
    False skips NVRTC (the module still keeps its source).
    """

    lint_cubin: bool = True
    device_code_kind = KIND  # what device_code gives: a cubin, which the cupy bundle runtime launches

    def __call__(self, mod: tvm.IRModule, tvm_target: dict[str, Any]) -> Any:
        with build_options(mod):
            executable = tvm.compile(mod, target=tvm.target.Target(tvm_target))
        if self.lint_cubin:
            for device_module in _cuda_modules(executable.mod):
                self.check(device_module.inspect_source(), tvm_target)
        return executable

    def device_code(self, mod: tvm.IRModule, tvm_target: dict[str, Any]) -> DeviceCode:
        """The program's kernels as one linted cubin (kind ``cubin``), and the table that launches them without TVM.

        The table (:func:`probtune_cuda.launch.kernel_launches`) lists each
        launch in order, ``{"kernel", "args", "grid", "block", "shared"}``,
        and the ``scratch`` buffers the launches share; the ``cupy`` bundle
        runtime (:mod:`probtune_cuda.cupy_runtime`) reads it.
        """
        with build_options(mod):
            executable = tvm.compile(mod, target=tvm.target.Target(tvm_target))
            launches, scratch = kernel_launches(mod, tvm_target)
        sources = [device_module.inspect_source() for device_module in _cuda_modules(executable.mod)]
        if len(sources) != 1:
            raise UnsupportedLaunch(f"the program has {len(sources)} device modules; a bundle carries one cubin")
        cubin = self.check(sources[0], tvm_target)
        table = {"launches": [launch.to_json() for launch in launches],
                 "scratch": [{"name": b.name, "dtype": b.dtype, "elements": b.elements} for b in scratch]}
        return DeviceCode(cubin, table)

    def check(self, source: str, tvm_target: Mapping[str, Any]) -> bytes:
        """Compile ``source`` for the target's architecture; the cubin, or CUDALintError naming what is wrong."""
        cubin, log = compile_cubin(source, str(tvm_target["arch"]))
        problems = lint(kernel_resources(log), tvm_target, _launch_bounds(source))
        if problems:
            raise CUDALintError("; ".join(problems))
        return cubin


def _cuda_modules(module: Any) -> list[Any]:
    """The CUDA modules among ``module``'s imports, at any depth (a model's sit under its host code's module)."""
    found = []
    for imported in module.imports:
        found.extend([imported] if imported.kind == "cuda" else _cuda_modules(imported))
    return found


def _launch_bounds(source: str) -> dict[str, int]:
    """Threads per block of each kernel, from the ``__launch_bounds__`` TVM writes on it."""
    return {name: int(bound) for bound, name in re.findall(r"__launch_bounds__\((\d+)\)\s+(\w+)\(", source)}
