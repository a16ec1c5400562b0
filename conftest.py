"""Shared fixtures and helpers of the kernel's tests (tests/) and the plugins' (plugins/*/tests/).

Small workloads that compile fast on a 2-core machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import te

from probtune import Rng, SpaceContext, generate_space
from probtune.measure.codegen import compile_for
from probtune.search.search_strategy import RandomSearch
from probtune.targets import resolve_target
from probtune.workloads.catalog import BUILTIN_WORKLOADS
from probtune.workloads.workload import Workload
from probtune_cpu.host_cpu import cpu_model


def matmul_module(m: int = 64, n: int = 64, k: int = 64) -> tvm.IRModule:
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


@pytest.fixture
def matmul_mod() -> tvm.IRModule:
    return matmul_module()


@pytest.fixture(scope="session")
def host():
    return resolve_target("host")


def context_of(sch, target) -> SpaceContext:
    """What a validator is given when the schedule's program is the workload itself."""
    return SpaceContext(workload=Workload.from_module(sch.mod), target=target)


def run_module(lib, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Call ``lib['main']`` on copies of ``arrays`` and return them all (outputs updated in place)."""
    dev = tvm.cpu()
    tensors = [tvm.runtime.tensor(a, dev) for a in arrays]
    lib["main"](*tensors)
    return [t.numpy() for t in tensors]


def categorical_sites(trace, candidates) -> list[int]:
    """The indices of a trace's ``sample_categorical`` instructions that choose among ``candidates``."""
    return [
        i for i, inst in enumerate(trace.instructions)
        if inst.kind == "sample_categorical" and list(inst.attrs["candidates"]) == list(candidates)
    ]


def multiplies_on_tensor_cores(source: str) -> bool:
    """Whether CUDA source multiplies on the tensor cores, through WMMA or ``mma.sync``."""
    return "wmma::mma_sync" in source or "mma.sync.aligned" in source


def valid_samples(space, count: int, seed: int = 1, tries: int = 400) -> list:
    """Up to ``count`` fresh samples of ``space`` that pass its validators, from at most ``tries`` draws."""
    rng = Rng(seed)
    found = []
    for _ in range(tries):
        candidate = space.sample(rng)
        if candidate is not None:
            found.append(candidate)
            if len(found) == count:
                break
    return found


def assert_samples_correct(workload, space, host, samples: int = 3, seed: int = 11) -> list:
    """Draw ``samples`` candidates with fresh decisions; each must replay to itself, compile and match numpy."""
    batch = RandomSearch(space, Rng(seed)).next_batch(samples)
    assert batch, f"no valid sample of {workload.key}"
    for candidate in batch:
        assert tvm_ffi.structural_equal(space.program(candidate.trace), candidate.mod)
        assert_program_correct(workload, candidate.mod, host)
    return batch


def softmax_samples_with(validator: str, host, samples: int = 4) -> list:
    """Samples of the small softmax's space, which must run ``validator``; each checked by ``assert_samples_correct``."""
    spec = next(spec for spec in BUILTIN_WORKLOADS if spec.name == "softmax")
    workload = spec.instantiate(spec.small_shape)
    space = generate_space(workload, host)
    assert validator in [v.name for v in space.validators]
    return assert_samples_correct(workload, space, host, samples=samples)


def assert_program_correct(workload, mod: tvm.IRModule, host) -> None:
    """``mod`` compiles for the host as the tuner compiles it, and its outputs match the workload's numpy reference."""
    inputs = workload.random_inputs(0)
    rtol, atol = workload.tolerance()
    lib = compile_for(mod, host)
    outputs = [np.zeros(shape, dtype) for shape, dtype in workload.param_specs()[workload.num_inputs :]]
    results = run_module(lib, [*inputs, *outputs])[workload.num_inputs :]
    for got, want in zip(results, workload.reference_outputs(inputs)):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@pytest.fixture(scope="session")
def small_cnn_onnx(tmp_path_factory):
    """A small residual CNN (examples.small_cnn at 8 channels, 16x16) with a dynamic batch, as an ONNX file."""
    import onnx

    from probtune.model.examples import small_cnn

    path = tmp_path_factory.mktemp("models") / "small_cnn.onnx"
    onnx.save(small_cnn(channels=8, size=16), path)
    return path


def quantized_cnn(source, target, **options):
    """The ONNX file ``source`` (one input ``x`` of shape (1, 3, 16, 16)) quantized statically by onnxruntime into
    ``target``, calibrated on 4 random inputs: QDQ, per-channel int8 weights, uint8 activations, unless ``options``
    (``quantize_static``'s) say otherwise."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(0)
    samples = iter([{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(4)])

    class Samples(CalibrationDataReader):
        def get_next(self) -> dict | None:
            return next(samples, None)

    settings = dict(quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8) | options
    quantize_static(str(source), str(target), Samples(), **settings)
    return target


@pytest.fixture(scope="session")
def qdq_cnn(small_cnn_onnx, tmp_path_factory):
    """examples.small_cnn (3x3 convolutions with padding, a residual add, pooling, a Gemm) quantized statically."""
    return quantized_cnn(small_cnn_onnx, tmp_path_factory.mktemp("quantized") / "small_cnn.qdq.onnx")


@pytest.fixture(scope="session")
def encoder_onnx(tmp_path_factory):
    """One small transformer encoder layer (hidden 32, 2 heads, sequence 16), as an ONNX file."""
    import onnx

    from probtune.model.examples import encoder_layer

    path = tmp_path_factory.mktemp("models") / "encoder.onnx"
    onnx.save(encoder_layer(hidden=32, heads=2, ffn=64, seq=16), path)
    return path


def host_key(name: str = "host") -> str:
    """The key under which this machine's records of a target are kept in a database (the target at this CPU)."""
    return f"{name}@{cpu_model()}"


def fused_ops(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` legalized, its operator patterns annotated and fused by FuseOps (the joins after fusion read that)."""
    steps = [tvm.relax.transform.LegalizeOps(), tvm.relax.transform.AnnotateTIROpPattern(), tvm.relax.transform.FuseOps()]
    return tvm.transform.Sequential(steps)(mod)


def called_primfuncs(mod: tvm.IRModule) -> list[str]:
    """The names of the PrimFuncs ``mod``'s main function calls with ``call_tir``, in order."""
    calls: list[str] = []
    tvm.relax.analysis.post_order_visit(mod["main"], lambda e: calls.append(e.args[0].name_hint) if isinstance(
        e, tvm.relax.Call) and getattr(e.op, "name", "") == "relax.call_tir" else None)
    return calls


def untuned_runner(fused: tvm.IRModule, target):
    """A fused model built by TVM as it is (no tuned programs), as a function of numpy inputs to numpy outputs."""
    executable = tvm.compile(fused, tvm.target.Target(target.tvm_target))
    vm = tvm.relax.VirtualMachine(executable, tvm.cpu())

    def run(*arrays):
        result = vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
        return [r.numpy() for r in result] if isinstance(result, tvm.ir.Array) else [result.numpy()]

    return run


@dataclass
class AnnotatedOrNot:
    """A module that forks: the block as it is, and a sketch where it carries an annotation."""

    name: str = "annotated-or-not"

    def apply(self, sch, block, ctx):
        fork = sch.fork()
        fork.annotate(block, "probtune.test_sketch", 1)
        return [fork]


def annotated(trace) -> bool:
    """Whether ``trace`` is of :class:`AnnotatedOrNot`'s second sketch."""
    return any(inst.kind == "annotate" and inst.attrs.get("ann_key") == "probtune.test_sketch" for inst in trace.instructions)
