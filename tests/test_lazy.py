"""probtune's facade imports its names on first use: importing the packages loads neither TVM nor the core."""

from __future__ import annotations

import subprocess
import sys

import pytest

import probtune
import probtune.measure


def test_importing_the_packages_loads_neither_tvm_nor_the_core():
    probe = (
        "import sys, probtune, probtune.measure, probtune.measure._worker\n"
        "print(sorted(m for m in ('tvm', 'probtune._core', 'probtune.task.tuning') if m in sys.modules))\n"
        "probtune.tune\n"
        "print(sorted(m for m in ('tvm', 'probtune._core', 'probtune.task.tuning') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    before, after = done.stdout.splitlines()
    assert before == "[]"
    assert after == "['probtune._core', 'probtune.task.tuning', 'tvm']"


@pytest.mark.parametrize("package", [probtune, probtune.measure])
def test_every_public_name_resolves_and_is_listed(package):
    for name in package.__all__:
        assert getattr(package, name) is not None
        assert name in dir(package)


def test_an_unknown_name_is_an_attribute_error_that_names_it():
    with pytest.raises(AttributeError, match="module 'probtune' has no attribute 'tuen'"):
        probtune.tuen  # noqa: B018
