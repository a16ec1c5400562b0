"""bf16 on the CPU: probtune's bf16 of a float32 zoo model against its own fp32 and against OpenVINO's bf16 and f32
inference precision hints, all timed in one run.

Each model is tuned twice with the same trials (``precision`` fp32 and bf16,
each in a fresh process by bench/zoo.py's worker, compiled and checked against
onnxruntime's float32 with the precision's tolerance); then the engines are
timed alone in turns (bench/isolated.py). Besides the models' latencies, the
tuned tasks are compared: the estimated time of the convolution and matrix
product tasks (weight x best latency) in fp32 against bf16, and what the bf16
model spends on casting activations to bf16. With ``--check-only`` only the
bf16 form is tuned, compiled and checked, nothing timed. Needs a CPU with
AVX512-BF16.

    .venv/bin/python bench/bf16.py --only mobilenet_v2,resnet50,bert_base --trials 300
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path
from typing import Any

from common import geomean, say
from isolated import Engine, median_ratio, time_engines_in_turn
from model_runs import parser, run_models, timings, tune_in_worker

THREADS = 2
PRODUCT = re.compile(r"conv|matmul|dense")
"""Task names of convolutions and matrix products (the operator a fused task is named after comes first)."""
CAST = re.compile(r"^(fused_)?cast\d*(_|$)")
"""Task names of a standalone cast (bf16's casts of activations that no producer could take as its epilogue)."""


def task_times(result: dict) -> dict[str, float]:
    """Estimated seconds of the product tasks, the standalone casts and all tasks (weight x best latency), of the
    tasks tuned (``untuned``: how many got no trial and run a default program, left out of the sums)."""
    rows = [row for row in result.get("task_rows", []) if row["best_latency"] is not None]

    def total(keep: Any) -> float:
        return sum(row["weight"] * row["best_latency"] for row in rows if keep(row["name"]))

    untuned = len(result.get("task_rows", [])) - len(rows)
    return {"products": total(PRODUCT.search), "casts": total(CAST.search), "all": total(lambda _: True),
            "untuned": untuned}


def bench_model(name: str, entry: dict, args: argparse.Namespace) -> dict:
    """One model: both precisions tuned, then the engines timed in turns."""
    result: dict[str, Any] = {"model": name, "family": entry.get("family")}
    path = args.zoo / entry["file"]
    with tempfile.TemporaryDirectory(prefix=f"bf16-{name}-") as folder:
        scratch = Path(folder)
        for precision in ("bf16",) if args.check_only else ("bf16", "fp32"):
            say(f"[{name}] {precision}: {args.trials} trials in a fresh process")
            result[precision] = tune_in_worker(name, entry, path, args, scratch / precision, precision)
            say(f"[{name}] {precision}: {result[precision].get('check') or result[precision].get('error')}")
        if not args.check_only and all(result[p].get("stage") == "done" for p in ("bf16", "fp32")):
            times = {p: task_times(result[p]) for p in ("bf16", "fp32")}
            result["task_seconds"] = times
            if times["bf16"]["products"] and times["fp32"]["products"]:
                result["product_tasks_speedup"] = round(times["fp32"]["products"] / times["bf16"]["products"], 3)
            result.update(time_engines(entry, path, scratch, args))
    return result


def time_engines(entry: dict, path: Path, scratch: Path, args: argparse.Namespace) -> dict:
    """Each engine alone in its own process, timed in turns; medians and same-round ratios."""
    from probtune.model import load_model

    shapes = {spec["name"]: tuple(spec["shape"]) for spec in entry["inputs"]}
    engines = {
        "probtune_bf16": Engine("tvm", path, shapes, THREADS, scratch / "bf16" / "compiled.so"),
        "probtune_fp32": Engine("tvm", path, shapes, THREADS, scratch / "fp32" / "compiled.so"),
        "openvino_bf16": Engine("openvino", path, shapes, THREADS, precision="bf16"),
        "openvino_f32": Engine("openvino", path, shapes, THREADS),
        "onnxruntime_fp32": Engine("onnxruntime", path, shapes, THREADS),
    }
    try:
        rounds = time_engines_in_turn(engines, load_model(path, shapes).random_inputs(0), args.rounds, args.round_seconds)
    except Exception as exc:  # noqa: BLE001 - the model's row says why it has no timing
        return {"timing_error": f"{type(exc).__name__}: {exc}"[:500]}
    return {**timings(rounds, "probtune_bf16", "bf16_speedup"),
            "openvino_bf16_vs_f32": round(median_ratio(rounds["openvino_f32"], rounds["openvino_bf16"]), 3)}


def table(results: list[dict]) -> str:
    keys = ("probtune_bf16", "probtune_fp32", "openvino_bf16", "openvino_f32", "onnxruntime_fp32")
    ratios = ("vs_probtune_fp32", "vs_openvino_bf16", "vs_onnxruntime_fp32")
    lines = [f"{'model':16} {'pt bf16':>8} {'pt fp32':>8} {'ov bf16':>8} {'ov f32':>8} {'ort f32':>8}  x fp32  x ov  x ort"
             "  tasks x  check"]
    for r in results:
        ms, speed = r.get("latency_ms", {}), r.get("bf16_speedup", {})
        check = r.get("bf16", {}).get("check") or str(r.get("bf16", {}).get("error") or r.get("timing_error"))
        tasks = r.get("product_tasks_speedup")
        lines.append(f"{r['model']:16} " + " ".join(f"{ms[k]:>8}" if k in ms else f"{'-':>8}" for k in keys) + "  "
                     + " ".join(f"{speed[k]:5.2f}" if k in speed else "    -" for k in ratios)
                     + (f"  {tasks:6.2f}" if tasks else "       -") + f"  {check[-110:]}")
    for key in ratios:
        lines.append(f"geomean bf16 speedup {key}: {geomean([r['bf16_speedup'][key] for r in results if 'bf16_speedup' in r])}")
    return "\n".join(lines)


def main() -> None:
    print(table(run_models(parser(__doc__, "bf16.json").parse_args(), bench_model)))


if __name__ == "__main__":
    main()
