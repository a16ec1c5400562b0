"""Importing TVM modules that parse TVMScript when imported (tensor intrinsics), without the cost of Python's stack.

TVMScript's ``prim_func`` decorator calls :func:`inspect.stack` for every
function it parses, for the caller's frames and the line of each. The
standard version also looks up the module of each frame, scanning every
loaded module for a frame of the import machinery; with TVM loaded, that
lookup, not the parsing, is most of the time importing its tensor intrinsics
takes, in every process that needs them. While such an import runs, :func:`inspect.stack` gives the same
frames, names and lines from the frames themselves.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import linecache
import sys
import threading
from collections.abc import Iterator
from types import FrameType, ModuleType

__all__ = ["import_parsed"]

_LOCK = threading.Lock()


def import_parsed(name: str) -> ModuleType:
    """``importlib.import_module(name)``, with a cheap :func:`inspect.stack` while the module is first imported."""
    if name in sys.modules:
        return sys.modules[name]
    with _LOCK, _cheap_stack():
        return importlib.import_module(name)


@contextlib.contextmanager
def _cheap_stack() -> Iterator[None]:
    saved = inspect.stack
    inspect.stack = _stack  # type: ignore[assignment]
    try:
        yield
    finally:
        inspect.stack = saved


def _stack(context: int = 1) -> list[inspect.FrameInfo]:
    """The caller's frames, innermost first, each with its file, line, function and (``context`` > 0) source line."""
    frames = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        line = linecache.getline(code.co_filename, frame.f_lineno, frame.f_globals) if context > 0 else ""
        frames.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name,
                                        [line] if line else None, 0 if line else None))
        frame = frame.f_back
    return frames
