"""AMX tile products (``tdpbusd``, ``tdpbf16ps``): which blocks map onto a tile, and programs that run it and compute
what the plain program does (exactly for bytes; where this CPU has AMX, elsewhere they are only compiled)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import te, topi

import probtune
from conftest import run_module
from probtune import Rng, generate_space
from probtune.measure.codegen import compile_for
from probtune.targets import resolve_target
from probtune.workloads.workload import Workload
from probtune_cpu.host_cpu import cpu_features
from probtune_x86 import AMX_BF16_FEATURE, AMX_FEATURE, _cpu_target
from probtune_x86.amx import AMX, AMX_BF16, AMXBF16DotProduct, AMXDotProduct, amx_plan
from probtune_x86.features import X86_FEATURE_NAMES, x86_features
from probtune_x86.tile_config import _config_words

SAPPHIRE_RAPIDS = _cpu_target("amx-test", "Sapphire Rapids", {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2},
                              16, vnni=True, bf16=True, amx=True, amx_bf16=True)
"""A target with AMX whatever this machine is: programs compile for it anywhere, and run where the CPU has AMX."""

HAS_AMX = {AMX_FEATURE, AMX_BF16_FEATURE} <= cpu_features()


def _matmul(m: int, n: int, k: int, transposed: bool = False, bf16: bool = False) -> Workload:
    a = te.placeholder((m, k), "bfloat16" if bf16 else "uint8", name="A")
    b = te.placeholder((n, k) if transposed else (k, n), "bfloat16" if bf16 else "int8", name="B")
    acc = "float32" if bf16 else "int32"
    r = te.reduce_axis((0, k), "r")
    c = te.compute((m, n), lambda i, j: te.sum(
        a[i, r].astype(acc) * (b[j, r] if transposed else b[r, j]).astype(acc), axis=r), name="C")
    return Workload.from_module(te.create_prim_func([a, b, c]), name="amx_matmul")


def _operands(workload: Workload) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    (a_shape, a_dtype), (b_shape, _), (out_shape, out_dtype) = workload.param_specs()
    if a_dtype == "bfloat16":
        return [rng.standard_normal(a_shape).astype(ml_dtypes.bfloat16),
                rng.standard_normal(b_shape).astype(ml_dtypes.bfloat16), np.zeros(out_shape, out_dtype)]
    return [rng.integers(0, 256, a_shape).astype("uint8"), rng.integers(-128, 128, b_shape).astype("int8"),
            np.zeros(out_shape, out_dtype)]


def _conv(width: int, channels: int, filters: int, kernel: int, stride: int = 1) -> Workload:
    x = te.placeholder((1, width, width, channels), "uint8", name="X")
    w = te.placeholder((kernel, kernel, channels, filters), "int8", name="W")
    y = topi.nn.conv2d_nhwc(x, w, stride, kernel // 2, 1, out_dtype="int32")
    return Workload.from_module(te.create_prim_func([x, w, y]), name="amx_conv")


def _plan(workload: Workload, name: str):
    sch = tvm.s_tir.Schedule(workload.mod)
    return amx_plan(sch, sch.get_sblock(name))


def test_the_plan_finds_rows_columns_and_terms():
    assert _plan(_matmul(64, 64, 128), "C").rows_loop == 0
    assert _plan(_matmul(32, 48, 64, transposed=True), "C").rows_loop == 0
    assert _plan(_conv(16, 64, 32, 3), "conv2d_nhwc").rows_loop == 2  # the output pixels along a row
    sch = tvm.s_tir.Schedule(_matmul(32, 32, 32, bf16=True).mod)
    assert amx_plan(sch, sch.get_sblock("C"), AMX_BF16).rows_loop == 0  # 32 bfloat16 terms fill a tile
    assert amx_plan(sch, sch.get_sblock("C"), AMX) is None  # not bytes


@pytest.mark.parametrize(("workload", "block", "rows"), [
    (_matmul(64, 64, 128), "C", 16), (_matmul(56, 64, 128), "C", 14), (_matmul(40, 64, 64), "C", 10),
    (_conv(14, 64, 32, 3), "conv2d_nhwc", 14), (_conv(28, 64, 32, 1), "conv2d_nhwc", 14),
    (_matmul(49, 64, 128), "C", 7), (_conv(7, 64, 32, 3), "conv2d_nhwc", 7),  # tiles under half full
])
def test_a_tile_has_the_most_rows_up_to_16_that_divide_the_blocks(workload, block, rows):
    assert _plan(workload, block).tile_rows == rows


@pytest.mark.parametrize(("workload", "block"), [
    (_matmul(51, 64, 128), "C"),  # 51 rows: no tile of 4 to 16 rows divides them
    (_conv(3, 64, 32, 3), "conv2d_nhwc"),  # rows of 3 pixels: tiles under a quarter full
    (_matmul(64, 64, 96), "C"),  # 96 terms are not whole tiles of 64
    (_conv(32, 64, 32, 3, stride=2), "conv2d_nhwc"),  # a stride-2 row reads every other pixel (until gathered)
    (_conv(16, 32, 32, 3), "conv2d_nhwc"),  # 32 channels: a tile's 64 terms would cross the window's taps
])
def test_blocks_a_tile_does_not_fit_are_left_to_vnni(workload, block):
    assert _plan(workload, block) is None


def test_the_space_has_the_tile_product_first_and_vnni_as_its_other_sketch():
    space = generate_space(_matmul(64, 64, 128), SAPPHIRE_RAPIDS)
    assert AMXDotProduct().name in [m.name for m in space.modules]
    (vnni,) = space.alternatives
    tiles, _ = space.draw(Rng(0), space.trace.with_decisions({}))
    vectors, _ = space.draw(Rng(0), vnni.trace.with_decisions({}))
    assert "tdpbusd" in compile_for(tiles.mod, SAPPHIRE_RAPIDS).mod.inspect_source("asm")
    assert "vpdpbusd" in compile_for(vectors.mod, SAPPHIRE_RAPIDS).mod.inspect_source("asm")


@pytest.mark.parametrize("workload", [
    _matmul(64, 64, 128), _matmul(32, 48, 64, transposed=True), _conv(16, 64, 32, 1), _conv(16, 64, 32, 3),
    _matmul(32, 48, 96, bf16=True), _matmul(16, 32, 64, transposed=True, bf16=True),
    _matmul(56, 64, 128), _conv(14, 64, 32, 3), _matmul(40, 32, 64, bf16=True),  # tiles of 14 and 10 rows
    _conv(7, 64, 32, 3),  # tiles of 7 rows
    _conv(16, 64, 32, 3, stride=2), _conv(16, 64, 32, 1, stride=2),  # rows gathered first
])
def test_programs_run_the_tile_product_and_compute_the_plain_programs_sums(workload):
    space = generate_space(workload, SAPPHIRE_RAPIDS)
    draws = (space.draw(Rng(n), space.trace.with_decisions({})) for n in range(20))
    programs = [sch.mod for sch, rejected in draws if rejected is None][:3]
    assert programs
    arrays = _operands(workload)
    want = run_module(compile_for(workload.mod, resolve_target("llvm")), arrays)[2]
    for program in programs:
        lib = compile_for(program, SAPPHIRE_RAPIDS)
        asm = lib.mod.inspect_source("asm")
        assert ("tdpbusd" in asm or "tdpbf16ps" in asm) and "ldtilecfg" in asm
        if HAS_AMX:
            got = run_module(lib, arrays)[2]
            if workload.param_specs()[2][1] == "int32":
                np.testing.assert_array_equal(got, want)
            else:  # float sums in another order
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_tile_programs_build_where_storage_rewrite_shares_a_buffer_of_another_type():
    """TVM's storage rewrite lets the int32 write cache of a stride-2 convolution share the memory of its gathered
    uint8 input; the tiles then address it by element, which a typed access pointer could not (4 of these 12 draws
    failed to lower so)."""
    workload = _conv(16, 64, 32, 3, stride=2)
    space = generate_space(workload, SAPPHIRE_RAPIDS)
    draws = [space.draw(Rng(n), space.trace.with_decisions({})) for n in range(12)]
    programs = [sch.mod for sch, rejected in draws if rejected is None]
    assert len(programs) >= 8
    for program in programs:
        assert "tdpbusd" in compile_for(program, SAPPHIRE_RAPIDS).mod.inspect_source("asm")


def _two_products(first_rows: int, second_rows: int) -> Workload:
    """Two independent products in one program, of ``first_rows`` and ``second_rows`` rows."""

    def product(n: int, m: int) -> list[te.Tensor]:
        a, b = te.placeholder((m, 64), "uint8", name=f"A{n}"), te.placeholder((64, 32), "int8", name=f"B{n}")
        r = te.reduce_axis((0, 64), f"r{n}")
        return [a, b, te.compute((m, 32), lambda i, j: te.sum(
            a[i, r].astype("int32") * b[r, j].astype("int32"), axis=r), name=f"C{n}")]

    (a0, b0, c0), (a1, b1, c1) = product(0, first_rows), product(1, second_rows)
    return Workload.from_module(te.create_prim_func([a0, b0, a1, b1, c0, c1]), name="amx_two_products")


def test_a_program_whose_tiles_need_two_configurations_is_rejected():
    space = generate_space(_two_products(32, 28), SAPPHIRE_RAPIDS)
    _, rejected = space.draw(Rng(0), space.trace.with_decisions({}))  # both products on tiles: 16 and 14 rows
    assert rejected is not None and rejected.validator == "rewrite-amx-layout" and "rows" in rejected.reason
    space = generate_space(_two_products(32, 64), SAPPHIRE_RAPIDS)
    _, rejected = space.draw(Rng(0), space.trace.with_decisions({}))
    assert rejected is None


def test_the_tile_configuration_gives_a_and_c_the_marked_rows_and_b_16():
    assert list(_config_words(14)[6].to_bytes(8, "little")) == [14] * 6 + [16, 16]
    assert _config_words(16)[6] == 0x1010_1010_1010_1010


def test_the_cost_model_counts_the_tile_products():
    space = generate_space(_matmul(64, 64, 128), SAPPHIRE_RAPIDS)
    sch, rejected = space.draw(Rng(0), space.trace.with_decisions({}))
    assert rejected is None
    counts = dict(zip(X86_FEATURE_NAMES, x86_features(sch.mod["main"])))
    assert counts["amx_calls"] == (64 // 16) * (64 // 16) * (128 // 64) and counts["vnni_calls"] == 0


def test_the_host_target_offers_tiles_where_the_cpu_has_them():
    for module, flag in ((AMXDotProduct(), AMX_FEATURE), (AMXBF16DotProduct(), AMX_BF16_FEATURE)):
        assert (module.name in resolve_target("host").modules) == (flag in cpu_features())
        assert module.name not in resolve_target("x86-avx512").modules


@pytest.mark.skipif(not HAS_AMX, reason="this CPU has no AMX tiles")
def test_programs_realized_in_helper_processes_are_tensorized_there(tmp_path):
    """The search's helpers replay traces without the tiling that registered the block's intrinsic (one per shape of
    C tiles and steps): the layout rewrite registers what the program names, so no candidate is dropped for it."""
    result = probtune.tune(_matmul(64, 64, 128), "host", 16, database=tmp_path / "t.db", batch_size=8)
    assert result.best is not None and "rewrite-cpu-tensorize" not in result.rejections


def test_a_tile_program_puts_back_the_threads_own_tile_configuration():
    """Each configured region stores the thread's configuration (STTILECFG) before it loads its own, and loads the
    stored one again after."""
    space = generate_space(_matmul(64, 64, 128), SAPPHIRE_RAPIDS)
    sch, _ = space.draw(Rng(0), space.trace.with_decisions({}))
    asm = compile_for(sch.mod, SAPPHIRE_RAPIDS).mod.inspect_source("asm")
    stores, loads = asm.count("sttilecfg"), asm.count("ldtilecfg")
    assert stores >= 1 and loads == 2 * stores


_ALONGSIDE_ONNXRUNTIME = """
import sys
import numpy as np
import onnx
import tvm
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
sys.path[:0] = [{tests!r}, {root!r}]
from test_x86_amx import SAPPHIRE_RAPIDS, _matmul, _operands
from probtune import Rng, generate_space
from probtune.measure.codegen import compile_for
from probtune.model.examples import small_cnn

