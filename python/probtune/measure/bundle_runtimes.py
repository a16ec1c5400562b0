"""The bundle runtimes a bundle carries, found and loaded by its stand-alone scripts.

A bundle runtime is a Python file a plugin registered
(``probtune_register_bundle_runtimes``) that launches the bundle's device
code without TVM; the bundle carries it beside its script, and its manifest's
``runtimes`` maps each runtime's name to its file. This module imports
nothing of probtune, so that a bundle carries it as it is.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["first_available", "load_runtime"]


def load_runtime(bundle: Path, runtimes: dict[str, str], name: str) -> ModuleType:
    """The runtime ``name`` of the bundle, loaded from its file; KeyError where the bundle does not carry it."""
    path = bundle / runtimes[name]
    spec = importlib.util.spec_from_file_location(f"probtune_bundle_runtime_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # what a dataclass in it looks itself up by
    spec.loader.exec_module(module)
    return module


def first_available(bundle: Path, runtimes: dict[str, str]) -> tuple[str, ModuleType] | None:
    """The first runtime the bundle carries that this machine can use (its ``available()``), with its name."""
    for name in runtimes:
        module = load_runtime(bundle, runtimes, name)
        if module.available():
            return name, module
    return None
