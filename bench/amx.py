"""AMX tile products against the vector dot products, per operator: int8 (``tdpbusd`` against ``vpdpbusd``) and bf16
(``tdpbf16ps`` against ``vdpbf16ps``) matrix products of BERT-base's shapes at 128 tokens, or with ``--convolutions``
NHWC convolutions of ResNet-50's shapes at batch 1, each tuned twice with the same trials on the ``host`` target (its
whole space, and the space without the AMX tilings), checked against the plain program, then timed in turns in one
process. The weight is a constant, as in a model: tuning times each program with its blocked copy made beforehand, and
so does the final timing. With ``--stem``, ResNet-50's stem (3 channels padded to 4) against its form folded by
``fold-window-columns`` (a 7x1 convolution over 32 or 64 channels), both in the whole space. Needs a CPU with AMX
(``amx_int8``, ``amx_bf16`` in /proc/cpuinfo).

    .venv/bin/python bench/amx.py --trials 64
    .venv/bin/python bench/amx.py --trials 64 --convolutions --out bench/results/amx_convolutions.json
    .venv/bin/python bench/amx.py --trials 64 --other-convolutions --only bf16 --out bench/results/amx_other.json
    .venv/bin/python bench/amx.py --trials 64 --stem --out bench/results/amx_stem.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import tvm
from common import say
from tvm import te, topi

import probtune
from probtune.measure.codegen import compile_for
from probtune.measure.constant_layouts import LAYOUT_FREE_ATTR, read_constants_packed
from probtune.targets import resolve_target
from probtune.workloads.workload import Workload
from probtune_cpu.host_cpu import cpu_features, cpu_model

SHAPES = ((128, 768, 768), (128, 3072, 768), (128, 768, 3072))
"""(tokens, outputs, depth) of BERT-base's products: the projections, the first and the second feed-forward layer."""
CONVOLUTIONS = ((56, 64, 64, 3, 1), (28, 128, 128, 3, 1), (14, 256, 256, 3, 1), (56, 256, 64, 1, 1), (28, 512, 128, 1, 1),
                (14, 1024, 256, 1, 1))
"""(input width, input channels, output channels, kernel, stride) of ResNet-50's stride-1 convolutions, one of each
size per stage."""
OTHER_CONVOLUTIONS = ((7, 512, 512, 3, 1), (7, 2048, 512, 1, 1), (7, 512, 2048, 1, 1), (56, 128, 128, 3, 2),
                      (28, 256, 256, 3, 2), (56, 256, 512, 1, 2), (28, 512, 1024, 1, 2))
"""ResNet-50's other convolutions but the stem: its last stage's, of 7-pixel rows, and its stride-2 ones."""
TILINGS = ("amx-dot-product", "amx-bf16-dot-product")


