"""What probtune tunes: one TIR PrimFunc plus what is needed to check and rate its results.

A :class:`Workload` comes either from the built-in catalog (``"matmul"`` at some shape)
or from a user's own IRModule/PrimFunc.  Besides the module it knows which parameters
are inputs, how many floating-point operations one call performs (for GFLOPS), and how
to produce reference outputs so that every tuned candidate can be checked for
correctness.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import tvm
import tvm_ffi
from tvm.s_tir.analysis import estimate_tir_flops

from probtune.errors import WorkloadShapeError
from probtune.measure.timing import float_eps, is_float, random_inputs
from probtune.schedule.analysis import identity, iter_loads, iter_stmts

__all__ = [
    "Workload",
    "WorkloadLike",
    "count_inputs",
    "parse_shape",
]

ReferenceFn = Callable[..., list[np.ndarray]]

_UINT64_MASK = (1 << 64) - 1
INPUT_RANGES = ((-1.0, 1.0), (0.0, 1.0), (1.0, 2.0))
"""Where a check draws float inputs, in order: the first range in which the reference's outputs are all finite.

U(-1, 1) leaves the domain of a square root, a logarithm or a variance; the
same draws moved into (0, 1) or (1, 2) bring such a function (an acosh
too) back into it."""
REORDERING = 0.5
"""Allowed error of an output, in units of ``sqrt(K)`` times its change when every input moves by one rounding.

Reordering a sum of ``K`` rounded terms moves it by about ``eps * sqrt(K)``
times its terms' size, and an epilogue (a hard-swish, a division) carries
that through as it carries a change of the inputs; measuring the latter on
the reference itself bounds the former wherever the outputs' own size does not."""
_INTEGER_TEXT = re.compile(r"-?[0-9]+")  # signed, so a negative size gets a clear message
_SHAPE_SEPARATORS = re.compile(r"\s*[,xX×]\s*|\s+")  # noqa: RUF001 - the multiplication sign is accepted


