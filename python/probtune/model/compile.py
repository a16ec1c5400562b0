"""Compile a fused model with tuned PrimFuncs into a runnable, exportable module that runs on all the target's cores."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import tvm
from tvm import relax

from probtune._core import Rng
from probtune.errors import NOT_REPLAYABLE, ModelCompileError, summary, warn_caller
from probtune.interfaces import Compiler, TargetSpec
from probtune.measure.codegen import compile_for, export_with
from probtune.model.check import CheckReport, outputs_to_numpy
from probtune.model.concat_in_place import write_concatenations_in_place
from probtune.model.importer import InputSpec
from probtune.model.inplace import write_in_place
from probtune.model.prepack import prepack_weights
from probtune.model.thread_count import ThreadChoice
from probtune.model.threads import PoolThread
from probtune.space.design_space import DesignSpace

__all__ = [
    "CompiledModel", "checked_inputs", "compile_model", "default_program", "default_programs", "export_model",
    "out_of_place_if_refused", "place_programs",
]

DEFAULT_DRAWS = 64  # draws of a task's space tried for a valid default program
T = TypeVar("T")
_SCOPE_NOTE = re.compile(r"executable\.cc:\d+: Warning: Scope (Saving|Loaded):")


def compile_model(
    fused: tvm.IRModule, programs: Mapping[str, tvm.IRModule], target: TargetSpec
) -> tuple[Any, int, int]:
    """``fused`` with each named PrimFunc replaced by the ``main`` of its program, compiled for ``target``.

    The programs are compiled as the tuner measured them (:func:`probtune.measure.codegen.compile_for`),
    except that a layout copy of a constant weight is made once, here (:mod:`probtune.model.prepack`), and
    an output that may overwrite an input read element for element (a residual) does so (:mod:`probtune.model.inplace`),
    and the producers of a concatenation write into it (:mod:`probtune.model.concat_in_place`).
    Returns the executable, how many weights were packed so and how many calls write in place.
    Raises :class:`ModelCompileError` if TVM cannot compile the result.
    """
    def build(in_place: bool) -> tuple[Any, int, int]:
        mod, prepacked, written = place_programs(fused, programs, target, in_place=in_place)
        return compile_for(mod, target), prepacked, written

    try:
        return out_of_place_if_refused(build)
    except Exception as exc:
        raise ModelCompileError(
            f"TVM cannot compile the model for target {target.name!r}: {summary(exc)}"
        ) from exc


def out_of_place_if_refused(build: Callable[[bool], T]) -> T:
    """``build(True)``, the model with outputs written in place; where the target refuses that (a kernel written over
    its residual that spills registers where the tuned one did not), ``build(False)``, each output in a buffer of its
    own, as the programs were measured."""
    try:
        return build(True)
    except Exception:  # noqa: BLE001 - whatever refused it, the programs as measured are tried next
        return build(False)


def place_programs(
    fused: tvm.IRModule,
    programs: Mapping[str, tvm.IRModule],
    target: TargetSpec,
    *,
    prepack: bool = True,
    in_place: bool = True,
) -> tuple[tvm.IRModule, int, int]:
    """``fused`` with the programs in place, weights packed, concatenations written by their producers and outputs
    written in place, as :func:`compile_model` compiles it; with how many weights were packed and how many calls
    write in place.

    ``prepack`` False keeps every constant as ``fused`` has it (the programs then make their layout copies per call);
    ``in_place`` False writes each output into a buffer of its own.
    """
    prepacked = 0
    if prepack:
        fused, programs, prepacked = prepack_weights(fused, programs, tvm.target.Target(target.tvm_target))
    functions = dict(fused.functions)
    for name, program in programs.items():
        func = program["main"].with_attr("global_symbol", name).with_attr("tirx.is_scheduled", True)
        functions[fused.get_global_var(name)] = func
    mod, concatenated = write_concatenations_in_place(tvm.IRModule(functions, attrs=fused.attrs))
    mod, written = write_in_place(mod) if in_place else (mod, 0)
    return mod, prepacked, written + sum(len(site.producers) for site in concatenated)


def export_model(compiler: Compiler | None, executable: Any, path: str | os.PathLike[str]) -> Path:
    """Write a compiled model as a shared library, linked as the target's ``compiler`` says; OSError if it cannot."""
    path = Path(path)
    try:
        with _without_scope_notes():
            export_with(compiler, executable, str(path))
    except Exception as exc:  # noqa: BLE001 - TVM reports an unwritable path as a generic error
        raise OSError(f"cannot write the compiled model to {path}: {exc}") from None
    return path


