"""Winograd against direct convolution, one 3x3 layer at a time: where does the winograd-conv2d rewrite pay?

    python bench/winograd_layers.py [--layers 64x64@56,16x64@55] [--trials 128] [--out F.json]

Each layer (input channels x output channels @ feature-map size) is a small
ONNX model, a stride-1 3x3 convolution with bias and ReLU, tuned twice with
the same trial budget and seed: with the target's other graph rewrites and
``winograd-conv2d`` forced on (its limits lifted, so a layer its rule keeps
direct is timed in the Winograd form too), and with them alone. The table
says which layers the rule itself would rewrite. Both compiled models are checked against
onnxruntime, then timed in turn, each in its own process; the ratio is
direct / Winograd (above 1: the rewrite pays). Timed alone and in turn, a
layer runs with its kernel and tensors in cache; within a model they are
not, so the table also gives the ratio of the tuner's estimates, which are
measured with the caches flushed. The default layers are the 3x3
shapes of common architectures (residual networks' stages, squeeze-and-expand
modules, plain stacks), not any model's in particular.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
from common import cpu_model, say
from isolated import Engine, Worker, median_ratio, time_in_turn

THREADS = 2
RESULTS = Path(__file__).parent / "results"
WINOGRAD = "winograd-conv2d"
LAYERS = ("64x64@56", "128x128@28", "256x256@14", "512x512@7", "16x64@56", "32x128@28", "48x192@14", "64x256@14",
          "32x32@112", "128x128@56")


def parse_layer(text: str) -> tuple[int, int, int]:
    channels, size = text.split("@")
    cin, cout = channels.split("x")
    return int(cin), int(cout), int(size)


def conv_model(cin: int, cout: int, size: int, path: Path) -> dict[str, tuple[int, ...]]:
    """A one-convolution ONNX model (3x3, padding 1, bias, ReLU) with seeded random weights; its input shapes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(9 * cin)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
         helper.make_node("Relu", ["c"], ["y"])],
        "conv3x3",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, size, size])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return {"x": (1, cin, size, size)}


def tune_form(model_path: Path, shapes: dict, rewrites: list, args: argparse.Namespace, folder: Path) -> dict:
    """Tune, compile, check and export one form of the layer; its tasks, rewrites and check."""
    import probtune

    model = probtune.load_model(model_path, shapes)
    tuned = probtune.tune_model(model, "host", args.trials, database=folder / "tuning.db", seed=0,
                                graph_rewrites=rewrites)
    compiled = tuned.compile()
    compiled.export_library(folder / "compiled.so")
    return {"tasks": len(tuned.tasks), "rewrites": dict(tuned.graph_rewrites), "check": str(compiled.check),
            "estimated_ms": None if tuned.estimated_latency is None else round(tuned.estimated_latency * 1e3, 4)}


def rule_rewrites(model_path: Path, shapes: dict) -> bool:
    """Whether the registered rewrite, with its rule, takes the layer's convolution."""
    import probtune
    from probtune.model import fuse
    from probtune.model.rewrites import rewrite_counts
    from probtune.targets import resolve_target

    fused = fuse(probtune.load_model(model_path, shapes), resolve_target("host"), [WINOGRAD])
    return bool(rewrite_counts(fused).get(WINOGRAD))


def bench_layer(layer: str, args: argparse.Namespace) -> dict:
    """One layer: both forms tuned, then timed in turn."""
    from probtune.targets import resolve_target
    from probtune_cpu.winograd import WinogradConv2D

    cin, cout, size = parse_layer(layer)
    others = [name for name in resolve_target("host").graph_rewrites if name != WINOGRAD]
    forced = WinogradConv2D(max_work_ratio=1.0, min_channel_mean=0)
    forms = {"winograd": [*others, forced], "direct": others}
    result: dict = {"layer": layer, "cin": cin, "cout": cout, "size": size}
    with tempfile.TemporaryDirectory(prefix="winograd-layer-") as scratch:
        folder = Path(scratch)
        shapes = conv_model(cin, cout, size, folder / "layer.onnx")
        result["rule_rewrites"] = rule_rewrites(folder / "layer.onnx", shapes)
        for form, names in forms.items():
            (folder / form).mkdir()
            result[form] = tune_form(folder / "layer.onnx", shapes, names, args, folder / form)
        workers = {form: Worker(Engine("tvm", folder / "layer.onnx", shapes, THREADS, folder / form / "compiled.so"))
                   for form in forms}
        try:
            inputs = [np.random.default_rng(1).standard_normal(shapes["x"]).astype(np.float32)]
            rounds = time_in_turn(workers, inputs, args.rounds, args.round_seconds)
        finally:
            for worker in workers.values():
                worker.close()
    result["latency_ms"] = {k: round(float(np.median(v)) * 1e3, 4) for k, v in rounds.items()}
    result["latency_ms_per_round"] = {k: [round(t * 1e3, 4) for t in v] for k, v in rounds.items()}
    result["direct_over_winograd"] = round(median_ratio(rounds["direct"], rounds["winograd"]), 3)
    if not result["winograd"]["rewrites"].get(WINOGRAD):
        result["note"] = "not a convolution the Winograd form applies to (too few tiles)"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default=",".join(LAYERS), help="comma-separated CINxCOUT@SIZE")
    parser.add_argument("--trials", type=int, default=128, help="per form of each layer")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--round-seconds", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=RESULTS / "winograd_layers.json")
    args = parser.parse_args()
    results = []
    for layer in args.layers.split(","):
        say(f"[{layer}] both forms, {args.trials} trials each")
        results.append(bench_layer(layer, args))
        say(f"[{layer}] direct {results[-1]['latency_ms']['direct']} ms, Winograd {results[-1]['latency_ms']['winograd']}"
            f" ms: {results[-1]['direct_over_winograd']}x")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": cpu_model(), "trials": args.trials, "layers": results}, indent=1))
    print("| layer | rule rewrites | direct ms | Winograd ms | direct / Winograd | the same, from the tuner's cold-cache "
          "estimates |")
    print("|---|---|---|---|---|---|")
    for row in results:
        direct, winograd = row["direct"]["estimated_ms"], row["winograd"]["estimated_ms"]
        cold = round(direct / winograd, 3) if direct and winograd else None
        print(f"| {row['layer']} | {row['rule_rewrites']} | {row['latency_ms']['direct']} | {row['latency_ms']['winograd']} | "
              f"{row['direct_over_winograd']} | {cold} |")


if __name__ == "__main__":
    main()