def product(m: int, n: int, k: int, bf16: bool) -> tuple[Workload, int]:
    """``A @ B^T`` (a dense layer's weights [n, k]) in u8 x s8 -> int32 or bf16 x bf16 -> float32; its operations."""
    a = te.placeholder((m, k), "bfloat16" if bf16 else "uint8", name="A")
    b = te.placeholder((n, k), "bfloat16" if bf16 else "int8", name="B")
    acc = "float32" if bf16 else "int32"
    r = te.reduce_axis((0, k), "r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r].astype(acc) * b[j, r].astype(acc), axis=r), name="C")
    func = te.create_prim_func([a, b, c]).with_attr(LAYOUT_FREE_ATTR, [1])  # a model's weight, packed once
    return Workload.from_module(func, name=f"{'bf16' if bf16 else 'int8'}_dense_{m}_{n}_{k}"), 2 * m * n * k


def convolution(width: int, channels: int, filters: int, kernel: int, stride: int, bf16: bool) -> tuple[Workload, int]:
    """An NHWC convolution (weights [kernel, kernel, channels, filters]) padded by half its kernel."""
    x = te.placeholder((1, width, width, channels), "bfloat16" if bf16 else "uint8", name="X")
    w = te.placeholder((kernel, kernel, channels, filters), "bfloat16" if bf16 else "int8", name="W")
    y = topi.nn.conv2d_nhwc(x, w, stride, kernel // 2, 1, out_dtype="float32" if bf16 else "int32")
    func = te.create_prim_func([x, w, y]).with_attr(LAYOUT_FREE_ATTR, [1])
    name = f"{'bf16' if bf16 else 'int8'}_conv{kernel}x{kernel}_{width}_{channels}_{filters}" + (f"_s{stride}" if stride > 1 else "")
    out = (width + 2 * (kernel // 2) - kernel) // stride + 1
    return Workload.from_module(func, name=name), 2 * out * out * filters * channels * kernel * kernel


def operands(workload: Workload) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    (a_shape, a_dtype), (b_shape, _), (out_shape, out_dtype) = workload.param_specs()
    if a_dtype == "bfloat16":
        return [rng.standard_normal(a_shape).astype(ml_dtypes.bfloat16),
                rng.standard_normal(b_shape).astype(ml_dtypes.bfloat16), np.zeros(out_shape, out_dtype)]
    return [rng.integers(0, 256, a_shape).astype("uint8"), rng.integers(-128, 128, b_shape).astype("int8"),
            np.zeros(out_shape, out_dtype)]


def run(lib, arrays: list[np.ndarray]) -> np.ndarray:
    tensors = [tvm.runtime.tensor(x, tvm.cpu()) for x in arrays]
    lib["main"](*tensors)
    return tensors[2].numpy()


def check(got: np.ndarray, want: np.ndarray) -> str:
    if got.dtype == np.int32:
        return "exact" if np.array_equal(got, want) else f"DIFFERS in {int((got != want).sum())} elements"
    error = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    return f"max error {error:.2e} of the largest output" + ("" if error < 1e-4 else " (TOO LARGE)")


def weight_packed(program: tvm.IRModule, arrays: list[np.ndarray]) -> tuple[object, list[np.ndarray]]:
    """The program compiled to read the weight in the layout it copies it into, and the inputs with the weight so
    laid out: as a compiled model runs it, its weights packed once."""
    program, layouts = read_constants_packed(program, {1})
    weight = layouts[1].map_tensor(tvm.runtime.tensor(arrays[1])).numpy() if 1 in layouts else arrays[1]
    return compile_for(program, resolve_target("host")), [arrays[0], weight, arrays[2]]


def tuned(workload: Workload, modules: list[str], arrays: list[np.ndarray], want: np.ndarray, args: argparse.Namespace,
          row: dict, name: str) -> tuple[object, list[np.ndarray]]:
    """``workload`` tuned on the ``host`` target with ``modules``, its best program checked against ``want``; the
    compiled program and its inputs (weight packed), with the tuning time, check and use of tiles in ``row``."""
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        result = probtune.tune(workload, "host", args.trials, database=Path(scratch) / "bench.db", seed=args.seed,
                               modules=modules)
        row[f"{name}_tuning_seconds"] = round(time.perf_counter() - started, 1)
    lib, inputs = weight_packed(result.schedule(), arrays)
    row[f"{name}_check"] = check(run(lib, inputs), want)
    row[f"{name}_tile_products"] = "tdp" in lib.mod.inspect_source("asm")
    say(f"{workload.name} {name}: {row[f'{name}_check']}")
    return lib, inputs


def timed_in_turns(libs: dict[str, tuple[object, list[np.ndarray]]], operations: int, args: argparse.Namespace) -> dict:
    """The programs timed in turns, so that a slow spell of the machine touches all: median milliseconds and GOPS."""
    dev = tvm.cpu()
    rounds: dict[str, list[float]] = {name: [] for name in libs}
    for _ in range(args.rounds):
        for name, (lib, inputs) in libs.items():
            tensors = [tvm.runtime.tensor(x, dev) for x in inputs]
            rounds[name].append(float(np.median(lib.mod.time_evaluator("main", dev, number=10, repeat=3)(*tensors).results)))
    return {"rounds": rounds,
            "ms": {name: round(float(np.median(times)) * 1e3, 4) for name, times in rounds.items()},
            "gops": {name: round(operations / float(np.median(times)) / 1e9, 1) for name, times in rounds.items()}}


def speedup(rounds: dict[str, list[float]], slow: str, fast: str) -> dict:
    """The median and range of the same-round ratios of ``slow``'s time to ``fast``'s."""
    ratios = sorted(s / f for s, f in zip(rounds[slow], rounds[fast]))
    return {"median": round(float(np.median(ratios)), 3), "range": [round(ratios[0], 3), round(ratios[-1], 3)]}


def bench_shape(workload: Workload, operations: int, args: argparse.Namespace) -> dict:
    """Both spaces tuned with the same trials, each best program checked, then the two timed in turns."""
    host = resolve_target("host")
    spaces = {"amx": list(host.modules), "vector": [m for m in host.modules if m not in TILINGS]}
    arrays = operands(workload)
    want = run(compile_for(workload.mod, resolve_target("llvm")), arrays)
    row: dict = {"workload": workload.name}
    libs = {name: tuned(workload, modules, arrays, want, args, row, name) for name, modules in spaces.items()}
    timing = timed_in_turns(libs, operations, args)
    ratio = speedup(timing.pop("rounds"), "vector", "amx")
    row.update({**timing, "amx_speedup_median": ratio["median"], "amx_speedup_range": ratio["range"]})
    say(f"{workload.name}: AMX {row['amx_speedup_median']}x the vector instructions' speed ({row['gops']})")
    return row


def folded_stem(bf16: bool) -> tuple[Workload, int]:
    """ResNet-50's stem as ``fold-window-columns`` computes it: a 7x1 convolution, stride (2, 1), over its input's
    rows of 7 pixels' 4 channels side by side, padded to a tile's terms (32 bfloat16, 64 bytes)."""
    terms = 32 if bf16 else 64
    x = te.placeholder((1, 224, 112, terms), "bfloat16" if bf16 else "uint8", name="X")
    w = te.placeholder((7, 1, terms, 64), "bfloat16" if bf16 else "int8", name="W")
    y = topi.nn.conv2d_nhwc(x, w, (2, 1), (3, 0, 3, 0), 1, out_dtype="float32" if bf16 else "int32")
    func = te.create_prim_func([x, w, y]).with_attr(LAYOUT_FREE_ATTR, [1])
    return Workload.from_module(func, name=f"{'bf16' if bf16 else 'int8'}_stem_folded"), 2 * 112 * 112 * 64 * 7 * 7 * 4


def bench_stem(bf16: bool, args: argparse.Namespace) -> dict:
    """ResNet-50's stem (7x7, stride 2, 3 channels padded to 4) and its folded form, each tuned in the whole host space
    with the same trials, checked against its plain program, then timed in turns. The folded form's timing leaves
    out the copy that lays its input out (in a model, the input's own task writes it)."""
    plain, operations = convolution(224, 4, 64, 7, 2, bf16)
    folded, _ = folded_stem(bf16)
    host = list(resolve_target("host").modules)
    row: dict = {"workload": plain.name}
    libs = {}
    for name, workload in (("plain", plain), ("folded", folded)):
        arrays = operands(workload)
        want = run(compile_for(workload.mod, resolve_target("llvm")), arrays)
        libs[name] = tuned(workload, host, arrays, want, args, row, name)
    timing = timed_in_turns(libs, operations, args)
    ratio = speedup(timing.pop("rounds"), "plain", "folded")
    row.update({**timing, "folded_speedup_median": ratio["median"], "folded_speedup_range": ratio["range"]})
    say(f"{plain.name}: folded {row['folded_speedup_median']}x the plain stem's speed ({row['gops']})")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--convolutions", action="store_true", help="ResNet-50's convolutions instead of BERT's products")
    parser.add_argument("--other-convolutions", action="store_true",
                        help="ResNet-50's 7-pixel and stride-2 convolutions instead of BERT's products")
    parser.add_argument("--stem", action="store_true",
                        help="ResNet-50's stem against its form folded by fold-window-columns, in the whole space")
    parser.add_argument("--only", choices=("int8", "bf16"), help="one of the two types")
    parser.add_argument("--out", type=Path, default=Path("bench/results/amx.json"))
    args = parser.parse_args()
    if not {"amx_int8", "amx_bf16"} <= cpu_features():
        raise SystemExit(f"this CPU ({cpu_model()}) has no AMX int8 and bf16 tiles; run this on one that has")
    types = [bf16 for bf16 in (False, True) if args.only in (None, "bf16" if bf16 else "int8")]
    if args.stem:
        rows = [bench_stem(bf16, args) for bf16 in types]
    elif args.convolutions or args.other_convolutions:
        shapes = OTHER_CONVOLUTIONS if args.other_convolutions else CONVOLUTIONS
        rows = [bench_shape(*convolution(*shape, bf16), args) for bf16 in types for shape in shapes]
    else:
        rows = [bench_shape(*product(*shape, bf16), args) for bf16 in types for shape in SHAPES]
    report = {"machine": cpu_model(), "cores": os.cpu_count(), "trials": args.trials, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
