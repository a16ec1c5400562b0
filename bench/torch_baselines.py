"""PyTorch's own times for the architectures probtune compiles, in float16 on a GPU.

``python3 bench/torch_baselines.py --models resnet50:1,resnet50:16,bert_base:1 --modes eager,graph,compile --out OUT.json``
builds each model offline with random weights (torchvision's ResNet-50, transformers' BERT-base) and times it as
PyTorch runs it: plain calls (``eager``), the eager model replayed from a CUDA graph (``graph``), and
``torch.compile`` with ``max-autotune`` (``compile``) or its default mode (``compile-default``). Run beside
probtune's compiled models, it gives them a baseline measured in the same run on the same GPU; other scripts
import ``run``. It needs PyTorch, torchvision and transformers, not probtune or TVM.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

MODES = ("eager", "graph", "compile", "compile-default")
MODELS = ("resnet50", "bert_base")
SEQUENCE = 128  # BERT's tokens per sequence
WARMUP = 3  # calls before timing, after the first
REPEAT_MS = 20.0  # each repeat times as many back-to-back calls as last about this long
PROBE_CALLS = 3  # calls timed to choose the calls per repeat

Report = dict[str, Any]


def run(specs: list[tuple[str, int]], modes: list[str], repeats: int = 10, seed: int = 0,
        on_result: Callable[[Report], None] | None = None) -> Report:
    """Time each (model, batch) of ``specs`` in each of ``modes``; a mode that fails is recorded with its error.

    Returns ``{"device", "torch", "cudnn_benchmark", "repeats", "seed", "results"}``; ``on_result`` is given that
    report, as it stands, after each result."""
    import torch

    _check(specs, modes)
    torch.backends.cudnn.benchmark = True
    report: Report = {"device": str(torch.cuda.get_device_name(0)), "torch": str(torch.__version__), "cudnn_benchmark": True,
                      "repeats": repeats, "seed": seed, "results": []}
    for name, batch in specs:
        for result in _run_model(torch, name, batch, modes, repeats, seed):
            report["results"].append(result)
            print(_line(result), flush=True)
            if on_result is not None:
                on_result(report)
    return report


def _check(specs: list[tuple[str, int]], modes: list[str]) -> None:
    """Refuse unknown models, modes and batch sizes before anything runs."""
    for name, batch in specs:
        if name not in MODELS or batch < 1:
            raise ValueError(f"unknown model or batch {name}:{batch} (models: {', '.join(MODELS)})")
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode} (modes: {', '.join(MODES)})")


def _run_model(torch: Any, name: str, batch: int, modes: list[str], repeats: int, seed: int) -> Iterator[Report]:
    """One result per mode for the model at this batch size, the model freed after."""
    head = {"model": name, "batch": batch}
    try:
        torch.manual_seed(seed)
        model, inputs = _build(torch, name, batch)
    except Exception as error:  # noqa: BLE001 - recorded in the results
        _free(torch)
        for mode in modes:
            yield {**head, "mode": mode, "error": _message(error)}
        return
    for mode in modes:
        yield _guarded(torch, model, inputs, mode, repeats, head)
    del model, inputs
    _free(torch)


def _build(torch: Any, name: str, batch: int) -> tuple[Any, tuple[Any, ...]]:
    """The model in eval mode, float16 on the GPU, and its random inputs."""
    if name == "resnet50":
        import torchvision

        model = torchvision.models.resnet50(weights=None)
        inputs: tuple[Any, ...] = (torch.randn(batch, 3, 224, 224, dtype=torch.float16, device="cuda"),)
    else:
        from transformers import BertConfig, BertModel

        config = BertConfig()
        model = BertModel(config)
        inputs = (torch.randint(0, config.vocab_size, (batch, SEQUENCE), dtype=torch.int64, device="cuda"),)
    return model.eval().half().cuda(), inputs


def _guarded(torch: Any, model: Any, inputs: tuple[Any, ...], mode: str, repeats: int, head: Report) -> Report:
    """The mode's timings, or its error; what it compiled or captured freed either way."""
    try:
        with torch.inference_mode():
            return {**head, "mode": mode, **_measure(torch, model, inputs, mode, repeats)}
    except Exception as error:  # noqa: BLE001 - recorded in the results
        return {**head, "mode": mode, "error": _message(error)}
    finally:
        _free(torch)