class Samples(CalibrationDataReader):
    def __init__(self):
        self.left = iter([{{"x": np.random.default_rng(n).standard_normal((1, 3, 16, 16)).astype(np.float32)}} for n in range(4)])

    def get_next(self):
        return next(self.left, None)

onnx.save(small_cnn(channels=24, size=16), {folder!r} + "/cnn.onnx")
quantize_static({folder!r} + "/cnn.onnx", {folder!r} + "/cnn.qdq.onnx", Samples(), quant_format=QuantFormat.QDQ,
                per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
workload = _matmul(56, 64, 128)  # tiles of 14 rows, where onnxruntime's have 16
space = generate_space(workload, SAPPHIRE_RAPIDS)
sch, _ = space.draw(Rng(0), space.trace.with_decisions({{}}))
lib = compile_for(sch.mod, SAPPHIRE_RAPIDS)
tensors = [tvm.runtime.tensor(x) for x in _operands(workload)]
lib["main"](*tensors)  # as a compiled model's check runs: this program, onnxruntime, this program again, ...
import onnxruntime
session = onnxruntime.InferenceSession({folder!r} + "/cnn.qdq.onnx", providers=["CPUExecutionProvider"])
x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
for _ in range(3):
    session.run(None, {{"x": x}})  # configures this thread's tiles for its int8 products
    lib["main"](*tensors)  # loads its own configuration on this thread, then puts the other back
print("both ran")
"""


@pytest.mark.skipif(not HAS_AMX, reason="this CPU has no AMX tiles")
def test_a_tile_program_and_onnxruntimes_int8_products_run_on_one_thread(tmp_path):
    """onnxruntime configures a thread's tiles once and goes on using them: a program that left its own configuration
    (tiles of other rows) loaded made onnxruntime's next product stop on an illegal instruction."""
    here = Path(__file__).resolve().parent
    script = _ALONGSIDE_ONNXRUNTIME.format(tests=str(here), root=str(here.parents[2]), folder=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "both ran" in done.stdout, done.stderr[-2000:]
