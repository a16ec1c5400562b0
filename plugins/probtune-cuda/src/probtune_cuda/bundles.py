"""The plugin's bundle runtime, as it registers it: the CuPy launcher that a bundle of cubins carries."""

from __future__ import annotations

from dataclasses import dataclass

from probtune_cuda import cupy_runtime

__all__ = ["CUPY_RUNTIME", "RuntimeFile"]


@dataclass(frozen=True)
class RuntimeFile:
    """A bundle runtime (``probtune.plugin.BundleRuntime``): its name, the kinds of code it launches, its file."""

    name: str
    kinds: tuple[str, ...]
    source: str


CUPY_RUNTIME = RuntimeFile("cupy", (cupy_runtime.KIND,), str(cupy_runtime.__file__))
