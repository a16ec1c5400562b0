"""probtune's catalog operators run through onnxruntime, for a side-by-side reference.

Each supported catalog workload is written as a one-operator ONNX graph (two or three
where the catalog's layout needs it) that computes exactly what the catalog's PrimFunc
computes, takes the same inputs in the same order and layouts, and is timed on
onnxruntime's CPU provider the way TVM's ``time_evaluator`` times a function: seconds
per call, into preallocated outputs, median of several batches of calls.

Import it from another bench script (``sys.path.insert(0, bench_dir)`` then
``import onnxruntime_ops``), or run ``.venv/bin/python bench/onnxruntime_ops.py`` to
check every supported operator against the catalog's numpy reference and print a table
of times at the catalog's default shapes (exit status 1 if any output is wrong).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from probtune.workloads.catalog import BUILTIN_WORKLOADS, WorkloadSpec, resolve_workload
from probtune.workloads.workload import Workload

__all__ = ["SUPPORTED", "bind", "onnx_model", "self_check", "time_onnxruntime"]

Shape = tuple[int, ...]

OPSET = 17  # the first opset with LayerNormalization
IR_VERSION = 10  # newer onnx writes IR versions that older onnxruntime releases reject
_OUTPUT = "out"

# A graph builder gets the catalog shape and returns the graph's input names (in the
# catalog's input order) and its nodes, the last of which writes ``_OUTPUT``.
_Graph = tuple[list[str], list[onnx.NodeProto]]


def _matmul(_shape: Shape) -> _Graph:
    """matmul and batch_matmul: A[.., M, K] @ B[.., K, N], both plain row-major."""
    return ["A", "B"], [helper.make_node("MatMul", ["A", "B"], [_OUTPUT])]


def _dense_bias_relu(_shape: Shape) -> _Graph:
    """relu(X W^T + bias) with W stored N x K, hence Gemm's transB=1."""
    return ["X", "W", "bias"], [
        helper.make_node("Gemm", ["X", "W", "bias"], ["dense"], transB=1),
        helper.make_node("Relu", ["dense"], [_OUTPUT]),
    ]


def _conv_attributes(r: int, s: int, stride: int, pad: int) -> dict[str, list[int]]:
    return {"kernel_shape": [r, s], "strides": [stride, stride], "pads": [pad] * 4}


def _conv2d_nchw(shape: Shape) -> _Graph:
    """data N x C x H x W and weight K x C x R x S are ONNX Conv's own layouts."""
    _, _, _, _, _, r, s, stride, pad = shape
    return ["data", "weight"], [
        helper.make_node(
            "Conv", ["data", "weight"], [_OUTPUT], **_conv_attributes(r, s, stride, pad)
        )
    ]


def _conv2d_nhwc(shape: Shape) -> _Graph:
    """ONNX Conv is NCHW only, so the graph transposes data (NHWC), weight (HWIO) and the
    output around it; the timed figure includes those three transposes (the weight one is
    not folded away because the weight is a graph input, as it is for TVM)."""
    _, _, _, _, _, r, s, stride, pad = shape
    return ["data", "weight"], [
        helper.make_node("Transpose", ["data"], ["data_nchw"], perm=[0, 3, 1, 2]),
        helper.make_node("Transpose", ["weight"], ["weight_kcrs"], perm=[3, 2, 0, 1]),
        helper.make_node(
            "Conv",
            ["data_nchw", "weight_kcrs"],
            ["out_nchw"],
            **_conv_attributes(r, s, stride, pad),
        ),
        helper.make_node("Transpose", ["out_nchw"], [_OUTPUT], perm=[0, 2, 3, 1]),
    ]


def _depthwise_conv2d_nchw(shape: Shape) -> _Graph:
    """A grouped Conv with one group per channel; weight C x 1 x R x S is its layout."""
    _, c, _, _, r, s, stride, pad = shape
    return ["data", "weight"], [
        helper.make_node(
            "Conv", ["data", "weight"], [_OUTPUT], group=c, **_conv_attributes(r, s, stride, pad)
        )
    ]


def _softmax(_shape: Shape) -> _Graph:
    """Since opset 13 Softmax normalises along the one given axis, as the catalog does."""
    return ["X"], [helper.make_node("Softmax", ["X"], [_OUTPUT], axis=-1)]


