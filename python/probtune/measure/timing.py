"""Checking and timing one loaded candidate against its reference: the runner children, the RPC runner and
the stand-alone script of a measurement bundle (:mod:`probtune.measure.bundle`) share it.

It imports nothing of probtune and TVM only when it measures, so that a
bundle carries this file as it is to a machine with TVM's runtime alone.
"""

from __future__ import annotations

import functools
import hashlib
import math
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "COLD_CALLS",
    "RunReply",
    "RunTask",
    "SampledOutput",
    "cache_flush_function",
    "check_and_time",
    "describe_error",
    "first_mismatch",
    "last_level_cache_bytes",
    "random_inputs",
    "read_reference",
    "sha256",
    "time_cold",
]

_FLUSH_ALL_BUT_FIRST = "cache_flush_cpu_non_first_arg"  # TVM's: evicts every argument but the first from the caches
_FLUSH_ALL = "probtune.cache_flush_all"  # registered by the measuring process: evicts its caches and every argument
COLD_CALLS = 10  # at most this many cold calls averaged into one repeat: each needs its own flush
EVICT_FACTOR = 1.5  # a cold call's eviction read covers this many times the last-level cache
FALLBACK_LLC_BYTES = 32 << 20  # the last-level cache assumed where the machine does not describe its caches
INTEGER_INPUT_RANGE = 4  # ints drawn from [0, 4]: valid indices of any gathered dimension of 5 or more (an
# embedding lookup reads out of bounds at a negative one; a smaller one folds them), and no overflow in small sums
_ERROR_LINES = 12
_ERROR_CHARS = 2000


@dataclass(frozen=True)
class RunTask:
    """One candidate to check and time: its reference, its library and how to time it."""

    reference_path: str
    num_inputs: int
    rtol: float
    atol: float
    artifact_path: str
    device: int  # DLPack device type, as tvm.device takes it (1: the CPU; others: GPUs and accelerators)
    repeat: int
    min_repeat_ms: float
    warmup: int
    stop_above: float | None  # seconds per call: a first repeat slower than this ends the timing
    cache_flush: bool = False  # time each call with its arguments flushed from the CPU caches (time_cold)


@dataclass(frozen=True)
class RunReply:
    """A candidate's outcome."""

    status: str  # a MeasureStatus value: "ok", "wrong_result" or "run_error" (plain text crosses the pipe)
    latencies: tuple[float, ...]
    error: str | None


@dataclass(frozen=True)
class SampledOutput:
    """An expected output known at some of its positions: what a bundle carries where the whole one is too large."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    positions: np.ndarray  # flat indices into the output, ascending
    values: np.ndarray


def random_inputs(
    seed: int, specs: Sequence[tuple[Sequence[int], str]], index_extents: Mapping[int, int] | None = None
) -> list[np.ndarray]:
    """Input arrays of the given shapes and dtypes that depend only on ``seed``: floats ~ U(-1, 1), ints in [0, 4].

    Input ``i`` of ``index_extents`` indexes a dimension of that extent: its
    draws are folded below it (modulo), so that it reads inside its buffer.
    """
    rng = np.random.default_rng(seed)
    arrays = [_random_array(rng, tuple(shape), dtype) for shape, dtype in specs]
    for position, extent in (index_extents or {}).items():
        arrays[position] = arrays[position] % extent
    return arrays


def _random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    np_dtype = np.dtype(dtype)
    if is_float(np_dtype):
        return rng.uniform(-1.0, 1.0, size=shape).astype(np_dtype)
    if np_dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np_dtype)
    return rng.integers(0, INTEGER_INPUT_RANGE + 1, size=shape).astype(np_dtype)


def sha256(array: np.ndarray) -> str:
    """A digest of an array's dtype, shape and bytes."""
    digest = hashlib.sha256(f"{array.dtype.str}:{array.shape};".encode())
    digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


STORED_AS_BITS = {"bfloat16": "uint16"}
"""Array types (ml_dtypes') that an .npz file cannot hold: :func:`save_arrays` stores their bits, and names the type
in a key of its own for :func:`load_arrays`."""

_TYPE_KEY = "__dtype__"


def is_float(dtype: np.dtype[Any]) -> bool:
    """Whether ``dtype`` is a floating-point type, ml_dtypes' bfloat16 included (numpy's ``np.floating`` is not it)."""
    return bool(np.issubdtype(dtype, np.floating)) or dtype.name in STORED_AS_BITS


