"""The GPU half of ``bench/cuda_gpu.py``: measure a round's bundles on this machine, and PyTorch beside them.

``python3 gpu_measure.py ROUND_FOLDER --out DIR`` times the folder's
workloads through PyTorch (cuBLAS, and PyTorch's GELU kernel after it;
cuDNN for a convolution), then
runs each bundle's own script (``run_bundle.py``, probtune-cuda's CuPy runtime launching the cubins),
and packs the results files, the logs and the baselines into
``DIR/ROUND.tar.gz``. It needs Python, numpy, CuPy and PyTorch, not TVM or
probtune.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

ATTEMPT_TIMEOUT = 100  # seconds for one run of a bundle's script; stopped, it resumes and records a crash
ATTEMPTS = 4  # runs of a bundle's script at most: each after a hang or a candidate that broke the CUDA context
REPEAT, MIN_REPEAT_MS, WARMUP = 5, 50.0, 10  # as many calls per repeat as last MIN_REPEAT_MS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "probtune-cuda" / "src" / "probtune_cuda"))
from cupy_runtime import GRAPH_CALLS, GRAPH_MS  # noqa: E402 - the bundles' runtime, as it travels: no TVM, no probtune


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("round", help="a folder of bundles written by cuda_gpu.py prepare")
    parser.add_argument("--out", required=True, help="where the packed results go")
    args = parser.parse_args()
    folder = Path(args.round)
    bundles = sorted(p.parent for p in folder.glob("*/manifest.json"))
    baselines = [_guarded(_baseline, workload) for workload in _workloads(bundles)]
    device = _guarded(_device)
    (folder / "baselines.json").write_text(json.dumps({"device": device, "baselines": baselines}, indent=1))
    for bundle in bundles:
        _measure(bundle)
        _pack(folder, bundles, Path(args.out))  # after each bundle: a run stopped later still brings these back
    return 0


def _measure(bundle: Path) -> None:
    """Run the bundle's script until every candidate has a result: a hang is stopped, a broken context restarted."""
    started = time.perf_counter()
    with (bundle / "run.log").open("a") as log:
        for _ in range(ATTEMPTS):
            try:
                code: Any = subprocess.run([sys.executable, str(bundle / "run_bundle.py"), "--runtime", "cupy"],
                                           stdout=log, stderr=subprocess.STDOUT, timeout=ATTEMPT_TIMEOUT,
                                           check=False).returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
            if code == 0:
                break
    print(f"{bundle.name}: exit {code} in {time.perf_counter() - started:.0f} s", flush=True)


def _pack(folder: Path, bundles: list[Path], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / f"{folder.name}.tar.gz", "w:gz") as tar:
        tar.add(folder / "baselines.json", arcname="baselines.json")
        for bundle in bundles:
            for name in ("results.jsonl", "run.log"):
                if (bundle / name).exists():
                    tar.add(bundle / name, arcname=f"{bundle.name}/{name}")


def _guarded(function: Any, *args: Any) -> Any:
    """``function(*args)``, or what went wrong: a baseline that fails must not take the bundles' results along."""
    try:
        return function(*args)
    except Exception as error:  # noqa: BLE001 - reported in the results
        print(f"{function.__name__}{args}: {type(error).__name__}: {error}", flush=True)
        return {"workload": args[0] if args else None, "error": f"{type(error).__name__}: {error}"}


def _workloads(bundles: list[Path]) -> list[dict[str, Any]]:
    """Each workload the bundles hold, once."""
    seen: dict[str, dict[str, Any]] = {}
    for bundle in bundles:
        workload = json.loads((bundle / "manifest.json").read_text())["workload"]
        seen.setdefault(json.dumps(workload, sort_keys=True), workload)
    return list(seen.values())


def _baseline(workload: dict[str, Any]) -> dict[str, Any]:
    """PyTorch's time for the workload: cuBLAS's matrix product (int8: ``torch._int_mm``; then bias and GELU kernels) or
    cuDNN's convolution."""
    import torch

    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False  # float32 sums, as the workloads'
    dtype = getattr(torch, workload["dtype"])
    name, shape, library = workload["name"], workload["shape"], "cuBLAS"
    if name in ("matmul", "dense"):
        m, n, k = shape
        a = _random(torch, (m, k), dtype)
        b = _random(torch, (k, n), dtype) if name == "matmul" else _random(torch, (n, k), dtype).t()  # W[N, K] as stored

        def call() -> Any:
            return torch._int_mm(a, b) if dtype == torch.int8 else torch.matmul(a, b)  # int8: int32 sums, as the workloads'
    elif name == "dense_bias_gelu":
        m, n, k = shape
        x, w = torch.rand(m, k, dtype=dtype, device="cuda"), torch.rand(n, k, dtype=dtype, device="cuda")
        bias = torch.rand(n, dtype=dtype, device="cuda")

        def call() -> Any:
            return torch.nn.functional.gelu(torch.nn.functional.linear(x, w, bias))
    elif name in ("conv2d_nchw", "conv2d_nhwc"):
        call = _convolution(torch, name, shape, dtype)
        library = "cuDNN"
    else:
        return {"workload": workload, "error": f"no PyTorch baseline for {name}"}
    return {"workload": workload, "system": f"PyTorch {torch.__version__} ({library})", **_time(torch, call)}


def _random(torch: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """Random inputs on the GPU: floats in [0, 1), integers in [0, 4]."""
    if dtype.is_floating_point:
        return torch.rand(*shape, dtype=dtype, device="cuda")
    return torch.randint(0, 5, shape, dtype=dtype, device="cuda")


def _convolution(torch: Any, name: str, shape: list[int], dtype: Any) -> Any:
    """cuDNN's convolution of the workload's shape; for NHWC, images and filters channels last (cuDNN's NHWC kernels)."""
    n, c, h, w, k, r, s, stride, pad = shape
    layout = torch.channels_last if name == "conv2d_nhwc" else torch.contiguous_format
    data = torch.rand(n, c, h, w, dtype=dtype, device="cuda").to(memory_format=layout)
    weight = torch.rand(k, c, r, s, dtype=dtype, device="cuda").to(memory_format=layout)
    torch.backends.cudnn.benchmark = True  # cuDNN picks its fastest algorithm on the first calls (the warm-up)

    def call() -> Any:
        return torch.nn.functional.conv2d(data, weight, stride=stride, padding=pad)

    return call


def _time(torch: Any, call: Any) -> dict[str, list[float]]:
    """Seconds per call, one per repeat, timed with CUDA events: launched from Python one by one (``eager``), and
    replayed from a CUDA graph (``graph``: the GPU's time, as the bundles' candidates are timed)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # cuBLAS sets up its workspace outside the capture
        for _ in range(WARMUP):
            call()
    torch.cuda.current_stream().wait_stream(side)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def elapsed(unit: Any, number: int) -> float:
        start.record()
        for _ in range(number):
            unit()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def repeats(unit: Any, calls: int) -> list[float]:
        number = max(1, int(MIN_REPEAT_MS / 1e3 / elapsed(unit, 1)))
        return [elapsed(unit, number) / number / calls for _ in range(REPEAT)]

    eager = repeats(call, 1)
    calls = max(1, min(GRAPH_CALLS, int(GRAPH_MS / 1e3 / min(eager))))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            call()
    return {"eager": eager, "graph": repeats(graph.replay, calls)}


def _device() -> str:
    import torch

    return str(torch.cuda.get_device_name(0))


if __name__ == "__main__":
    sys.exit(main())
