"""probtune_cpu.codegen: TVM's lowering, with register-sized buffers kept on the stack."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import s_tir

from conftest import matmul_module, run_module
from probtune.measure import LocalBuilder
from probtune.targets import resolve_target
from probtune_arm import AARCH64_LINKER
from probtune_cpu.codegen import TVM_STACK_BYTES, LLVMCompiler, compile_program

WORKSPACE_CALL = "TVMBackendAllocWorkspace"
AVX512_STACK_BYTES = 2048


def _matmul_with_write_cache(rows: int, cols: int) -> tvm.IRModule:
    """A 16x64x8 matmul whose write cache is one ``rows`` x ``cols`` float32 tile, vectorized along ``cols``."""
    sch = s_tir.Schedule(matmul_module(16, 64, 8))
    block = sch.get_sblock("C")
    i, j, k = sch.get_loops(block)
    i_outer, i_inner = sch.split(i, [None, rows])
    j_outer, j_inner = sch.split(j, [None, cols])
    sch.reorder(i_outer, j_outer, k, i_inner, j_inner)
    cache = sch.cache_write(block, 0, "global")
    sch.reverse_compute_at(cache, j_outer)
    sch.parallel(sch.fuse(i_outer, j_outer))
    sch.vectorize(j_inner)
    sch.vectorize(sch.get_loops(cache)[-1])
    return sch.mod


def _assembly(lib) -> str:
    module = lib.mod
    return (module.imports[0] if module.imports else module).inspect_source("asm")


def _assert_computes_the_matmul(lib) -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((16, 8), dtype=np.float32), rng.standard_normal((8, 64), dtype=np.float32)
    _, _, c = run_module(lib, [a, b, np.zeros((16, 64), np.float32)])
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_a_one_kilobyte_tile_stays_on_the_stack_below_the_targets_limit(host):
    mod = _matmul_with_write_cache(8, 32)  # 8 x 32 x 4 bytes: TVM's own cut-off sends it to a heap workspace
    assert WORKSPACE_CALL in _assembly(tvm.compile(mod, target=tvm.target.Target(host.tvm_target)))
    assert WORKSPACE_CALL in _assembly(compile_program(mod, host.tvm_target))  # the default is TVM's cut-off
    lib = compile_program(mod, host.tvm_target, stack_buffer_bytes=AVX512_STACK_BYTES)
    assert WORKSPACE_CALL not in _assembly(lib)
    _assert_computes_the_matmul(lib)


def test_a_tile_as_large_as_the_limit_keeps_its_workspace(host):
    lib = compile_program(_matmul_with_write_cache(16, 32), host.tvm_target, stack_buffer_bytes=16 * 32 * 4)
    assert WORKSPACE_CALL in _assembly(lib)
    _assert_computes_the_matmul(lib)


@pytest.mark.parametrize("stack_buffer_bytes", [TVM_STACK_BYTES, AVX512_STACK_BYTES])
def test_compile_program_takes_a_target_or_its_dict(host, stack_buffer_bytes):
    for target in (host.tvm_target, tvm.target.Target(host.tvm_target)):
        lib = compile_program(_matmul_with_write_cache(8, 16), target, stack_buffer_bytes=stack_buffer_bytes)
        _assert_computes_the_matmul(lib)


def test_the_builder_compiles_as_the_target_says(host, tmp_path):
    mod = _matmul_with_write_cache(8, 32)
    with LocalBuilder(workers=1) as builder:
        artifacts = {
            limit: dict(builder.build([mod], replace(host, compiler=LLVMCompiler(limit)), tmp_path / str(limit)))[0].artifact
            for limit in (TVM_STACK_BYTES, AVX512_STACK_BYTES)
        }
    calls = {limit: WORKSPACE_CALL.encode() in Path(path).read_bytes() for limit, path in artifacts.items()}
    assert calls == {TVM_STACK_BYTES: True, AVX512_STACK_BYTES: False}


def test_x86_targets_keep_what_their_vector_registers_hold_on_the_stack():
    assert resolve_target("x86-avx512").compiler == LLVMCompiler(32 * 64)
    assert resolve_target("x86-avx2").compiler == LLVMCompiler(TVM_STACK_BYTES)  # 16 x 32 bytes: under TVM's cut-off


def test_the_builder_links_with_the_compilers_own_linker(host, tmp_path):
    linked = replace(host, compiler=LLVMCompiler(linker="gcc"))  # the host's C compiler, named: its export is used
    with LocalBuilder(workers=1) as builder:
        [(_, result)] = list(builder.build([_matmul_with_write_cache(8, 16)], linked, tmp_path))
    assert result.error is None, result.error
    _assert_computes_the_matmul(tvm.runtime.load_module(result.artifact))


@pytest.mark.skipif(shutil.which(AARCH64_LINKER) is None, reason=f"no {AARCH64_LINKER} (Debian: gcc-aarch64-linux-gnu)")
def test_arm_neon_candidates_are_linked_into_aarch64_libraries(tmp_path):
    arm = resolve_target("arm-neon")
    with LocalBuilder(workers=1) as builder:
        [(_, result)] = list(builder.build([matmul_module(16, 64, 8)], arm, tmp_path))
    assert result.error is None, result.error
    header = Path(result.artifact).read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # EM_AARCH64