def _layer_norm(_shape: Shape) -> _Graph:
    """LayerNormalization over the last axis with the catalog's epsilon (1e-5).

    onnxruntime's kernel takes the variance as E[x^2] - E[x]^2 in one pass, where the
    catalog takes two passes; for inputs of unit scale the difference is rounding only.
    """
    return ["X", "gamma", "beta"], [
        helper.make_node(
            "LayerNormalization", ["X", "gamma", "beta"], [_OUTPUT], axis=-1, epsilon=1e-5
        )
    ]


_GRAPHS: dict[str, Callable[[Shape], _Graph]] = {
    "matmul": _matmul,
    "batch_matmul": _matmul,
    "dense_bias_relu": _dense_bias_relu,
    "conv2d_nchw": _conv2d_nchw,
    "conv2d_nhwc": _conv2d_nhwc,
    "depthwise_conv2d_nchw": _depthwise_conv2d_nchw,
    "softmax": _softmax,
    "layer_norm": _layer_norm,
}

SUPPORTED: frozenset[str] = frozenset(_GRAPHS)
"""Catalog workloads with an onnxruntime equivalent (float32 only)."""


def _workload(name: str, shape: Sequence[int]) -> Workload:
    """The catalog workload, whose PrimFunc fixes the graph's input and output shapes."""
    if name not in SUPPORTED:
        supported = ", ".join(sorted(SUPPORTED))
        raise ValueError(f"no onnxruntime graph for {name!r}; supported: {supported}")
    return resolve_workload(name, tuple(shape), "float32")


def onnx_model(name: str, shape: tuple[int, ...]) -> onnx.ModelProto:
    """The float32 ONNX model of catalog workload ``name`` at catalog shape ``shape``.

    Its graph inputs are the catalog's inputs in the catalog's order, shapes and layouts
    (nothing is pre-transposed into an initializer), and its one output is the catalog's.
    """
    workload = _workload(name, shape)
    input_names, nodes = _GRAPHS[name](workload.shape)
    specs = workload.param_specs()
    input_specs, output_specs = specs[: workload.num_inputs], specs[workload.num_inputs :]
    assert len(input_names) == len(input_specs) and len(output_specs) == 1, name
    graph_inputs = [
        helper.make_tensor_value_info(input_name, TensorProto.FLOAT, input_shape)
        for input_name, (input_shape, _) in zip(input_names, input_specs)
    ]
    graph_output = helper.make_tensor_value_info(_OUTPUT, TensorProto.FLOAT, output_specs[0][0])
    graph = helper.make_graph(nodes, name, graph_inputs, [graph_output])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="probtune-bench"
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def _session(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def bind(
    name: str, shape: tuple[int, ...], inputs: list[np.ndarray], *, threads: int = 2
) -> tuple[Callable[[], None], list[np.ndarray]]:
    """A call that runs ``name`` at ``shape`` once on ``inputs``, and the arrays it writes its outputs to.

    Inputs and outputs are bound once (IOBinding), so a call copies nothing, as with
    TVM's ``time_evaluator``.
    """
    model = onnx_model(name, shape)
    session = _session(model, threads)
    metas = session.get_inputs()
    if [tuple(m.shape) for m in metas] != [a.shape for a in inputs] or any(
        a.dtype != np.float32 for a in inputs
    ):
        wanted = [tuple(m.shape) for m in metas]
        given = [(a.shape, str(a.dtype)) for a in inputs]
        raise ValueError(f"{name}{shape} takes float32 inputs of shapes {wanted}, got {given}")

    feeds = [np.ascontiguousarray(a) for a in inputs]  # bound by address: must outlive the binding
    outputs = [np.empty(m.shape, np.float32) for m in session.get_outputs()]
    binding = session.io_binding()
    for meta, array in zip(metas, feeds):
        binding.bind_ortvalue_input(meta.name, ort.OrtValue.ortvalue_from_numpy(array))
    for meta, array in zip(session.get_outputs(), outputs):
        binding.bind_ortvalue_output(meta.name, ort.OrtValue.ortvalue_from_numpy(array))

    def call(_bound_inputs: list[np.ndarray] = feeds) -> None:
        session.run_with_iobinding(binding)

    return call, outputs


def time_onnxruntime(
    name: str,
    shape: tuple[int, ...],
    inputs: list[np.ndarray],
    *,
    threads: int = 2,
    repeat: int = 5,
    min_seconds: float = 0.2,
) -> tuple[float, list[np.ndarray]]:
    """(median seconds per call, outputs) of ``name`` at ``shape`` on ``inputs``.

    A few warm-up calls, then ``repeat`` batches each of enough calls to last at least
    ``min_seconds``; a batch's time per call is its time over its calls, and the median
    of the batches is returned. Unlike ``time_evaluator`` the loop is in Python: with
    onnxruntime's own per-run overhead that is about 7 us per call (a 1x1x1 matmul).
    """
    call, outputs = bind(name, shape, inputs, threads=threads)

    def batch(calls: int) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            call()
        return time.perf_counter() - start

    one_call = min(batch(1) for _ in range(3))  # warm-up, and a first estimate
    calls = max(1, math.ceil(min_seconds / max(one_call, 1e-9)))
    per_call = []
    for _ in range(repeat):
        elapsed = batch(calls)
        while elapsed < min_seconds:  # the estimate was too low: grow the batch, as TVM does
            calls = max(calls + 1, math.ceil(calls * min_seconds / max(elapsed, 1e-9)))
            elapsed = batch(calls)
        per_call.append(elapsed / calls)
    return statistics.median(per_call), [o.copy() for o in outputs]


def _check(
    workload: Workload, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]
) -> tuple[float, bool]:
    """(max abs error, within probtune's own tolerance) of ``outputs`` vs the numpy reference."""
    expected = workload.reference_outputs(inputs)
    rtol, atol = workload.tolerance(expected)
    pairs = list(zip(outputs, expected, strict=True))
    if any(o.shape != e.shape for o, e in pairs):
        return math.inf, False
    error = max(float(np.max(np.abs(o.astype(np.float64) - e), initial=0.0)) for o, e in pairs)
    return error, all(np.allclose(o, e, rtol=rtol, atol=atol) for o, e in pairs)


