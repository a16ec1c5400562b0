"""Quantized zoo models: probtune's int8 against onnxruntime's and OpenVINO's on the same int8 file, and against
probtune's own float32 of the same model, all timed in one run.

Each model of bench/zoo_export.py's zoo is quantized by onnxruntime's own
quantizer: a convolutional model statically (QDQ, per-channel int8 weights,
uint8 activations, calibrated on random inputs), a text model dynamically
(MatMulInteger). Both files are then tuned with the same trials, compiled and
checked against onnxruntime by bench/zoo.py's worker, each in its own process;
the engines are timed alone in turns (bench/isolated.py). With ``--also-without
MODULES`` the int8 file is tuned once more with those space modules left out of
the space (``amx-dot-product``: the vector instructions only), and timed in the
same turns. With ``--check-only`` only the int8 file is tuned, compiled and
checked: a sweep of which models run right, nothing timed.

    .venv/bin/python bench/quantized.py --only mobilenet_v2,resnet50 --trials 1000
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from common import geomean, say
from isolated import Engine, time_engines_in_turn
from model_runs import parser, run_models, timings, tune_in_worker

THREADS = 2
CALIBRATION_SAMPLES = 8
STATIC_FAMILIES = ("cnn", "segmentation", "detection-backbone")
"""Families quantized statically (QDQ); the others (text, speech) dynamically, as onnxruntime advises for them."""


def quantize(name: str, entry: dict, zoo: Path, folder: Path) -> tuple[str, Path]:
    """The model quantized by onnxruntime (how, and the file): static QDQ for convolutional families, else dynamic."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    source, target = zoo / entry["file"], folder / f"{name}.int8.onnx"
    if entry.get("family") not in STATIC_FAMILIES:
        quantize_dynamic(source, target, weight_type=QuantType.QInt8)
        return "dynamic (MatMulInteger, int8 weights)", target
    rng = np.random.default_rng(0)
    samples = [{spec["name"]: rng.standard_normal(spec["shape"]).astype(np.float32) for spec in entry["inputs"]}
               for _ in range(CALIBRATION_SAMPLES)]

    class Samples(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = iter(samples)

        def get_next(self) -> dict | None:
            return next(self.left, None)

    quantize_static(source, target, Samples(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return "static QDQ (per-channel int8 weights, uint8 activations, random calibration)", target


def bench_model(name: str, entry: dict, args: argparse.Namespace) -> dict:
    """One model: quantized, both forms tuned, then the five engines timed in turns."""
    result: dict[str, Any] = {"model": name, "family": entry.get("family")}
    with tempfile.TemporaryDirectory(prefix=f"quantized-{name}-") as folder:
        scratch = Path(folder)
        try:
            result["quantization"], int8_path = quantize(name, entry, args.zoo, scratch)
        except Exception as exc:  # noqa: BLE001 - onnxruntime's quantizer refused the model: its row says why
            result["int8"] = {"stage": "quantize", "error": f"onnxruntime's quantizer: {type(exc).__name__}: {exc}"[:500]}
            return result
        fp32_path = args.zoo / entry["file"]
        forms = [("int8", int8_path, "")] + ([] if args.check_only else [("fp32", fp32_path, "")])
        if args.also_without and not args.check_only:
            forms.append(("int8_without", int8_path, args.also_without))
        for form, path, left_out in forms:
            say(f"[{name}] {form}: {args.trials} trials in a fresh process")
            result[form] = tune_in_worker(name, entry, path, args, scratch / form, without_modules=left_out)
            say(f"[{name}] {form}: {result[form].get('check') or result[form].get('error')}")
        if not args.check_only and all(result[form].get("stage") == "done" for form, _, _ in forms):
            result.update(time_engines(entry, int8_path, fp32_path, scratch, args))
    return result


def time_engines(entry: dict, int8_path: Path, fp32_path: Path, scratch: Path, args: argparse.Namespace) -> dict:
    """Each engine alone in its own process, timed in turns; medians and same-round ratios."""
    from probtune.model import load_model

    shapes = {spec["name"]: tuple(spec["shape"]) for spec in entry["inputs"]}
    engines = {
        "onnxruntime_int8": Engine("onnxruntime", int8_path, shapes, THREADS),
        "openvino_int8": Engine("openvino", int8_path, shapes, THREADS),
        "probtune_int8": Engine("tvm", int8_path, shapes, THREADS, scratch / "int8" / "compiled.so"),
        "probtune_fp32": Engine("tvm", fp32_path, shapes, THREADS, scratch / "fp32" / "compiled.so"),
        "onnxruntime_fp32": Engine("onnxruntime", fp32_path, shapes, THREADS),
    }
    if args.also_without:
        engines["probtune_int8_without"] = Engine("tvm", int8_path, shapes, THREADS, scratch / "int8_without" / "compiled.so")
    try:
        rounds = time_engines_in_turn(engines, load_model(fp32_path, shapes).random_inputs(0), args.rounds, args.round_seconds)
    except Exception as exc:  # noqa: BLE001 - the model's row says why it has no timing
        return {"timing_error": f"{type(exc).__name__}: {exc}"[:500]}
    return timings(rounds, "probtune_int8", "int8_speedup")


def table(results: list[dict]) -> str:
    lines = [f"{'model':24} {'int8 ms':>8} {'ort int8':>9} {'ov int8':>8} {'pt fp32':>8}  x ort  x ov  x fp32  check"]
    for r in results:
        ms, speed = r.get("latency_ms", {}), r.get("int8_speedup", {})
        check = r.get("int8", {}).get("check") or str(r.get("int8", {}).get("error") or r.get("timing_error"))
        cells = [ms.get(k) for k in ("probtune_int8", "onnxruntime_int8", "openvino_int8", "probtune_fp32")]
        ratios = [speed.get(k) for k in ("vs_onnxruntime_int8", "vs_openvino_int8", "vs_probtune_fp32")]
        lines.append(f"{r['model']:24} " + " ".join(f"{c:>8}" if c else f"{'-':>8}" for c in cells) + "  "
                     + " ".join(f"{x:5.2f}" if x else "    -" for x in ratios) + f"  {check[-120:]}")
    for key in ("vs_onnxruntime_int8", "vs_openvino_int8", "vs_probtune_fp32", "vs_probtune_int8_without"):
        values = [r["int8_speedup"][key] for r in results if key in r.get("int8_speedup", {})]
        lines.append(f"geomean int8 speedup {key}: {geomean(values)}")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    """Each model's latency per engine, relative to onnxruntime's int8 (lower is faster), as bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = ["probtune_int8", "onnxruntime_int8", "openvino_int8", "probtune_fp32", "onnxruntime_fp32"]
    timed = [r for r in results if "latency_ms" in r]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(engines)
    for i, engine in enumerate(engines):
        values = [r["latency_ms"][engine] / r["latency_ms"]["onnxruntime_int8"] for r in timed]
        ax.bar([x + i * width for x in range(len(timed))], values, width, label=engine.replace("_", " "))
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(timed))], [r["model"] for r in timed])
    ax.set_ylabel("latency / onnxruntime int8 (lower is faster)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    command = parser(__doc__, "quantized.json")
    command.add_argument("--plot-only", action="store_true", help="redraw the plot of --out's results, tuning nothing")
    command.add_argument("--also-without", default="", metavar="MODULES",
                         help="also tune the int8 file without these comma-separated space modules, timed alongside")
    args = command.parse_args()
    if args.plot_only:
        plot(json.loads(args.out.read_text())["models"], args.out.with_suffix(".png"))
        return
    results = run_models(args, bench_model)
    plot(results, args.out.with_suffix(".png"))
    print(table(results))


if __name__ == "__main__":
    main()