@contextlib.contextmanager
def _without_scope_notes() -> Iterator[None]:
    """Leave out the 'Scope Saving:' / 'Scope Loaded:' note TVM's runtime writes to stderr at every model export and
    load (a leftover of its VM executable, nothing a user can act on); anything else written there is kept."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors="replace").splitlines(keepends=True)
                    if not _SCOPE_NOTE.search(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def default_program(space: DesignSpace, seed: int = 0, target: TargetSpec | None = None) -> tvm.IRModule | None:
    """A program for a task with no correct record: the first valid draw of its space (parallel, vectorized), from its
    first sketch (the structure its modules rank first, a product computed whole before split, say) in the first half
    of the draws, from any sketch after.

    Never measured, so never the best program, but never the naive loops an
    untuned build would run either. Given ``target``, the draw must also
    compile for it alone (a validator can pass a program TVM's lowering then
    refuses). None if no draw qualifies.
    """
    rng = Rng(seed)
    for attempt in range(DEFAULT_DRAWS):
        try:
            sch, rejected = space.draw(rng, space.trace.with_decisions({}) if attempt < DEFAULT_DRAWS // 2 else None)
        except NOT_REPLAYABLE:
            continue
        if rejected is None and (target is None or _compiles(sch.mod, target)):
            return sch.mod
    return None


def _compiles(program: tvm.IRModule, target: TargetSpec) -> bool:
    try:
        compile_for(program, target)
    except Exception:  # noqa: BLE001 - any refusal of TVM's lowering or code generation
        return False
    return True


def default_programs(
    tasks: Sequence[tuple[Sequence[str], DesignSpace, tvm.IRModule]], seed: int = 0, target: TargetSpec | None = None
) -> dict[str, tvm.IRModule]:
    """Each fused function's program when its task has no correct record: ``(functions, space, workload module)``.

    ``target`` as for :func:`default_program`. A space with no such draw
    falls back to the task's own unscheduled program (TVM's plain loops:
    correct, slow), with a warning naming it.
    """
    programs: dict[str, tvm.IRModule] = {}
    for functions, space, unscheduled in tasks:
        program = default_program(space, seed, target)
        if program is None:
            warn_caller(f"no draw of the space of {functions[0]} is valid: it is compiled as TVM lowers it, untuned")
            program = unscheduled
        programs.update({name: program for name in functions})
    return programs


class CompiledModel:
    """A tuned model, runnable: ``compiled(*inputs)`` takes and returns numpy arrays.

    It runs on ``num_threads`` threads (default: the target's cores); TVM's
    runtime would otherwise use half the logical CPUs, or the pool that the
    calling thread started before (:mod:`probtune.model.threads`). Inputs are
    copied into tensors kept from call to call, so that a call allocates no
    fresh input memory; calls from several threads are served one at a time.
    """

    def __init__(self, executable: Any, inputs: Sequence[InputSpec], num_threads: int, compiler: Compiler | None = None) -> None:
        self.executable = executable
        self.compiler = compiler  # the target's: it links the library export_library writes
        self.inputs = tuple(inputs)
        self.num_threads = num_threads
        self.check: CheckReport | None = None  # set by ModelTuneResult.compile when the outputs were checked
        self.prepacked = 0  # weights whose layout copy was made at compile time (ModelTuneResult.compile)
        self.in_place = 0  # calls that write in place: over a residual, into a concatenation (ModelTuneResult.compile)
        self.thread_choice: ThreadChoice | None = None  # how its thread count was chosen (ModelTuneResult.compile)
        self._pool = PoolThread(num_threads)
        self._device = tvm.cpu()
        self._vm = relax.VirtualMachine(executable, self._device)
        self._main = self._vm["main"]
        self._staged = [tvm.runtime.empty(spec.shape, spec.dtype, self._device) for spec in self.inputs]
        self._staged_views = [_numpy_view(tensor) for tensor in self._staged]
        self._lock = threading.Lock()  # the VM and the kept input tensors serve one call at a time
        self._library: Path | None = None  # the shared library it runs from, if it was loaded from one

    @classmethod
    def linked(
        cls, executable: Any, inputs: Sequence[InputSpec], num_threads: int, compiler: Compiler | None = None
    ) -> CompiledModel:
        """``executable`` written as a shared library once, and run from it.

        TVM turns a compiled model into machine code when it first runs it and
        again when it exports it; a large model spends most of the time after
        tuning there. Run from its library, it does so once, and
        :meth:`export_library` copies the file.
        """
        folder = tempfile.mkdtemp(prefix="probtune-model-")
        try:
            library = export_model(compiler, executable, Path(folder) / "model.so")
            with _without_scope_notes():
                loaded = tvm.runtime.load_module(str(library))
            model = cls(loaded, inputs, num_threads, compiler)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        model._library = library
        weakref.finalize(model, shutil.rmtree, folder, ignore_errors=True)  # removed with the model, or at exit, quietly
        return model

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        arrays = checked_inputs(inputs, self.inputs)
        with self._lock:
            for tensor, view, array in zip(self._staged, self._staged_views, arrays):
                if view is None:
                    tensor.copyfrom(array)
                else:
                    np.copyto(view, array)
            return outputs_to_numpy(self._pool.run(self._main, *self._staged))

    def time(self, inputs: Sequence[np.ndarray], repeat: int = 10, min_repeat_ms: int = 100) -> list[float]:
        """Seconds per call of the model on ``inputs``, one figure per repeat (TVM's timer): a repeat runs the model
        once, or as many times as last ``min_repeat_ms``."""
        tensors = self._tensors(inputs)
        timer = self._vm.time_evaluator("invoke_stateful", self._device, number=1, repeat=repeat,
                                        min_repeat_ms=int(min_repeat_ms))
        with self._lock:
            self._vm.set_input("main", *tensors)
            return [float(r) for r in self._pool.run(timer, "main").results]

    def threads(self) -> int:
        """How many threads the model runs on."""
        return self._pool.workers()

    def use_threads(self, count: int) -> None:
        """Run on ``count`` threads from now on."""
        with self._lock:
            self._pool.close()
            self._pool = PoolThread(count)
            self.num_threads = count

    def export_library(self, path: str | os.PathLike[str]) -> Path:
        """Write the model as a shared library that TVM's runtime loads (:meth:`load`); OSError if it cannot."""
        if self._library is None:
            return export_model(self.compiler, self.executable, path)
        try:
            shutil.copyfile(self._library, path)
        except OSError as exc:
            raise OSError(f"cannot write the compiled model to {path}: {exc}") from None
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike[str], inputs: Sequence[InputSpec], num_threads: int | None = None) -> CompiledModel:
        """A model exported by :meth:`export_library`."""
        if not Path(path).is_file():
            raise FileNotFoundError(f"{path}: no such compiled model")
        with _without_scope_notes():
            executable = tvm.runtime.load_module(str(path))
        model = cls(executable, inputs, num_threads or os.cpu_count() or 1)
        model._library = Path(path)
        return model

    def _tensors(self, inputs: Sequence[np.ndarray]) -> list[Any]:
        return [tvm.runtime.tensor(array, self._device) for array in checked_inputs(inputs, self.inputs)]


def _numpy_view(tensor: Any) -> np.ndarray | None:
    """A numpy array over the tensor's memory (copying into it is a few times faster than ``copyfrom``, a per-call
    cost of a small model), or None where numpy cannot view its dtype."""
    try:
        view = np.from_dlpack(tensor)
    except Exception:  # noqa: BLE001 - numpy refuses with BufferError, TypeError or RuntimeError as the case may be
        return None
    return view if str(view.dtype) == str(tensor.dtype) else None


def checked_inputs(inputs: Sequence[np.ndarray], specs: Sequence[InputSpec]) -> list[np.ndarray]:
    """``inputs`` as C-ordered arrays; ValueError naming the input whose count, shape or dtype is not ``specs``', or
    that indexes a table with a value outside its rows (the compiled gather would read outside the table)."""
    if len(inputs) != len(specs):
        names = [spec.name for spec in specs]
        raise ValueError(f"the model takes {len(specs)} inputs ({names}), got {len(inputs)}")
    arrays = []
    for array, spec in zip(inputs, specs):
        array = np.asarray(array, order="C")
        if array.shape != spec.shape or array.dtype != np.dtype(spec.dtype):
            raise ValueError(
                f"input {spec.name!r} must be {spec.dtype}{list(spec.shape)}, got {array.dtype}{list(array.shape)}"
            )
        if spec.table_rows is not None:
            _check_rows(array, spec.name, spec.table_rows)
        arrays.append(array)
    return arrays


def _check_rows(array: np.ndarray, name: str, rows: int) -> None:
    """ValueError if ``array``, an input that indexes a table of ``rows`` rows, holds an index outside [-rows, rows)."""
    outside = (array < -rows) | (array >= rows)
    if outside.any():
        where = tuple(int(i) for i in np.argwhere(outside)[0])
        raise ValueError(f"input {name!r} indexes a table of {rows} rows: its values must lie in [{-rows}, {rows - 1}], "
                         f"got {array[where]} at {where}")