def float_eps(dtype: np.dtype[Any]) -> float:
    """The spacing of ``dtype``'s values at 1.0 (numpy's ``finfo`` knows no ml_dtypes type)."""
    if dtype.name in STORED_AS_BITS:
        import ml_dtypes

        return float(ml_dtypes.finfo(dtype).eps)
    return float(np.finfo(dtype).eps)


def save_arrays(path: str | Path, arrays: Mapping[str, np.ndarray]) -> None:
    """``arrays`` in an .npz file at ``path``, with the types numpy's format lacks kept (:data:`STORED_AS_BITS`)."""
    payload: dict[str, Any] = {}  # numpy's stub reads a key as its allow_pickle flag
    for key, array in arrays.items():
        bits = STORED_AS_BITS.get(array.dtype.name)
        payload[key] = array if bits is None else array.view(bits)
        if bits is not None:
            payload[_TYPE_KEY + key] = np.array(array.dtype.name)
    np.savez(path, **payload)


def load_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays :func:`save_arrays` wrote at ``path``, in their own types."""
    with np.load(path) as saved:
        arrays = {key: saved[key] for key in saved.files if not key.startswith(_TYPE_KEY)}
        typed = {key.removeprefix(_TYPE_KEY): str(saved[key]) for key in saved.files if key.startswith(_TYPE_KEY)}
    if typed:
        import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy

        arrays.update({key: arrays[key].view(np.dtype(name)) for key, name in typed.items()})
    return arrays


@functools.lru_cache(maxsize=1)
def read_reference(path: str, num_inputs: int) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """The inputs and expected outputs saved at ``path``; the last read is kept (a reference's name carries its digest)."""
    arrays = load_arrays(path)
    inputs = tuple(arrays[f"input_{i}"] for i in range(num_inputs))
    outputs = tuple(arrays[f"output_{i}"] for i in range(len(arrays) - num_inputs))
    return inputs, outputs


def check_and_time(
    module: Any, device: Any, inputs: Sequence[np.ndarray], expected: Sequence[np.ndarray | SampledOutput], task: RunTask
) -> RunReply:
    """Run a loaded candidate once on ``inputs``, compare with ``expected``, then time it as ``task`` says.

    ``module`` and ``device`` may be local or behind a TVM RPC session: the
    tensors are made on ``device``, the outputs copied back to be checked here.
    """
    import tvm  # not at the top: a runner child sets TVM's environment before its first import

    # Fresh tensors per candidate: one that scribbles on its inputs cannot spoil the next.
    args = [tvm.runtime.tensor(array, device) for array in inputs]
    args += [tvm.runtime.tensor(np.zeros(array.shape, array.dtype), device) for array in expected]
    started = time.perf_counter()
    module["main"](*args)
    device.sync()
    check_seconds = time.perf_counter() - started
    mismatch = first_mismatch([tensor.numpy() for tensor in args[len(inputs) :]], expected, task.rtol, task.atol)
    if mismatch is not None:
        return RunReply("wrong_result", (), mismatch)
    stop_above = task.stop_above
    if task.cache_flush:
        return RunReply("ok", time_cold(module, device, args, task), None)
    # A check call slower than stop_above has warmed the candidate already, and the
    # timer discards its own first call too: another warmup would only cost time.
    if stop_above is None or check_seconds <= stop_above:
        for _ in range(task.warmup):
            module["main"](*args)

    def time_repeats(repeat: int, number: int = 1) -> tuple[float, ...]:
        timer = module.time_evaluator(  # number grows until one repeat lasts min_repeat_ms
            "main",
            device,
            number=number,
            repeat=repeat,
            min_repeat_ms=math.ceil(task.min_repeat_ms),
        )
        return tuple(float(t) for t in timer(*args).results)

    if stop_above is None:
        return RunReply("ok", time_repeats(task.repeat), None)
    latencies = time_repeats(1)
    first = latencies[0]
    if first <= stop_above and task.repeat > 1:
        # Enough calls per repeat to last min_repeat_ms, judged by the first repeat: the
        # timer would otherwise grow the count from one call again.
        number = int(task.min_repeat_ms / 1e3 / first) + 1 if first > 0 else 1
        latencies += time_repeats(task.repeat - 1, number)
    return RunReply("ok", latencies, None)


def time_cold(module: Any, device: Any, args: list[Any], task: RunTask) -> tuple[float, ...]:
    """Seconds per call, each call timed after the caches were emptied of the candidate's arguments and buffers.

    In a whole model, other layers run between two calls of a kernel: its
    weights and its own intermediate buffers are no longer cached, and its
    input, written by the layer before, is in the last-level cache or memory
    when it is large. Timing it warm overstates what a schedule gains from a
    small working set, and favours schedules that read a large input out of
    order. A repeat averages up to
    ``COLD_CALLS`` calls, as many as last ``min_repeat_ms``; a first call
    slower than ``stop_above`` is all that is timed.
    """

    def cold_calls(count: int) -> list[float]:
        timer = module.time_evaluator("main", device, number=1, repeat=count, f_preproc=cache_flush_function(device))
        return [float(t) for t in timer(*args).results]

    first = cold_calls(1)[0]
    if task.stop_above is not None and first > task.stop_above:
        return (first,)
    calls = COLD_CALLS if first <= 0 else min(COLD_CALLS, max(1, math.ceil(task.min_repeat_ms / 1e3 / first)))
    timings = cold_calls(task.repeat * calls)
    return tuple(float(np.mean(timings[i * calls : (i + 1) * calls])) for i in range(task.repeat))


def cache_flush_function(device: Any) -> str:
    """The name of the function the timer calls before each cold call on ``device``.

    Here, one registered by this process that evicts every argument; behind an
    RPC session, TVM's own, the only one a server knows, which keeps the first
    argument (the kernel's input) cached.
    """
    from tvm.runtime.device import RPC_SESS_MASK  # added to the type of a device behind an RPC session

    return _register_flush_all() if device.dlpack_device_type() < RPC_SESS_MASK else _FLUSH_ALL_BUT_FIRST


@functools.cache
def _register_flush_all() -> str:
    """Register ``_FLUSH_ALL`` with TVM: a read that evicts the last-level cache, then TVM's flush of the arguments.

    The read evicts what a kernel allocates for itself: a padded copy of its
    input made at the root stays cached from call to call when only the
    arguments are flushed, while in a model the other layers evict it.
    TVM's flush is called with a placeholder before the arguments.
    """
    import tvm

    flush = tvm.get_global_func(_FLUSH_ALL_BUT_FIRST)
    evict = np.ones(int(EVICT_FACTOR * last_level_cache_bytes()) // 8, dtype=np.int64)  # written: real pages to read

    def flush_all(*args: Any) -> None:
        evict.sum()
        flush(0, *args)

    tvm.register_global_func(_FLUSH_ALL, flush_all, override=True)
    return _FLUSH_ALL


def last_level_cache_bytes(cache_dir: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """This machine's largest CPU cache, as Linux describes it; ``FALLBACK_LLC_BYTES`` where it does not."""
    sizes = []
    for path in Path(cache_dir).glob("index*/size"):
        text = path.read_text().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        digits = text.rstrip("KM")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=FALLBACK_LLC_BYTES)


def describe_error(error: BaseException) -> str:
    """The error's type and the last lines of its message (TVM's messages end with the cause)."""
    text = "".join(traceback.format_exception_only(type(error), error)).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    tail = "\n".join(lines[-_ERROR_LINES:])
    return tail[-_ERROR_CHARS:]


def first_mismatch(
    actual: Sequence[np.ndarray], expected: Sequence[np.ndarray | SampledOutput], rtol: float, atol: float
) -> str | None:
    """Why the first wrong output is wrong, or None when all match.

    A NaN matches only a NaN of the reference (a function outside its domain
    there, as onnxruntime's own tests compare); an infinity only the same one.

    A :class:`SampledOutput` is compared at its positions only.
    """
    for index, (out, known) in enumerate(zip(actual, expected)):
        if isinstance(known, SampledOutput):
            out, ref = out.reshape(-1)[known.positions], known.values
        else:
            ref = known
        if out.dtype.name in STORED_AS_BITS:  # compared in float32: numpy's arithmetic in bfloat16 rounds the bounds
            out, ref = out.astype(np.float32), ref.astype(np.float32)
        if np.allclose(out, ref, rtol=rtol, atol=atol, equal_nan=True):
            continue
        with np.errstate(invalid="ignore"):
            error = np.abs(out.astype(np.float64) - ref.astype(np.float64))
        got_nan, want_nan = np.isnan(out.astype(np.float64)), np.isnan(ref.astype(np.float64))
        if (got_nan != want_nan).any():
            return (f"{int((got_nan & ~want_nan).sum())} NaN value(s) in output {index} where the reference has "
                    f"numbers, {int((want_nan & ~got_nan).sum())} number(s) where it has NaN")
        error[got_nan] = 0.0  # NaNs in the same places, or infinities of the same sign
        return (
            f"max abs error {error.max():.3g} exceeds tolerance "
            f"(rtol {rtol:g}, atol {atol:g}) in output {index}"
        )
    return None
