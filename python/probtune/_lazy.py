"""A package's public names imported on first use (PEP 562).

probtune's facade and ``probtune.measure`` use it so that importing them loads
neither TVM nor the compiled core: a measurement child imports
``probtune.measure._worker``, and with it both packages, and the one that times
candidates must load only TVM's runtime.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(
    package: str, source_of: dict[str, str], public: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: each name in ``source_of`` comes from that module."""
    public = list(public)

    def __getattr__(name: str) -> Any:
        if name not in source_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source_of[name]), name)
        setattr(sys.modules[package], name, value)  # later lookups do not come here
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(public))

    return __getattr__, __dir__
