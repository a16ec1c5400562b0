"""How a CPU target compiles a finished program: TVM's lowering, with register-sized buffers kept on the stack.

TVM's lowering gives any buffer of 1 KB or more a heap workspace
(``TVMBackendAllocWorkspace``). On AVX-512 that catches the accumulator tile
most fast kernels use, 16 vectors of 64 bytes: a write cache of exactly 1 KB
then lives in memory that LLVM cannot keep in registers, and a call allocates
it for every tile. On the stack, LLVM holds it in registers. A target sets
how far this goes, :class:`LLVMCompiler`'s ``stack_buffer_bytes``: the size
of its vector register file, as a larger buffer spills anyway and runs better
in its workspace.

A CPU target's ``compiler`` is an :class:`LLVMCompiler`, so that every
compile of its programs (:func:`probtune.measure.codegen.compile_for`) goes through
:func:`compile_program`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import tirx

__all__ = ["TVM_STACK_BYTES", "LLVMCompiler", "Lowering", "compile_program"]

TVM_STACK_BYTES = 1024
"""TVM's own cut-off: it puts a constant-size buffer smaller than this on the stack, a larger one in a heap workspace."""

_ON_STACK = "disable_lower_builtin"  # TVM's allocation annotation: leave the buffer to the code generator (an alloca)


def _size_in_bytes(buffer: Any) -> int | None:
    if not all(isinstance(extent, tirx.IntImm) for extent in buffer.shape):
        return None
    elements = 1
    for extent in buffer.shape:
        elements *= int(extent)
    dtype = tvm.runtime.DataType(buffer.dtype)  # lowered buffers may hold vectors: float32x16
    return elements * dtype.bits * dtype.lanes // 8


def _keep_on_stack(stmt: Any, limit: int) -> Any | None:
    """``stmt`` with its allocations under ``limit`` bytes annotated to stay on the stack, or None if none changed.

    TVM 0.27 offers no statement mutator in Python, so the statements that hold
    others are rebuilt here; an allocation under any other kind keeps TVM's choice.
    """
    if isinstance(stmt, tirx.AllocBuffer):
        size = _size_in_bytes(stmt.buffer)
        annotations = dict(stmt.annotations or {})
        if size is None or not TVM_STACK_BYTES <= size < limit or _ON_STACK in annotations:
            return None
        annotations[_ON_STACK] = tirx.IntImm("int32", 1)
        return tirx.AllocBuffer(stmt.buffer, annotations, stmt.span)
    if isinstance(stmt, tirx.SeqStmt):
        rewritten = [_keep_on_stack(s, limit) for s in stmt.seq]
        if all(r is None for r in rewritten):
            return None
        return tirx.SeqStmt([r if r is not None else s for r, s in zip(rewritten, stmt.seq)], stmt.span)
    if isinstance(stmt, tirx.For):
        body = _keep_on_stack(stmt.body, limit)
        if body is None:
            return None
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding,
                        stmt.annotations, stmt.step, stmt.span)
    if isinstance(stmt, tirx.AttrStmt):
        body = _keep_on_stack(stmt.body, limit)
        return None if body is None else tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, body, stmt.span)
    if isinstance(stmt, tirx.IfThenElse):
        then_case = _keep_on_stack(stmt.then_case, limit)
        else_case = None if stmt.else_case is None else _keep_on_stack(stmt.else_case, limit)
        if then_case is None and else_case is None:
            return None
        return tirx.IfThenElse(stmt.condition, then_case or stmt.then_case, else_case or stmt.else_case, stmt.span)
    return None


_registered: set[str] = set()  # names of the pipelines registered with TVM by this process

Lowering = Callable[[tirx.PrimFunc], tirx.PrimFunc]
"""A target's own step of lowering a function (setting up an instruction's state), before TVM lowers its builtins."""


def _pipeline_name(limit: int, lowering: tuple[Lowering, ...] = ()) -> str:
    """TVM's lowering (its "s_tir" pipeline, what ``tvm.compile`` uses for CPUs), registered once per ``limit`` and
    steps."""
    name = "-".join(["probtune-stack", str(limit), *(f"{step.__module__}.{step.__qualname__}" for step in lowering)])
    if name in _registered:
        return name

    @tirx.transform.prim_func_pass(opt_level=0, name="probtune.KeepRegisterTilesOnStack")
    def keep_on_stack(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx: Any) -> tirx.PrimFunc:
        for step in lowering:
            func = step(func)
        body = _keep_on_stack(func.body, limit)
        return func if body is None else func.with_body(body)

    def pipeline() -> tuple[Any, Any, Any]:
        lower, finalize_host, finalize_device = tvm.tirx.get_tir_pipeline("s_tir")
        return lower, lambda: tvm.transform.Sequential([keep_on_stack, finalize_host()]), finalize_device

    tvm.tirx.register_tir_pipeline(name, pipeline)  # the pass runs before LowerTVMBuiltin, which allocates
    _registered.add(name)
    return name


def compile_program(
    mod: tvm.IRModule,
    target: tvm.target.Target | dict[str, Any] | str,
    *,
    stack_buffer_bytes: int = TVM_STACK_BYTES,
    lowering: tuple[Lowering, ...] = (),
) -> Any:
    """Compile a finished program for ``target`` (a TVM target or what makes one) the way the tuner measures it.

    Constant-size buffers smaller than ``stack_buffer_bytes`` go on the stack,
    and each function goes through the target's ``lowering`` steps; at TVM's
    own cut-off or below and with no steps, this is plain ``tvm.compile``.
    """
    if not isinstance(target, tvm.target.Target):
        target = tvm.target.Target(target)
    if stack_buffer_bytes <= TVM_STACK_BYTES and not lowering:
        return tvm.compile(mod, target=target)
    return tvm.compile(mod, target=target, tir_pipeline=_pipeline_name(stack_buffer_bytes, lowering))


@dataclass(frozen=True)
class LLVMCompiler:
    """A CPU target's ``compiler``: :func:`compile_program` with the target's ``stack_buffer_bytes``.

    ``linker`` names the C compiler that links its shared libraries when they
    are for another architecture (``aarch64-linux-gnu-gcc``); None: the host's.
    A dataclass rather than a closure, so that it pickles into builder processes.
    """

    stack_buffer_bytes: int = TVM_STACK_BYTES
    linker: str | None = None
    lowering: tuple[Lowering, ...] = ()
    """The target's own lowering steps (module-level functions, so that the compiler pickles)."""

    def __call__(self, mod: tvm.IRModule, tvm_target: dict[str, Any]) -> Any:
        return compile_program(mod, tvm_target, stack_buffer_bytes=self.stack_buffer_bytes, lowering=self.lowering)

    def export(self, executable: Any, path: str, workspace_dir: str | None = None) -> None:
        """Write ``executable`` as a shared library at ``path``, linked by ``linker``."""
        from tvm.support import cc

        fcompile = cc.cross_compiler(self.linker) if self.linker else None
        executable.export_library(path, fcompile=fcompile, workspace_dir=workspace_dir)
