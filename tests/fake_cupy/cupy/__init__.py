"""Stands for CuPy on a machine without a GPU: loads a cubin's header, logs launches, runs nothing.

Put this folder's parent on ``PYTHONPATH``. ``FAKE_CUPY_LOG`` names the file
the launches are logged to; ``FAKE_CUPY_ANSWERS`` a reference whose outputs
stand for a correct kernel's (``bundle``: the one beside the running bundle
script); ``FAKE_CUPY_FAULT`` a file whose presence makes the next launch
fault and break the context.
"""

import json
import os
import sys

import numpy as np

LOG = os.environ["FAKE_CUPY_LOG"]
REFERENCE = os.environ.get("FAKE_CUPY_ANSWERS")
if REFERENCE == "bundle":
    REFERENCE = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "reference.npz")
FAULT = os.environ.get("FAKE_CUPY_FAULT")
_broken = []


def _check_context():
    if _broken:
        raise RuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered")


class _Kernel:
    def __init__(self, name):
        self.name = name

    def __call__(self, grid, block, args, shared_mem=0):
        if FAULT and os.path.exists(FAULT):
            os.remove(FAULT)
            _broken.append(True)
        _check_context()
        with open(LOG, "a") as log:
            log.write(json.dumps({"kernel": self.name, "grid": list(grid), "block": list(block),
                                  "args": len(args), "shared": shared_mem}) + "\n")


class RawModule:
    def __init__(self, path):
        with open(path, "rb") as cubin:
            assert cubin.read(4) == b"\x7fELF"

    def get_function(self, name):
        return _Kernel(name)


def asarray(array):
    return np.array(array)


def zeros(shape, dtype=None):
    return np.zeros(shape, dtype)


def asnumpy(array):
    if REFERENCE:
        with np.load(REFERENCE) as saved:
            return saved["output_0"]
    return np.asarray(array)


class _Event:
    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


class _Graph:
    def launch(self, stream=None):
        pass


class _Stream:
    def __init__(self, non_blocking=False):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def begin_capture(self):
        pass

    def end_capture(self):
        return _Graph()


class cuda:
    Event = _Event
    Stream = _Stream

    @staticmethod
    def get_elapsed_time(start, end):
        return 0.5

    class Device:
        def synchronize(self):
            pass

    class runtime:
        @staticmethod
        def getDeviceProperties(index):
            return {"name": b"Fake GPU"}

        @staticmethod
        def deviceSynchronize():
            _check_context()
