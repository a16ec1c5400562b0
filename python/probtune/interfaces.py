"""Small Protocols that plugins satisfy: plain Python objects, no FFI bridging."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from probtune.defaults import LOCAL, TARGET_PRECISIONS

if TYPE_CHECKING:
    import numpy as np
    import tvm

    from probtune._core import Rng, Trace
    from probtune.measure.results import BuildResult, MeasureReference, RunResult
    from probtune.schedule.schedule import BlockRV, InstructionKind, Schedule
    from probtune.workloads.workload import Workload

__all__ = [
    "Builder",
    "BuilderFactory",
    "BundleRuntime",
    "Compiler",
    "CostModel",
    "CostModelFactory",
    "DeviceCode",
    "FeatureExtractor",
    "GraphRewrite",
    "Mutator",
    "OnnxConverter",
    "Runner",
    "RunnerFactory",
    "SpaceContext",
    "SpaceModule",
    "TargetSpec",
    "Validator",
]




OnnxConverter = Callable[[Any, Any, dict[str, Any], int], Any]
"""``converter(bb, inputs, attrs, opset)``: an ONNX node TVM's Relax frontend lacks, as Relax (``relax.Tuple`` for several
outputs); see ``probtune_register_onnx_converters``."""

Compiler = Callable[["tvm.IRModule", dict[str, Any]], Any]
"""Compiles a finished program for a TVM target (dict form) into what ``tvm.compile`` returns; must pickle.

Optional methods: ``export(executable, path, workspace_dir)`` links the
shared library; ``device_code(mod, tvm_target) -> DeviceCode``, with the
attribute ``device_code_kind`` (a short name of the code's format, used as
its file extension), gives the program's machine code for its device and the table that
launches it, which a measurement bundle (:mod:`probtune.measure.bundle`) carries to
a machine without TVM, with the bundle runtimes that launch code of that
kind (:class:`BundleRuntime`).
"""


@dataclass(frozen=True)
class DeviceCode:
    """A program's machine code for its device, and the table that launches it without TVM (``Compiler.device_code``).

    A bundle writes ``code`` to a file named ``<name>.<kind>`` (the
    compiler's ``device_code_kind``) and puts its path, relative to the
    bundle, in the table under the key ``kind``. ``table`` is JSON-ready and
    the compiler's own, read by the bundle runtimes that launch that kind;
    the kernel reads only its ``launches`` list, to count them.
    """

    code: bytes
    table: Mapping[str, Any]


@dataclass(frozen=True)
class TargetSpec:
    """A named hardware target, as a plugin describes it; the kernel reads nothing target-specific from it.

    ``tvm_target`` is TVM's target in dict form (the string form is rejected by
    TVM 0.27). ``modules`` and ``validators`` name the design-space modules and
    validators used by default; ``mutators`` the mutators the search uses, with
    their probabilities (empty: every registered mutator, at its own).
    ``builder`` and ``runner`` name the registered factories that measure it
    by default. ``attrs`` holds what the target's own plugins read (a CPU's
    vector width, say), opaque to the kernel.
    """

    name: str
    description: str
    tvm_target: dict[str, Any]
    modules: tuple[str, ...]
    validators: tuple[str, ...] = ()
    mutators: Mapping[str, float] = field(default_factory=dict)
    builder: str = LOCAL
    runner: str = LOCAL
    attrs: Mapping[str, Any] = field(default_factory=dict)
    compiler: Compiler | None = None
    """How a finished program is compiled, by the builder and by :func:`probtune.compile_best` alike; None: ``tvm.compile``.

    It is sent to builder processes, so it must pickle (a module-level function or a small dataclass). Where it
    has a method ``export(executable, path, workspace_dir)``, shared libraries are written with it (a cross
    linker, say) rather than with ``executable.export_library`` (:func:`probtune.measure.codegen.export_with`)."""
    runs_here: Callable[[], str | None] | None = None
    """Asked before a local runner starts: why this machine cannot run the target's code, or None if it can.

    No callable: any machine can."""
    local_device: Callable[[], str] | None = None
    """The name of this machine's device for the target (a CPU's model): the local runner's records are kept under it,
    apart from other machines'. None: this machine's host name."""
    layouts: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """The data layouts the target's kernels are fastest in, by Relax operator, as TVM's ``ConvertLayout`` takes them.

    A model's operators are converted to these layouts before it is fused
    into tasks (:func:`probtune.model.tasks.fuse`); empty keeps the model's own."""
    graph_rewrites: tuple[str, ...] = ()
    """Registered graph rewrites (:class:`GraphRewrite`) applied in order to a model, in these layouts, before it is
    fused into tasks: another algorithm for some operators (Winograd convolution, say)."""
    precisions: tuple[str, ...] = TARGET_PRECISIONS
    """The precisions a model may be compiled in for this target (:mod:`probtune.model.precision`); another is refused
    before tuning starts."""
    concat_in_place: bool = False
    """Whether a model's concatenations are written by their producers, each into its stretch of the result
    (:mod:`probtune.model.concat_in_place`): the target's code must run a program whose output is a strided view
    into another tensor (TVM's LLVM code does, and a launch table that follows the view to the tensor it views)."""
    view_alignment: int = 1
    """The bytes to which the target's vector loads and stores must be aligned (a GPU's 16; 1: any). A program writes
    its output as a view into another tensor only where each element lies at the same address modulo these bytes as in
    the program's own output, so that an access aligned there stays aligned in the view."""
    split_concatenations: bool = True
    """Whether a function that concatenates many inputs is written as one loop nest per input
    (:mod:`probtune.model.concatenation`): a CPU then copies each stretch without a test per element; on a GPU each
    nest would be a kernel of its own (a DenseNet block's 7 to 25), where one kernel's tests cost less."""
    copies_in_product_reads: bool = False
    """Whether a copy that only products read (a float16 cast, a transpose, a slice) is computed by each product as it
    reads the copy's source (:mod:`probtune.model.copy_reads`): the target's product space must copy every operand tile
    into fast memory (a GPU's shared memory), where the copy costs nothing; a CPU's products read operands in place."""

    @property
    def num_cores(self) -> int:
        return int(self.tvm_target.get("num-cores", os.cpu_count() or 1))


