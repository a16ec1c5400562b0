"""CUDA source to a cubin with NVRTC from NVIDIA's PyPI wheels, and what ptxas says each kernel uses.

No CUDA toolkit and no GPU are needed: ``nvidia-cuda-nvrtc`` brings the
compiler library, ``nvidia-cuda-runtime`` and ``nvidia-cuda-cccl`` the
headers TVM's CUDA code includes. The library is called through ``ctypes``
(its C API is six functions). ``CUDA_PATH`` overrides where they are looked
up; by default, the ``nvidia/cu13`` folder of the installed wheels.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["COMPILES_KEPT", "CUDAToolchainError", "KernelResources", "compile_cubin", "cuda_home", "kernel_resources"]


class CUDAToolchainError(RuntimeError):
    """NVRTC is missing, or refused the source."""


@dataclass(frozen=True)
class KernelResources:
    """What ptxas reports for one kernel: registers per thread, bytes of stack (local memory), spills, shared memory."""

    kernel: str
    registers: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    shared_bytes: int


def cuda_home() -> Path:
    """The folder holding ``lib/libnvrtc.so.*`` and ``include/``: ``CUDA_PATH``, or the wheels' ``nvidia/cu13``."""
    if os.environ.get("CUDA_PATH"):
        return Path(os.environ["CUDA_PATH"])
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec and spec.submodule_search_locations else []:
        if (Path(root) / "cu13" / "lib").is_dir():
            return Path(root) / "cu13"
    raise CUDAToolchainError(
        "NVRTC not found: install the pinned nvidia-cuda-nvrtc, nvidia-cuda-runtime and nvidia-cuda-cccl wheels "
        "(make setup does), or set CUDA_PATH to a CUDA installation"
    )


@functools.cache
def _nvrtc() -> ctypes.CDLL:
    lib = cuda_home() / "lib"
    builtins = sorted(lib.glob("libnvrtc-builtins.so.*"))
    library = sorted(lib.glob("libnvrtc.so.*"))
    if not builtins or not library:
        raise CUDAToolchainError(f"no libnvrtc.so in {lib}")
    ctypes.CDLL(str(builtins[0]), mode=ctypes.RTLD_GLOBAL)  # NVRTC opens it by name, which the loader would not find
    nvrtc = ctypes.CDLL(str(library[0]))
    nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
    return nvrtc


def _check(nvrtc: ctypes.CDLL, status: int, what: str) -> None:
    if status != 0:
        raise CUDAToolchainError(f"NVRTC {what} failed: {nvrtc.nvrtcGetErrorString(status).decode()}")


COMPILES_KEPT = 128
"""Cubins kept per process by source: a model's bundle compiles each function's program that its default-program
check compiled already."""


@functools.lru_cache(maxsize=COMPILES_KEPT)
def compile_cubin(source: str, arch: str) -> tuple[bytes, str]:
    """``source`` compiled for ``arch`` (e.g. ``sm_80``): the cubin and the compile log with ptxas's resource report.

    The same source and architecture give the same cubin, so the last ``COMPILES_KEPT`` are kept (a refusal is not).
    """
    nvrtc, include = _nvrtc(), cuda_home() / "include"
    program = ctypes.c_void_p()
    _check(nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"kernel.cu", 0, None, None), "create")
    try:
        options = [f"-arch={arch}", "-default-device", "-std=c++17", f"-I{include}", f"-I{include / 'cccl'}", "-Xptxas=-v"]
        array = (ctypes.c_char_p * len(options))(*[option.encode() for option in options])
        status = nvrtc.nvrtcCompileProgram(program, len(options), array)
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(program, log)
        text = log.value.decode(errors="replace")
        if status != 0:
            raise CUDAToolchainError(f"NVRTC could not compile the kernel: {_errors(text)}")
        _check(nvrtc, nvrtc.nvrtcGetCUBINSize(program, ctypes.byref(size)), "cubin size")
        cubin = ctypes.create_string_buffer(size.value)
        _check(nvrtc, nvrtc.nvrtcGetCUBIN(program, cubin), "cubin")
        return cubin.raw, text
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(program))


def _errors(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if "error" in line]
    return "; ".join(lines[:3]) or log.strip()[-300:]


_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SHARED = re.compile(r"(\d+) bytes smem")


def kernel_resources(log: str) -> list[KernelResources]:
    """Each kernel's resources, from the ``-Xptxas=-v`` lines of an NVRTC log."""
    found = []
    pieces = _ENTRY.split(log)
    for name, body in zip(pieces[1::2], pieces[2::2]):
        frame = _FRAME.search(body)
        used, shared = _USED.search(body), _SHARED.search(body)
        stack, stores, loads = (int(value) for value in frame.groups()) if frame else (0, 0, 0)
        found.append(
            KernelResources(name, int(used.group(1)) if used else 0, stack, stores, loads, int(shared.group(1)) if shared else 0)
        )
    return found