def _measure(torch: Any, model: Any, inputs: tuple[Any, ...], mode: str, repeats: int) -> Report:
    """Per-call milliseconds over ``repeats`` repeats; ``setup_s`` runs from preparing the mode to its first call's end
    (for ``compile`` modes, the compile time)."""
    started = time.perf_counter()
    call = _prepare(torch, model, inputs, mode)
    output = _describe(call())
    torch.cuda.synchronize()
    setup = time.perf_counter() - started
    for _ in range(WARMUP):
        call()
    calls = _calls_per_repeat(torch, call)
    times = [_elapsed_ms(torch, call, calls) / calls for _ in range(repeats)]
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "repeats_ms": times,
            "calls_per_repeat": calls, "setup_s": setup, "output": output}


def _prepare(torch: Any, model: Any, inputs: tuple[Any, ...], mode: str) -> Callable[[], Any]:
    """A call of the model on its inputs, as the mode runs it."""
    if mode == "graph":
        return _graphed(torch, model, inputs)
    if mode == "compile":
        model = torch.compile(model, mode="max-autotune")
    elif mode == "compile-default":
        model = torch.compile(model)

    def call() -> Any:
        return model(*inputs)

    return call


def _graphed(torch: Any, model: Any, inputs: tuple[Any, ...]) -> Callable[[], Any]:
    """The eager model captured in a CUDA graph after warming up on a side stream; the call replays it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            model(*inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = model(*inputs)

    def replay() -> Any:
        graph.replay()
        return static

    return replay


def _calls_per_repeat(torch: Any, call: Callable[[], Any]) -> int:
    """As many calls as last about ``REPEAT_MS``, at least one."""
    per_call = _elapsed_ms(torch, call, PROBE_CALLS) / PROBE_CALLS
    return max(1, round(REPEAT_MS / per_call)) if per_call > 0 else 1


def _elapsed_ms(torch: Any, call: Callable[[], Any], number: int) -> float:
    """Milliseconds between CUDA events around ``number`` back-to-back calls."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(number):
        call()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def _describe(output: Any) -> Report:
    """Shape and dtype of the model's first output tensor (BERT's: the last hidden state)."""
    if hasattr(output, "to_tuple"):
        output = output.to_tuple()[0]
    elif isinstance(output, (tuple, list)):
        output = output[0]
    return {"shape": list(output.shape), "dtype": str(output.dtype).removeprefix("torch.")}


def _free(torch: Any) -> None:
    """Drop compiled code, captured graphs and cached GPU memory."""
    with contextlib.suppress(Exception):
        torch._dynamo.reset()
    gc.collect()
    with contextlib.suppress(Exception):
        torch.cuda.empty_cache()


def _message(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _line(result: Report) -> str:
    name = f"{result['model']}:{result['batch']} {result['mode']}"
    if "error" in result:
        first = (result["error"].splitlines() or [""])[0]
        return f"{name}: failed: {first[:300]}"
    return (f"{name}: {result['median_ms']:.3f} ms median ({result['min_ms']:.3f}-{result['max_ms']:.3f}, "
            f"{len(result['repeats_ms'])} x {result['calls_per_repeat']} calls), setup {result['setup_s']:.1f} s")


def _specs(text: str) -> list[tuple[str, int]]:
    """``resnet50:1,bert_base:16`` as (model, batch) pairs; a bare name is batch 1."""
    specs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, batch = item.partition(":")
        specs.append((name, int(batch or 1)))
    return specs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet50:1,resnet50:16,bert_base:1", help="model:batch, comma-separated")
    parser.add_argument("--modes", default="eager,graph,compile", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="the JSON report, rewritten after each result")
    args = parser.parse_args(argv)
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    try:
        specs = _specs(args.models)
        _check(specs, modes)
    except ValueError as error:
        parser.error(str(error))
    out = Path(args.out) if args.out else None

    def write(report: Report) -> None:
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=1) + "\n")

    write(run(specs, modes, args.repeats, args.seed, on_result=write))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