@dataclass
class SpaceContext:
    """What a module or validator may consult: the workload and the target.

    ``instructions`` are the plugins' instruction kinds (beyond the schedule
    language's own) that the space's traces may hold: every replay gets them.
    """

    workload: Workload
    target: TargetSpec
    options: dict[str, Any] = field(default_factory=dict)
    instructions: Mapping[str, InstructionKind] = field(default_factory=dict)


@runtime_checkable
class SpaceModule(Protocol):
    """A reusable stochastic transformation applied to one block at a time.

    Optional: a ``prior(sch, ctx) -> float`` method, given the raw
    ``tvm.s_tir.Schedule`` of a fresh random draw of the space (replayed,
    before the validators), returns the probability in ``[0, 1]`` of keeping
    that draw; a draw not kept is drawn again (:meth:`DesignSpace.draw
    <probtune.space.design_space.DesignSpace.draw>`). It shapes where a search starts, not
    what it can reach: mutated and recorded traces are never weighed.

    Optional: ``after_blocks = True`` applies the module in a second pass,
    once every block went through the other modules (a module that binds
    what no other took must see the program's final structure).

    A choice of structure that a sampled value cannot express (a reduction
    split or not, say: a trace's steps cannot depend on its decisions) is
    made by forking: ``apply`` returns the other structures, each built on
    its own :meth:`Schedule.fork <probtune.schedule.schedule.Schedule.fork>`
    of ``sch`` taken before the change, and each becomes a sketch of the
    space, drawn as often as ``sch``'s.
    """

    name: str

    def apply(self, sch: Schedule, block: BlockRV, ctx: SpaceContext) -> Sequence[Schedule] | None:
        """Transform ``block`` through ``sch`` (recorded in its trace); do nothing if it does not apply. Returns the
        forks that hold the other structures, if any."""
        ...


@runtime_checkable
class Validator(Protocol):
    """Finishes a scheduled program or rejects it before it costs a measurement.

    ``check`` works on the raw ``tvm.s_tir.Schedule`` after a trace is replayed;
    what it changes is not part of the trace and is re-applied on every replay.
    It returns ``None`` to accept or a short reason to reject.
    """

    name: str

    def check(self, sch: tvm.s_tir.Schedule, ctx: SpaceContext) -> str | None: ...


@runtime_checkable
class GraphRewrite(Protocol):
    """Rewrites operators of a whole model (a Relax module) into a form the target runs faster.

    It must compute the same function (up to floating-point rounding, which
    the compiled model's check against its reference bounds) and leave what
    it does not apply to as it is.
    """

    name: str

    def rewrite(self, mod: tvm.IRModule, target: TargetSpec) -> tuple[tvm.IRModule, int]:
        """The rewritten module and the number of operators rewritten."""
        ...


