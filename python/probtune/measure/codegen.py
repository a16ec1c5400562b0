"""How probtune compiles a finished program: the way its target says, the same for measuring and for use.

Every compile of a tuned program goes through :func:`compile_for` (or
:func:`compile_with`, its form for a builder process): the builder's,
:func:`probtune.compile_best`'s and the benchmarks', so a program runs as fast
as it measured.
"""

from __future__ import annotations

from typing import Any

import tvm

from probtune.interfaces import Compiler, TargetSpec

__all__ = ["compile_for", "compile_with", "device_type", "export_with"]


def compile_with(compiler: Compiler | None, mod: tvm.IRModule, tvm_target: dict[str, Any]) -> Any:
    """Compile ``mod`` for ``tvm_target`` with a target's ``compiler`` (None: plain ``tvm.compile``)."""
    if compiler is None:
        return tvm.compile(mod, target=tvm.target.Target(tvm_target))
    return compiler(mod, tvm_target)


def export_with(compiler: Compiler | None, executable: Any, path: str, workspace_dir: str | None = None) -> None:
    """Write ``executable`` as a shared library at ``path``, linked as the target's ``compiler`` says (its ``export``)."""
    export = getattr(compiler, "export", None)
    if export is not None:
        export(executable, path, workspace_dir)
    else:
        executable.export_library(path, workspace_dir=workspace_dir)


def device_type(target: TargetSpec) -> int:
    """The device a target's code runs on, as ``tvm.device`` takes it (DLPack's type: 1 the CPU; others GPUs and accelerators)."""
    return int(tvm.target.Target(target.tvm_target).get_target_device_type())


def compile_for(mod: tvm.IRModule, target: TargetSpec) -> Any:
    """Compile a finished program for a registered target, as that target compiles it."""
    return compile_with(target.compiler, mod, target.tvm_target)
