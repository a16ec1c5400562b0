"""Hopper's ``wgmma`` checked on the GPU: probtune_cuda.wgmma's float16 matmul kernel built here, run there.

    .venv/bin/python bench/gpu_wgmma.py write .gpu/wgmma     # here: cubins, launch tables, inputs, expected outputs
    python3 bench/gpu_wgmma.py run .gpu/wgmma --out DIR      # on the GPU machine (numpy, CuPy): check and time them

The cases isolate the kernel's layouts: with A the identity the output is B
transposed, which tests B's descriptor and the accumulator's fragment map; with
B the identity, A's; then random operands, small and large. The large one is
also timed against cuBLAS (CuPy's matmul) on the same operands. ``run`` needs
no TVM and no probtune: it launches the cubins through the bundles' CuPy
runtime, as a bundle's own script does.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

RUNTIME = Path(__file__).resolve().parents[1] / "plugins" / "probtune-cuda" / "src" / "probtune_cuda" / "cupy_runtime.py"
CASES = {  # name: (m, n, k, A, B)
    "identity_a": (64, 64, 64, "identity", "random"),
    "identity_b": (64, 64, 64, "random", "identity"),
    "random_small": (128, 64, 32, "random", "random"),
    "random_large": (2048, 2048, 2048, "random", "random"),
}
TIMED = "random_large"
RTOL = 1e-2  # of the output's largest magnitude: float16 operands, float32 sums in another order


def operand(kind: str, rows: int, depth: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "identity":
        return np.eye(rows, depth, dtype=np.float16)
    return rng.uniform(-1, 1, (rows, depth)).astype(np.float16)


def write(folder: Path) -> None:
    """The cases' cubins and launch tables (``<case>.json``), operands and expected outputs (``<case>.npz``)."""
    from probtune_cuda.codegen import NVRTCCompiler
    from probtune_cuda.cupy_runtime import KIND
    from probtune_cuda.wgmma import wgmma_matmul, wgmma_tvm_target

    folder.mkdir(parents=True, exist_ok=True)
    target = wgmma_tvm_target()
    rng = np.random.default_rng(0)
    for name, (m, n, k, a_kind, b_kind) in CASES.items():
        code = NVRTCCompiler().device_code(wgmma_matmul(m, n, k), target)
        (folder / f"{name}.{KIND}").write_bytes(code.code)
        (folder / f"{name}.json").write_text(json.dumps({**code.table, KIND: f"{name}.{KIND}"}))
        a, b = operand(a_kind, m, k, rng), operand(b_kind, n, k, rng)
        np.savez(folder / f"{name}.npz", a=a, b=b, c=a.astype(np.float32) @ b.astype(np.float32).T)
    shutil.copy(RUNTIME, folder / RUNTIME.name)
    shutil.copy(__file__, folder / Path(__file__).name)
    print(f"wrote {len(CASES)} cases to {folder}")


def _runtime(folder: Path) -> Any:
    spec = importlib.util.spec_from_file_location("cupy_runtime", folder / RUNTIME.name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(folder: Path, out: Path) -> int:
    """Each case checked against its expected output; the large one timed beside cuBLAS. Exit 1 if any is wrong."""
    import cupy

    runtime = _runtime(folder)
    task = SimpleNamespace(repeat=5, min_repeat_ms=50.0)
    results: dict[str, Any] = {"device": runtime.device_name(), "cases": {}}
    for name in CASES:
        table = json.loads((folder / f"{name}.json").read_text())
        data = np.load(folder / f"{name}.npz")
        row: dict[str, Any] = {}
        try:
            call, (output,) = runtime.candidate_program(cupy, folder, table, [data["a"], data["b"]], [data["c"]])
            call()
            cupy.cuda.Device().synchronize()
            error = float(np.abs(cupy.asnumpy(output) - data["c"]).max() / max(np.abs(data["c"]).max(), 1e-6))
            row.update(correct=error <= RTOL, max_error_of_largest=error)
        except Exception as exc:  # noqa: BLE001 - the case's row says what failed; the others still run
            row.update(correct=False, error=f"{type(exc).__name__}: {exc}"[:500])
        if name == TIMED and "error" not in row:
            try:
                row.update(_timings(cupy, runtime, call, data, task))
            except Exception as exc:  # noqa: BLE001 - a timing that fails leaves the check standing
                row["timing_error"] = f"{type(exc).__name__}: {exc}"[:500]
        results["cases"][name] = row
        print(name, row, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_wgmma.json").write_text(json.dumps(results, indent=1))
    return 0 if all(row.get("correct") for row in results["cases"].values()) else 1


def _timings(cupy: Any, runtime: Any, call: Any, data: Any, task: Any) -> dict[str, Any]:
    """The kernel's and cuBLAS's seconds per call on the same operands, and the kernel's TFLOPs."""
    a, b = cupy.asarray(data["a"]), cupy.asarray(data["b"])
    describe = lambda exc: f"{type(exc).__name__}: {exc}"  # noqa: E731 - the runtime's error describer
    mine = runtime.candidate_timings(cupy, call, task, describe)
    cublas = runtime.candidate_timings(cupy, lambda: cupy.matmul(a, b.T), task, describe)
    flops = 2.0 * a.shape[0] * b.shape[0] * a.shape[1]
    return {"seconds": mine, "cublas_seconds": cublas, "tflops": flops / float(np.median(mine)) / 1e12,
            "cublas_over_wgmma": float(np.median(mine) / np.median(cublas))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("write", "run"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path, default=Path("."), help="run: where gpu_wgmma.json goes")
    args = parser.parse_args()
    started = time.time()
    if args.command == "write":
        write(args.folder)
        return 0
    status = run(args.folder, args.out)
    print(f"{time.time() - started:.1f} s", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