@runtime_checkable
class Mutator(Protocol):
    """Proposes a neighbour of a trace by changing its decisions.

    ``probability`` is its weight among the mutators an evolutionary search
    uses. A mutator whose ``core_mutator`` attribute names a mutator built into
    ``probtune._core`` ("tile_size", "categorical") is applied in Rust without
    calling ``mutate``.
    """

    name: str
    probability: float

    def mutate(self, trace: Trace, rng: Rng, ctx: SpaceContext) -> Trace | None: ...


@runtime_checkable
class CostModel(Protocol):
    """Predicts which programs are fast; retrained as measurements arrive.

    ``featurize`` turns finished programs into whatever the model learns from
    (one array per program), so a search computes a candidate's features once
    and reuses them for prediction and, once measured, for training. Scores
    only need to rank: higher means faster. ``groups`` tell which samples are
    of the same workload, so latencies are compared only within a workload
    (this is what lets records of other workloads help on a new one).
    ``save``/``load`` carry the whole state, training samples included, so a
    model stored in the database continues where it stopped.

    Optional: a ``program_features`` attribute, a picklable function of one
    program giving what ``featurize`` gives for it, lets the evolutionary
    search featurize in its helper processes (see :mod:`probtune.search.realize`).
    """

    name: str

    def featurize(self, programs: Sequence[tvm.IRModule]) -> list[np.ndarray]: ...

    def update(
        self, features: Sequence[np.ndarray], latencies: Sequence[float | None], groups: Sequence[str]
    ) -> None:
        """Add measured samples (``None``: the candidate failed) and retrain."""
        ...

    def predict(self, features: Sequence[np.ndarray]) -> np.ndarray: ...

    @property
    def num_samples(self) -> int: ...

    def save(self) -> bytes: ...

    def load(self, data: bytes) -> None: ...


@runtime_checkable
class Builder(Protocol):
    """Compiles candidates into artifacts a runner can load; yields (index, result) as each finishes.

    Each program comes as an ``IRModule`` or as its ``tvm.ir.save_json`` text
    (what a search helper process sends back). A builder compiles it as the
    target says (:func:`probtune.measure.codegen.compile_for`), so that it runs as
    :func:`probtune.compile_best` will compile it.
    """

    name: str

    def build(
        self, programs: Sequence[tvm.IRModule | str], target: TargetSpec, workdir: str | os.PathLike[str]
    ) -> Iterator[tuple[int, BuildResult]]: ...

    def close(self) -> None: ...


@runtime_checkable
class Runner(Protocol):
    """Times artifacts and checks their outputs; yields (index, result) as each finishes.

    Optional: a ``device_name(target) -> str`` method names the device it measures ``target`` on; records are
    kept under the target and that device (:meth:`probtune.Database.measured_on`). Without it, the runner's name.
    """

    name: str

    def run(
        self,
        reference: MeasureReference,
        artifacts: Sequence[str | None],
        target: TargetSpec,
        *,
        stop_above: float | None = None,
    ) -> Iterator[tuple[int, RunResult]]:
        """``stop_above``: a candidate whose first timed repeat is slower than this many seconds
        per call is clearly not the best; it gets that one latency and no further repeats."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class BundleRuntime(Protocol):
    """Launches a bundle's device code (:class:`DeviceCode`) on a machine that has neither TVM nor probtune.

    ``name`` is the runtime's choice in a bundle's script (``run_bundle.py
    --runtime NAME``; ``tvm`` is the kernel's own). ``kinds`` are the kinds of
    device code it launches (``Compiler.device_code_kind``). ``source`` is the
    path of a self-contained Python file, copied into every bundle whose code
    is of one of ``kinds`` and loaded
    there by path, beside the bundle's script: it may import the standard
    library, numpy and what it launches with (imported when called), never
    probtune or TVM. See ``probtune_register_bundle_runtimes`` for what the
    file defines.
    """

    name: str
    kinds: tuple[str, ...]
    source: str


@runtime_checkable
class FeatureExtractor(Protocol):
    """Describes a scheduled program by a fixed list of columns that a cost model adds to its own features.

    ``name`` prefixes the columns (``<name>.<column>``); ``columns`` names
    them, in order, and never changes (a saved cost model names the columns
    its samples have). ``extract(func)`` gives their raw values for the
    ``main`` PrimFunc of a scheduled program (as the space realizes it, not
    lowered): one finite, non-negative float per column, zeros where the
    program has nothing it describes. It must pickle (a module-level class):
    the search featurizes in helper processes.
    """

    name: str
    columns: tuple[str, ...]

    def extract(self, func: tvm.tirx.PrimFunc) -> np.ndarray: ...


BuilderFactory = Callable[..., Builder]
RunnerFactory = Callable[..., Runner]
CostModelFactory = Callable[..., CostModel]
"""Called as ``factory(seed=int)``."""
