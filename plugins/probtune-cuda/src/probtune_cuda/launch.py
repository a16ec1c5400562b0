"""The kernel launches of a finished CUDA program: which kernels, in what order, on what grid, with what arguments.

A machine with a GPU but no TVM (a bundle, :mod:`probtune_cuda.cupy_runtime`) runs a
candidate from its cubin with this table, as TVM's host code would: TVM's
own lowering runs up to the split of host and device code, and each
``call_ffi_kernel`` of the host function gives one launch. An argument is a
parameter of the program (by position), a buffer the host code allocates (a
scratch buffer between kernels, by name, with its size), or an integer. A
buffer declared over another's data (an output written as a strided view into
a larger tensor, :func:`probtune.model.concat_in_place.write_into`) is that
one: the kernel adds the view's offsets itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tvm
from tvm.target import Target
from tvm.tirx.build import split_host_device_mods

from probtune.plugin import iter_stmts

__all__ = ["KernelLaunch", "Scratch", "UnsupportedLaunch", "kernel_launches"]

_AXES = "xyz"


class UnsupportedLaunch(ValueError):
    """The host code does something between kernels that a launch table cannot say."""


@dataclass(frozen=True)
class Scratch:
    """A buffer the host code allocates for its kernels (zeroed by a runner)."""

    name: str
    dtype: str
    elements: int


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch: ``args`` items are ``{"param": i}``, ``{"scratch": name}`` or ``{"scalar": v, "dtype": d}``."""

    kernel: str
    args: tuple[dict[str, Any], ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "args": list(self.args), "grid": list(self.grid), "block": list(self.block),
                "shared": self.dynamic_shared_bytes}


def kernel_launches(mod: tvm.IRModule, tvm_target: dict[str, Any]) -> tuple[list[KernelLaunch], list[Scratch]]:
    """The launches of ``mod``'s ``main`` in order, and the scratch buffers they share."""
    target = Target(tvm_target)
    bound = tvm.tirx.transform.BindTarget(target.with_host("llvm"))(mod)
    pipeline, _, _ = tvm.tirx.get_default_tir_pipeline(target)
    host, _ = split_host_device_mods(pipeline(bound))
    entry = host["main"]
    params = {str(param.name): position for position, param in enumerate(mod["main"].params)}
    scratch: dict[str, Scratch] = {}  # by the name of its data variable (unique in the host function)
    aliases: dict[str, str] = {}  # a buffer declared over another's data (a strided view, flattened) -> that one
    launches = []
    for stmt in iter_stmts(entry.body):
        if type(stmt).__name__ == "DeclBuffer" and _is_buffer_data(stmt.data):
            aliases[str(stmt.buffer.name)] = str(_data_var(stmt.data).name)
        elif type(stmt).__name__ == "AllocBuffer":
            buffer = stmt.buffer
            elements = 1
            for extent in buffer.shape:
                elements *= int(extent)
            scratch[str(_data_var(buffer.data).name)] = Scratch(str(buffer.name), str(buffer.dtype), elements)
        elif isinstance(stmt, tvm.tirx.Evaluate) and _is_launch(stmt.value):
            launches.append(_launch(stmt.value, params, scratch, aliases))
    return launches, list(scratch.values())


def _is_launch(expr: Any) -> bool:
    op = getattr(expr, "op", None)
    return isinstance(op, tvm.ir.Op) and op.name == "tirx.call_ffi_kernel"


def _launch(call: Any, params: dict[str, int], scratch: dict[str, Scratch], aliases: dict[str, str]) -> KernelLaunch:
    tags = [str(tag) for tag in call.attrs.launch_params]
    values = list(call.args[len(call.args) - len(tags) :])
    grid, block, shared = [1, 1, 1], [1, 1, 1], 0
    for tag, value in zip(tags, values):
        if not isinstance(value, tvm.tirx.IntImm):
            raise UnsupportedLaunch(f"launch parameter {tag} is {value}, not a constant")
        if tag.startswith("blockIdx."):
            grid[_AXES.index(tag[-1])] = int(value)
        elif tag.startswith("threadIdx."):
            block[_AXES.index(tag[-1])] = int(value)
        elif tag == "tirx.use_dyn_shared_memory":
            shared = int(value)
        else:
            raise UnsupportedLaunch(f"unknown launch parameter {tag}")
    args = tuple(_argument(arg, params, scratch, aliases) for arg in call.args[1 : len(call.args) - len(tags)])
    return KernelLaunch(str(call.args[0].value), args, (grid[0], grid[1], grid[2]), (block[0], block[1], block[2]), shared)


def _argument(arg: Any, params: dict[str, int], scratch: dict[str, Scratch], aliases: dict[str, str]) -> dict[str, Any]:
    if isinstance(arg, tvm.tirx.IntImm):
        return {"scalar": int(arg.value), "dtype": str(arg.dtype)}
    if _is_buffer_data(arg):
        name = _resolved(str(_data_var(arg).name), aliases)
        if name in scratch:
            return {"scratch": scratch[name].name}
        if name in params:
            return {"param": params[name]}
    raise UnsupportedLaunch(f"kernel argument {arg} is neither a parameter, a buffer of the host code nor an integer")


def _resolved(name: str, aliases: dict[str, str]) -> str:
    """The buffer whose data ``name``'s declaration uses, through any chain of declarations."""
    seen = {name}
    while aliases.get(name, name) not in seen:
        name = aliases[name]
        seen.add(name)
    return name


def _data_var(data: Any) -> Any:
    """The variable behind a buffer's data: TVM writes it ``buffer_data(var)``."""
    return data.args[0] if _is_buffer_data(data) else data


def _is_buffer_data(expr: Any) -> bool:
    op = getattr(expr, "op", None)
    return isinstance(op, tvm.ir.Op) and op.name == "tirx.buffer_data" and len(expr.args) == 1
