"""The arm-neon target: samples of the tuned space cross-compile to AArch64 code that uses NEON FMA."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys

import pytest
import tvm

from probtune import Rng, generate_space, tune
from probtune.errors import DeviceError
from probtune.search.search_strategy import RandomSearch
from probtune.targets import resolve_target
from probtune.workloads.catalog import BUILTIN_WORKLOADS

# fmla on four fp32 lanes, vector by vector or vector by element: v0.4s, v1.4s, v2.4s / v2.s[1]
NEON_FMA_4S = re.compile(r"\bfmla\s+v\d+\.4s,")
EM_AARCH64 = 183  # ELF e_machine
# Most samples get an innermost spatial tile of 1 or 2 (scalar fmadd, or 2-lane fmla v.2s), so only
# about 1 sample in 4 (conv2d) to 2 in 5 (matmul) has 4-lane FMA: draw enough that one surely does.
SAMPLES_PER_WORKLOAD = 24
WORKLOADS = ("matmul", "conv2d_nchw")


@pytest.fixture(scope="module")
def arm():
    return resolve_target("arm-neon")


@pytest.fixture(scope="module")
def compiled(arm) -> dict[str, list[tvm.runtime.Module]]:
    """Each workload's random samples at its small shape, cross-compiled for arm-neon."""
    target = tvm.target.Target(arm.tvm_target)
    specs = {spec.name: spec for spec in BUILTIN_WORKLOADS}
    libs = {}
    for name in WORKLOADS:
        workload = specs[name].instantiate(specs[name].small_shape, "float32")
        batch = RandomSearch(generate_space(workload, arm), Rng(0)).next_batch(SAMPLES_PER_WORKLOAD)
        assert len(batch) == SAMPLES_PER_WORKLOAD, f"the space of {workload.key} ran dry"
        libs[name] = [tvm.compile(candidate.mod, target=target).mod for candidate in batch]
    return libs


@pytest.mark.parametrize("name", WORKLOADS)
def test_samples_use_neon_fma(compiled, name):
    with_fma = sum(bool(NEON_FMA_4S.search(lib.inspect_source("asm"))) for lib in compiled[name])
    print(f"{name}: {with_fma}/{len(compiled[name])} samples use fmla v.4s")
    assert with_fma > 0, f"no sample of {name} uses 4-lane NEON FMA"


def test_object_code_is_aarch64(compiled, tmp_path):
    path = tmp_path / "candidate.o"
    compiled["matmul"][0].write_to_file(str(path), "o")
    header = path.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and header[4] == 2, "not a 64-bit ELF object"
    (machine,) = struct.unpack_from("<H", header, 18)
    assert machine == EM_AARCH64, f"ELF machine {machine}, expected AArch64 ({EM_AARCH64})"


def test_plugin_is_listed():
    environment = {k: v for k, v in os.environ.items() if k not in ("PROBTUNE_LOAD_PLUGINS", "PROBTUNE_BLOCK_PLUGINS")}
    done = subprocess.run(
        [sys.executable, "-m", "probtune.cli", "plugins"], capture_output=True, text=True, env=environment, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert re.search(r"^arm  \(probtune-arm [^)]+\)\n    targets: arm-neon$", done.stdout, re.MULTILINE), done.stdout


def test_tuning_without_an_rpc_tracker_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.delenv("PROBTUNE_RPC_TRACKER", raising=False)
    database = tmp_path / "tuning.db"
    with pytest.raises(DeviceError, match=r"the rpc runner needs a tracker and a key: --rpc-tracker HOST:PORT"):
        tune("matmul", shape=(16, 16, 16), target="arm-neon", trials=1, database=database)
    assert not database.exists(), "tuning started before the missing tracker was noticed"