@dataclass(frozen=True, eq=False)
class Workload:
    """One tensor program to tune, with the metadata needed to verify and rate it.

    ``name`` is the catalog name, or the user function's name.  ``shape`` holds the
    catalog shape parameters (None for user modules).  ``dtype`` is the catalog dtype,
    or the dtype of a user function's first parameter.  ``mod`` holds exactly one
    PrimFunc, ``main``, whose first ``num_inputs`` parameters are the inputs and the
    rest the outputs.  ``flops`` counts the floating-point operations of one call
    (None if unknown); ``reference(*inputs)`` returns the outputs computed by numpy.
    ``baseline(*inputs)``, where there is one, is the same computation done the fast
    way in numpy at the workload's own dtype: what the user would run without
    probtune, timed for comparison, never used to check results.
    """

    name: str
    shape: tuple[int, ...] | None
    dtype: str
    mod: tvm.IRModule
    num_inputs: int
    flops: float | None
    reference: ReferenceFn | None
    baseline: Callable[..., object] | None = None

    def __post_init__(self) -> None:
        functions = list(self.mod.functions.items())
        if len(functions) != 1 or functions[0][0].name_hint != "main":
            raise WorkloadShapeError(
                f"workload {self.name!r}: the module must hold exactly one function, named 'main'"
            )
        if not isinstance(functions[0][1], tvm.tirx.PrimFunc):
            raise WorkloadShapeError(f"workload {self.name!r}: 'main' is not a TIR PrimFunc")
        if not 0 <= self.num_inputs <= len(self.prim_func.params):
            raise WorkloadShapeError(
                f"workload {self.name!r}: num_inputs={self.num_inputs} but 'main' has "
                f"{len(self.prim_func.params)} parameters"
            )

    @property
    def key(self) -> str:
        """Stable human-readable id: ``matmul(512,512,512):float32`` or ``name:<hash>``."""
        if self.shape is not None:
            return f"{self.name}({','.join(map(str, self.shape))}):{self.dtype}"
        return f"{self.name}:{self.structural_hash:016x}"

    @functools.cached_property
    def structural_hash(self) -> int:
        """TVM's structural hash of the module, as an unsigned 64-bit integer."""
        return tvm_ffi.structural_hash(self.mod) & _UINT64_MASK

    @property
    def prim_func(self) -> tvm.tirx.PrimFunc:
        return self.mod["main"]

    def param_specs(self) -> list[tuple[tuple[int, ...], str]]:
        """(shape, dtype) of every parameter, inputs first."""
        return [_static_param_spec(self.name, param) for param in self.prim_func.params]

    def random_inputs(self, seed: int) -> list[np.ndarray]:
        """Input arrays that depend only on ``seed``: floats ~ U(-1, 1), ints in [0, 4], below the extent they index."""
        return random_inputs(seed, self.param_specs()[: self.num_inputs], self.index_extents)

    @functools.cached_property
    def index_extents(self) -> dict[int, int]:
        """Input position -> the smallest extent of a buffer dimension that the integer input indexes.

        A model's constant index (ONNX Gather's, picking one of a few slices)
        reaches a task as an input; drawn beyond the dimension, it reads
        outside the buffer, and no two programs agree on what they read.
        """
        func = self.prim_func
        specs = self.param_specs()
        integers = {
            identity(param): position
            for position, param in enumerate(func.params[: self.num_inputs])
            if np.issubdtype(np.dtype(specs[position][1]), np.integer)
        }
        extents: dict[int, int] = {}
        if not integers:  # most tasks: nothing to walk for
            return extents
        for shape, indices in _accesses(func):
            for extent, index in zip(shape, indices):
                positions = [integers.get(identity(load.source)) for load in iter_loads(index)]
                for position in (p for p in positions if p is not None and isinstance(extent, tvm.tirx.IntImm)):
                    extents[position] = min(extents.get(position, int(extent)), int(extent))
        return extents

    def reference_case(self, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Inputs of ``seed`` where the function is defined (:data:`INPUT_RANGES`), and their reference outputs.

        Where no range gives all-finite outputs, the one that gives fewest
        non-finite values; a check then expects them at the same positions.
        """
        drawn = self.random_inputs(seed)
        fewest: tuple[int, list[np.ndarray], list[np.ndarray]] | None = None
        for low, high in INPUT_RANGES:
            inputs = [_moved(array, low, high) for array in drawn]
            outputs = self.reference_outputs(inputs)
            bad = sum(int(np.size(a) - np.isfinite(a.astype(np.float64)).sum()) for a in outputs if is_float(a.dtype))
            if bad == 0:
                return inputs, outputs
            if fewest is None or bad < fewest[0]:
                fewest = (bad, inputs, outputs)
        assert fewest is not None
        return fewest[1], fewest[2]

    def rounding_change(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray], seed: int = 0) -> float:
        """The largest change of a finite output when every float input moves by one rounding (a relative ``eps``)."""
        rng = np.random.default_rng(seed)
        moved = [
            (a.astype(np.float64) * (1 + float_eps(a.dtype) * rng.uniform(-1.0, 1.0, a.shape))).astype(a.dtype)
            if is_float(a.dtype) else a
            for a in inputs
        ]
        largest = 0.0
        for before, after in zip(outputs, self.reference_outputs(moved)):
            if is_float(np.asarray(before).dtype):
                with np.errstate(invalid="ignore"):
                    change = np.abs(np.asarray(after, np.float64) - np.asarray(before, np.float64))
                finite = change[np.isfinite(change)]
                largest = max(largest, float(finite.max(initial=0.0)))
        return largest

    def reference_outputs(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Correct outputs for ``inputs``: numpy reference, else the untuned module run by TVM."""
        self._check_inputs(inputs)
        if self.reference is not None:
            return list(self.reference(*inputs))
        return self._run_untuned(inputs)

    def tolerance(
        self, expected: Sequence[np.ndarray] | None = None, rounding_change: float = 0.0
    ) -> tuple[float, float]:
        """(rtol, atol) for comparing tuned outputs with ``expected`` (0, 0 for integers).

        Tuning reorders floating-point reductions, so the allowed error grows with the
        unit roundoff ``eps`` of the output dtype and the longest reduction ``K``: about
        ``eps * sqrt(K)`` relative for large elements, and ``eps * sqrt(K)`` times the
        outputs' RMS magnitude absolute for elements that cancel to near zero.  The
        magnitude comes from ``expected``, or else from the reference outputs of
        ``random_inputs(0)``; scaling by it keeps small outputs (softmax) checked.  The
        constants leave a margin of about 10x over the error measured for the untuned
        built-in workloads against float64 references. Where the reductions accumulate in
        a wider type than the outputs (float16 products summed in float32), the growth
        term takes the accumulator's ``eps`` and the final rounding adds a few of the
        output's. Given :meth:`rounding_change` of the expected outputs, ``atol`` is
        at least :data:`REORDERING` ``* sqrt(K)`` times it.
        """
        dtypes = {np.dtype(dtype) for _, dtype in self.param_specs()[self.num_inputs :]}
        float_dtypes = [dtype for dtype in dtypes if is_float(dtype)]
        if not float_dtypes:
            return 0.0, 0.0
        eps = max(float_eps(dtype) for dtype in float_dtypes)
        longest, accumulator_eps = self._reductions
        summed = eps if accumulator_eps is None else accumulator_eps
        rounding = 4 * eps if eps > summed else 0.0
        growth = math.sqrt(longest)
        scale = self._typical_output_scale if expected is None else _rms(expected)
        atol = max((summed * (16 + 4 * growth) + rounding) * scale, REORDERING * growth * rounding_change)
        return summed * (64 + 16 * growth) + rounding, atol

    @classmethod
    def from_module(
        cls, obj: tvm.IRModule | tvm.tirx.PrimFunc, name: str | None = None
    ) -> Workload:
        """Wrap a user's module: inputs are the leading parameters the body never writes."""
        func = _single_prim_func(obj)
        name = name or _global_symbol(func) or "custom"
        func = func.with_attr("global_symbol", "main")
        num_inputs = count_inputs(func, name)
        specs = [_static_param_spec(name, param) for param in func.params]
        dtype = specs[0][1]
        mod = tvm.IRModule({"main": func})
        return cls(
            name=name,
            shape=None,
            dtype=dtype,
            mod=mod,
            num_inputs=num_inputs,
            flops=_estimate_flops(mod),
            reference=None,
        )

    @functools.cached_property
    def _reductions(self) -> tuple[int, float | None]:
        """The most values any one block folds into an output element, and the largest ``eps`` of the floats they sum in.

        The ``eps`` is None where no block reduces floats.
        """
        longest, eps = 1, None

        def visit_block(block: tvm.s_tir.SBlock) -> None:
            nonlocal longest, eps
            extent = 1
            for iter_var in block.iter_vars:
                if iter_var.iter_type == tvm.tirx.IterVar.CommReduce:
                    extent *= int(iter_var.dom.extent)
            longest = max(longest, extent)
            if extent > 1 and block.writes and str(block.writes[0].source.dtype).startswith("float"):
                summed = float(np.finfo(np.dtype(str(block.writes[0].source.dtype))).eps)
                eps = summed if eps is None else max(eps, summed)

        tvm_ffi.structural_walk(self.prim_func.body, (tvm.s_tir.SBlock, visit_block))
        return longest, eps

    @functools.cached_property
    def _typical_output_scale(self) -> float:
        return _rms(self.reference_outputs(self.random_inputs(0)))

    @functools.cached_property
    def _untuned_executable(self) -> tvm.runtime.Executable:
        # The reference runs on the tuning machine's own CPU, whatever the target: plain LLVM code, no ISA extensions.
        return tvm.compile(self.mod, target=tvm.target.Target({"kind": "llvm"}))

    def _run_untuned(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        device = tvm.cpu()
        output_specs = self.param_specs()[self.num_inputs :]
        input_tensors = [tvm.runtime.tensor(np.asarray(a, order="C"), device) for a in inputs]
        output_tensors = [
            tvm.runtime.tensor(np.zeros(shape, dtype), device) for shape, dtype in output_specs
        ]
        self._untuned_executable["main"](*input_tensors, *output_tensors)
        return [tensor.numpy() for tensor in output_tensors]

    def _check_inputs(self, inputs: Sequence[np.ndarray]) -> None:
        expected = self.param_specs()[: self.num_inputs]
        if len(inputs) != len(expected):
            raise WorkloadShapeError(
                f"workload {self.key} takes {len(expected)} inputs, got {len(inputs)}"
            )
        for index, (array, (shape, dtype)) in enumerate(zip(inputs, expected)):
            if tuple(array.shape) != shape or array.dtype != np.dtype(dtype):
                raise WorkloadShapeError(
                    f"workload {self.key}: input {index} must be {dtype}{list(shape)}, "
                    f"got {array.dtype}{list(array.shape)}"
                )


WorkloadLike: TypeAlias = str | Workload | tvm.IRModule | tvm.tirx.PrimFunc


def count_inputs(func: tvm.tirx.PrimFunc, name: str = "custom") -> int:
    """Number of leading parameters that ``func`` only reads.

    The written parameters are the outputs; they must all come after the inputs,
    the calling convention probtune (and TVM's tuners) rely on.
    """
    written = _written_buffers(func)
    is_output = [any(param.same_as(buffer) for buffer in written) for param in func.params]
    if not any(is_output):
        raise WorkloadShapeError(f"workload {name!r} writes none of its parameters: no outputs")
    num_inputs = is_output.index(True)
    if not all(is_output[num_inputs:]):
        names = [param.name for param in func.params]
        inputs_after = [names[i] for i in range(num_inputs, len(names)) if not is_output[i]]
        raise WorkloadShapeError(
            f"workload {name!r}: outputs must be the trailing parameters, but read-only "
            f"parameter(s) {inputs_after} follow the output {names[num_inputs]!r} "
            f"(parameter order: {names})"
        )
    return num_inputs


def parse_shape(text: str | Sequence[int], *, allow_zero: bool = False) -> tuple[int, ...]:
    """Shape from ``"512,512,512"``, ``"512x512x512"``, ``"(512, 512)"`` or a sequence of ints.

    ``allow_zero`` admits 0 (e.g. a padding parameter); the catalog then checks each
    parameter against its own lower bound.
    """
    if isinstance(text, str):
        body = text.strip().strip("()[]").strip()
        parts = _SHAPE_SEPARATORS.split(body) if body else []
        if not parts or not all(_INTEGER_TEXT.fullmatch(part) for part in parts):
            raise WorkloadShapeError(
                f"cannot parse shape {text!r}: expected integers separated by ',' or 'x', "
                f"e.g. '512,512,512'"
            )
        values = [int(part) for part in parts]
    else:
        try:
            values = [_as_int(value) for value in text]
        except TypeError:
            message = f"shape must be a sequence of integers, got {text!r}"
            raise WorkloadShapeError(message) from None
        if not values:
            raise WorkloadShapeError("shape must have at least one parameter, got ()")
    lowest = 0 if allow_zero else 1
    if any(value < lowest for value in values):
        bound = "non-negative" if allow_zero else "positive"
        raise WorkloadShapeError(f"shape parameters must be {bound}, got {tuple(values)}")
    return tuple(values)


def _as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError("bool is not a shape parameter")
    return operator.index(value)  # rejects floats and strings


def _single_prim_func(obj: tvm.IRModule | tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    if isinstance(obj, tvm.tirx.PrimFunc):
        return obj
    if not isinstance(obj, tvm.IRModule):
        raise TypeError(f"expected an IRModule or a PrimFunc, got {type(obj).__name__}")
    functions = list(obj.functions.values())
    if len(functions) != 1 or not isinstance(functions[0], tvm.tirx.PrimFunc):
        kinds = [type(func).__name__ for func in functions]
        raise WorkloadShapeError(
            f"a workload module must hold exactly one PrimFunc, this one holds {kinds}"
        )
    return functions[0]


def _global_symbol(func: tvm.tirx.PrimFunc) -> str | None:
    if func.attrs is None or "global_symbol" not in func.attrs:
        return None
    return str(func.attrs["global_symbol"])


def _written_buffers(func: tvm.tirx.PrimFunc) -> list[object]:
    """Buffers stored to, or declared written by a block (covers opaque/extern blocks)."""
    written: list[object] = []
    tvm_ffi.structural_walk(
        func.body,
        [
            (tvm.tirx.BufferStore, lambda store: written.append(store.buffer)),
            (
                tvm.s_tir.SBlock,
                lambda block: written.extend(region.source for region in block.writes),
            ),
        ],
    )
    return written


def _static_param_spec(name: str, param: tvm.tirx.Var) -> tuple[tuple[int, ...], str]:
    if not isinstance(param.ty, tvm.tirx.buffer.BufferType):
        raise WorkloadShapeError(f"workload {name!r}: parameter {param.name!r} is a scalar; probtune tunes buffers only")
    dims = []
    for dim in param.shape:
        if not isinstance(dim, tvm.tirx.IntImm):
            raise WorkloadShapeError(
                f"workload {name!r}: parameter {param.name!r} has the non-constant shape "
                f"{list(param.shape)}; probtune tunes static shapes only"
            )
        dims.append(int(dim))
    return tuple(dims), str(param.dtype)


def _rms(arrays: Sequence[np.ndarray]) -> float:
    """Root-mean-square magnitude of the finite elements of ``arrays`` together."""
    finite = [a[np.isfinite(a)] for a in (np.asarray(a, np.float64) for a in arrays)]
    total = sum(float(np.sum(np.square(a))) for a in finite)
    count = sum(a.size for a in finite)
    return math.sqrt(total / count) if count else 0.0


def _accesses(func: tvm.tirx.PrimFunc) -> Iterator[tuple[Any, Any]]:
    """(shape, indices) of every buffer access of ``func``'s stores: the store's own and every load in it."""
    for stmt in iter_stmts(func.body):
        if isinstance(stmt, tvm.tirx.BufferStore):
            yield stmt.buffer.shape, stmt.indices
            for expr in (stmt.value, *stmt.indices):
                for load in iter_loads(expr):
                    yield load.source.shape, load.indices


def _moved(array: np.ndarray, low: float, high: float) -> np.ndarray:
    """A float ``array`` drawn from U(-1, 1) moved linearly into U(low, high); other arrays as they are."""
    if not is_float(array.dtype) or (low, high) == (-1.0, 1.0):
        return array
    return (low + (array.astype(np.float64) + 1.0) * (high - low) / 2.0).astype(array.dtype)


def _estimate_flops(mod: tvm.IRModule) -> float | None:
    """TVM's count of floating-point operations, or None where it has none to offer."""
    try:
        flops = float(estimate_tir_flops(mod))
    except (RuntimeError, TypeError, ValueError):  # TVM reports unsupported IR this way
        return None
    return flops if flops > 0 else None
