"""Importing modules that parse TVMScript as they load: the same functions, parsed with a cheap call stack."""

from __future__ import annotations

import inspect
import sys

import tvm_ffi

from probtune.schedule.script_imports import _stack, import_parsed

SCRIPT = '''
import inspect

from tvm.script import tirx as T

STACK = inspect.stack  # what this import ran with

WIDTH = {width}


@T.prim_func(s_tir=True)
def scale(a: T.Buffer((WIDTH,), "float32"), b: T.Buffer((WIDTH,), "float32")):
    for i in range(WIDTH):
        with T.sblock("b"):
            v = T.axis.spatial(WIDTH, i)
            b[v] = a[v] * T.float32(2)
'''


def test_the_cheap_stack_has_the_standard_ones_frames_lines_and_names():
    def inner():
        return _stack(), inspect.stack()

    cheap, standard = inner()
    assert len(cheap) == len(standard)
    for ours, theirs in zip(cheap[1:], standard[1:]):  # the first: the line each was called on
        assert ours.frame is theirs.frame and ours.lineno == theirs.lineno and ours.function == theirs.function
        assert ours.code_context == theirs.code_context


def test_a_module_imported_so_parses_as_a_plain_import_does(tmp_path, monkeypatch):
    (tmp_path / "parsed_cheaply.py").write_text(SCRIPT.format(width=8))
    (tmp_path / "parsed_plainly.py").write_text(SCRIPT.format(width=8))
    monkeypatch.syspath_prepend(str(tmp_path))
    standard = inspect.stack
    cheap = import_parsed("parsed_cheaply")
    assert inspect.stack is standard  # put back
    plain = __import__("parsed_plainly")
    assert cheap.STACK is _stack and plain.STACK is standard
    assert tvm_ffi.structural_equal(cheap.scale, plain.scale)
    assert import_parsed("parsed_cheaply") is cheap is sys.modules["parsed_cheaply"]