def self_check(*, threads: int = 2) -> None:
    """Raise AssertionError unless every supported operator matches the numpy reference.

    Runs at each catalog entry's small shape, which exercises stride 2 and padding.
    """
    for spec, workload, _, error, ok in _timed_suite("small_shape", threads=threads, repeat=1, min_seconds=0.0):
        assert ok, f"{spec.name}{workload.shape}: off the numpy reference by {error:.3g}"


def _timed_suite(shape_field: str, **timing: Any) -> Iterator[tuple[WorkloadSpec, Workload, float, float, bool]]:
    """(spec, workload, seconds per call, max abs error, within tolerance) of each supported catalog entry."""
    for spec in BUILTIN_WORKLOADS:
        if spec.name not in SUPPORTED:
            continue
        workload = _workload(spec.name, getattr(spec, shape_field))
        inputs = workload.random_inputs(0)
        seconds, outputs = time_onnxruntime(spec.name, workload.shape, inputs, **timing)
        error, ok = _check(workload, inputs, outputs)
        yield spec, workload, seconds, error, ok


def main(argv: Sequence[str] | None = None) -> int:
    """Self-check, then time each supported workload at its default shape and print a table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    parser.add_argument("--repeat", type=int, default=5, help="timed batches (default 5)")
    parser.add_argument(
        "--min-seconds", type=float, default=0.2, help="shortest timed batch (default 0.2)"
    )
    args = parser.parse_args(argv)

    self_check(threads=args.threads)
    print(f"onnxruntime {ort.__version__}, onnx {onnx.__version__}, opset {OPSET}, "
          f"{args.threads} threads")
    print(f"{'workload':<22} {'shape':<28} {'ms/call':>9} {'GFLOPS':>8} {'max abs err':>12}  ok")
    all_ok = True
    timing = dict(threads=args.threads, repeat=args.repeat, min_seconds=args.min_seconds)
    for spec, workload, seconds, error, ok in _timed_suite("default_shape", **timing):
        all_ok &= ok
        gflops = workload.flops / seconds / 1e9 if workload.flops else float("nan")
        shape = ",".join(map(str, workload.shape))
        print(
            f"{spec.name:<22} {shape:<28} {seconds * 1e3:>9.3f} {gflops:>8.2f} {error:>12.3g}  "
            + ("yes" if ok else "NO")
        )
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
