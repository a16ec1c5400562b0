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

__all__ = ["RuntimeLoadError", "first_available", "load_runtime"]


class RuntimeLoadError(Exception):
    """A runtime the bundle carries that does not load on this machine; the message names it and why."""


def load_runtime(bundle: Path, runtimes: dict[str, str], name: str) -> ModuleType:
    """The runtime ``name`` of the bundle, loaded from its file; KeyError where the bundle does not carry it,
    :class:`RuntimeLoadError` where its file does not load here (a missing module it imports, a broken file)."""
    path = bundle / runtimes[name]
    module_name = f"probtune_bundle_runtime_{name}"
    try:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"{path.name} is not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # what a dataclass in it looks itself up by
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - whatever a plugin's file raises on import is reported, not a traceback
        sys.modules.pop(module_name, None)
        raise RuntimeLoadError(
            f"the bundle's runtime {name!r} ({path.name}) does not load here: {type(exc).__name__}: {exc}"
        ) from None
    return module


def first_available(bundle: Path, runtimes: dict[str, str]) -> tuple[str, ModuleType] | None:
    """The first runtime the bundle carries that this machine can use (its ``available()``), with its name.

    One that does not load, or whose ``available()`` fails, is passed over with a note on stderr.
    """
    for name in runtimes:
        try:
            module = load_runtime(bundle, runtimes, name)
            usable = bool(module.available())
        except Exception as exc:  # noqa: BLE001 - a runtime that cannot say is one this machine cannot use
            print(f"note: passing over runtime {name!r}: {exc}", file=sys.stderr)
            continue
        if usable:
            return name, module
    return None
