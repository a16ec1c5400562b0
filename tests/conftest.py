"""Shared fixtures: small workloads that compile fast on a 2-core machine."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

from probtune.targets import resolve_target


def matmul_module(m: int = 64, n: int = 64, k: int = 64) -> tvm.IRModule:
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


@pytest.fixture
def matmul_mod() -> tvm.IRModule:
    return matmul_module()


@pytest.fixture(scope="session")
def host():
    return resolve_target("host")


def run_module(lib, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Call ``lib['main']`` on copies of ``arrays`` and return them all (outputs updated in place)."""
    dev = tvm.cpu()
    tensors = [tvm.runtime.tensor(a, dev) for a in arrays]
    lib["main"](*tensors)
    return [t.numpy() for t in tensors]
