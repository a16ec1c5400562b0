"""The probabilistic schedule language.

``Schedule`` wraps ``tvm.s_tir.Schedule``. Every primitive and sampling
instruction applied through it is recorded in a Rust ``Trace``; the random
variables handed to callers are small ``RV`` handles, so a trace can be
replayed on a fresh copy of the workload — with its own decisions, with
changed ones, or with none (fresh samples) — and give the same program.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import s_tir
from tvm.ir import IRModule
from tvm.tirx import PrimFunc

from probtune._core import (
    InvalidDecisionError,
    Rng,
    Trace,
    TraceFormatError,
    check_categorical,
    check_perfect_tile,
    sample_categorical,
    sample_perfect_tile,
)
from probtune.errors import ReplayError, last_line
from probtune.schedule.analysis import identity

__all__ = [
    "PRIMITIVES",
    "PRIMITIVE_KINDS",
    "RV",
    "SAMPLING_KINDS",
    "BlockRV",
    "ExprRV",
    "InstructionKind",
    "LoopRV",
    "Schedule",
    "tvm_compute_location",
]


class RV:
    """A random variable of the trace: a block, a loop or an integer."""

    __slots__ = ("id",)

    def __init__(self, rv_id: int) -> None:
        self.id = rv_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.id == self.id  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.id))


class BlockRV(RV):
    __slots__ = ()


class LoopRV(RV):
    __slots__ = ()


class ExprRV(RV):
    """An integer random variable (a sampled tile size or categorical value)."""

    __slots__ = ()


@dataclass(frozen=True)
class InstructionKind:
    """A schedule instruction: how it applies to a TVM schedule and what it outputs.

    ``apply(tvm_schedule, inputs, attrs)`` gets the inputs with random
    variables resolved to TVM's and the attributes as recorded; it returns the
    outputs (a list if ``many``), which become ``output`` handles. The schedule
    language's own kinds are :data:`PRIMITIVES`; a plugin adds more through
    ``probtune_register_instructions``. A kind a realize helper must replay is
    pickled, so ``apply`` should be a module-level function.
    """

    name: str
    apply: Callable[[s_tir.Schedule, list[Any], dict[str, Any]], Any]
    output: type[RV] | None = None  # None: no outputs
    many: bool = False  # ``apply`` returns a list of outputs


def _annotate(s: s_tir.Schedule, ins: list[Any], at: dict[str, Any]) -> None:
    value = ins[1] if len(ins) > 1 else at["ann_val"]
    s.annotate(ins[0], at["ann_key"], value)


class _LocationMark:
    """A compute location that is not a loop: "at the root" (-1) or "inlined" (-2), as TVM's marks."""

    def __init__(self, decision: int) -> None:
        self.decision = decision

    def __repr__(self) -> str:
        return f"_LocationMark({self.decision})"


_AT_ROOT, _INLINED = _LocationMark(-1), _LocationMark(-2)


def _compute_at(s: s_tir.Schedule, ins: list[Any], at: dict[str, Any]) -> None:
    if ins[1] is _AT_ROOT:
        return
    if ins[1] is _INLINED:
        s.compute_inline(ins[0])
        return
    s.compute_at(ins[0], ins[1], preserve_unit_loops=at.get("preserve_unit_loops", True))


def _int_attr(attrs: dict[str, Any], name: str, default: int | None = None) -> int:
    """An integer attribute of an instruction; a trace from JSON may hold anything there.

    JSON integers too large for 64 bits arrive as floats, and ``int()`` would
    truncate a fraction, so anything but an int is a malformed trace.
    """
    value = attrs.get(name, default)
    if value is None:
        raise TraceFormatError(f"attribute {name!r} is missing")
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceFormatError(f"attribute {name!r} must be an integer, got {value!r}")
    return value


def _known_compute_location(s: s_tir.Schedule, block: Any, decision: int) -> Any:
    """The location a recorded decision names, without TVM's search for every legal one.

    TVM's ``sample_compute_location`` checks each loop of the consumer by a
    trial ``compute_at`` (up to 7 ms for a conv2d padding block) even when the
    decision is given. The decision is an index into the first consumer's
    loops, or a mark; whether the block can really go there is checked by
    the ``compute_at`` that follows, which raises if it cannot.
    """
    if decision == -1:
        return _AT_ROOT
    if decision == -2:
        return _INLINED
    consumers = s.get_consumers(block) if decision >= 0 else []
    loops = s.get_loops(consumers[0]) if consumers else []
    if not 0 <= decision < len(loops):
        raise InvalidDecisionError(
            f"compute location {decision} is not a location for this block "
            f"(-2 inline, -1 root, or one of its consumer's {len(loops)} loops)"
        )
    return loops[decision]


_BUILTIN_KINDS = (
    InstructionKind("get_sblock", lambda s, ins, at: s.get_sblock(at["name"], at.get("func_name", "main")), BlockRV),
    InstructionKind("get_loops", lambda s, ins, at: s.get_loops(ins[0]), LoopRV, many=True),
    InstructionKind("get_child_blocks", lambda s, ins, at: s.get_child_blocks(ins[0]), BlockRV, many=True),
    InstructionKind("get_producers", lambda s, ins, at: s.get_producers(ins[0]), BlockRV, many=True),
    InstructionKind("get_consumers", lambda s, ins, at: s.get_consumers(ins[0]), BlockRV, many=True),
    InstructionKind(
        "split",
        lambda s, ins, at: s.split(ins[0], ins[1:], preserve_unit_iters=at.get("preserve_unit_iters", True)),
        LoopRV,
        many=True,
    ),
    InstructionKind("fuse", lambda s, ins, at: s.fuse(*ins, preserve_unit_iters=at.get("preserve_unit_iters", True)), LoopRV),
    InstructionKind("reorder", lambda s, ins, at: s.reorder(*ins)),
    InstructionKind("parallel", lambda s, ins, at: s.parallel(ins[0])),
    InstructionKind("vectorize", lambda s, ins, at: s.vectorize(ins[0])),
    InstructionKind("unroll", lambda s, ins, at: s.unroll(ins[0])),
    InstructionKind("compute_at", _compute_at),
    InstructionKind(
        "reverse_compute_at",
        lambda s, ins, at: s.reverse_compute_at(ins[0], ins[1], preserve_unit_loops=at.get("preserve_unit_loops", True)),
    ),
    InstructionKind("compute_inline", lambda s, ins, at: s.compute_inline(ins[0])),
    InstructionKind("reverse_compute_inline", lambda s, ins, at: s.reverse_compute_inline(ins[0])),
    InstructionKind("cache_read", lambda s, ins, at: s.cache_read(ins[0], at["read_buffer_index"], at["storage_scope"]), BlockRV),
    InstructionKind("cache_write", lambda s, ins, at: s.cache_write(ins[0], at["write_buffer_index"], at["storage_scope"]), BlockRV),
    InstructionKind("rfactor", lambda s, ins, at: s.rfactor(ins[0], at["factor_axis"]), BlockRV),
    InstructionKind("decompose_reduction", lambda s, ins, at: s.decompose_reduction(ins[0], ins[1]), BlockRV),
    InstructionKind("annotate", _annotate),
    InstructionKind("bind", lambda s, ins, at: s.bind(ins[0], at["thread_axis"])),
    InstructionKind("set_scope", lambda s, ins, at: s.set_scope(ins[0], at["buffer_index"], at["storage_scope"])),
    InstructionKind(
        "storage_align", lambda s, ins, at: s.storage_align(ins[0], at["buffer_index"], at["axis"], at["factor"], at["offset"])
    ),
    InstructionKind("unannotate", lambda s, ins, at: s.unannotate(ins[0], at["ann_key"])),
    InstructionKind("blockize", lambda s, ins, at: s.blockize(ins[0], preserve_unit_iters=at.get("preserve_unit_iters", True)), BlockRV),
)

PRIMITIVES: dict[str, InstructionKind] = {kind.name: kind for kind in _BUILTIN_KINDS}
"""The schedule language's own instruction kinds, by name."""

SAMPLING_KINDS = ("sample_perfect_tile", "sample_categorical", "sample_compute_location")
PRIMITIVE_KINDS = tuple(PRIMITIVES)
_TVM_SEED_RANGE = (1, 2**31 - 1)


def _encode(value: Any) -> Any:
    """Turn an argument into its trace form: RVs become ``{"rv": id}``."""
    if isinstance(value, RV):
        return {"rv": value.id}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    return value


def _without_argument_checks(schedule_class: type[s_tir.Schedule]) -> type[s_tir.Schedule]:
    """``schedule_class`` with TVM's Python-side argument type checks removed.

    TVM wraps each schedule method in a checker that inspects every argument's
    type hints on every call; that took about 80% of the time of replaying a
    trace and validating it. Our arguments come from recorded traces of the
    same program, and TVM's C++ side still checks everything it relies on.
    """
    unchecked = {}
    for klass in reversed(schedule_class.__mro__):
        for name, attr in vars(klass).items():
            if inspect.isfunction(attr) and inspect.isfunction(getattr(attr, "__wrapped__", None)):
                unchecked[name] = attr.__wrapped__  # type: ignore[attr-defined]
    return type(f"Unchecked{schedule_class.__name__}", (schedule_class,), unchecked)


_TVMSchedule = _without_argument_checks(s_tir.Schedule)
_PRISTINE: OrderedDict[int, tuple[Any, s_tir.Schedule]] = OrderedDict()  # identity of a program -> (it, its schedule)
_MAX_PRISTINE = 8


def _new_tvm_schedule(mod: tvm.IRModule | tvm.tirx.PrimFunc) -> s_tir.Schedule:
    """A TVM schedule of ``mod``: a copy of an untouched one kept per program.

    Building a schedule analyses the whole program (about 0.5 ms for a conv2d);
    copying one costs 1% of that, and the search replays thousands of traces
    of one program. The kept entry holds on to the program, so its identity
    cannot pass to another program meanwhile.
    """
    key = identity(mod)
    entry = _PRISTINE.get(key)
    if entry is None:
        entry = _PRISTINE[key] = (mod, _TVMSchedule(mod))
        while len(_PRISTINE) > _MAX_PRISTINE:
            _PRISTINE.popitem(last=False)
    _PRISTINE.move_to_end(key)
    copy = _TVMSchedule.__new__(_TVMSchedule)  # type: ignore[call-overload]
    copy.__move_handle_from__(entry[1].copy())  # ``copy`` returns TVM's checked class; keep the unchecked one
    return copy


def tvm_compute_location(sch: s_tir.Schedule, block: Any, rng: Rng) -> tuple[Any, int]:
    """TVM's ``sample_compute_location`` on ``block``, seeded from ``rng``: a legal location and its decision."""
    sch.seed(rng.randint(*_TVM_SEED_RANGE))
    loop = sch.sample_compute_location(block)
    return loop, int(sch.trace.decisions[sch.trace.insts[-1]])


class Schedule:
    """A TVM schedule of one workload whose every step is recorded in a trace."""

    def __init__(
        self,
        mod: tvm.IRModule | tvm.tirx.PrimFunc,
        *,
        rng: Rng | int = 0,
        instructions: Mapping[str, InstructionKind] | None = None,
    ) -> None:
        """``instructions``: kinds beyond the language's own (plugins'), which this schedule can then apply and replay."""
        self._sch = _new_tvm_schedule(mod)
        self._plugin_kinds = instructions or {}
        self._rng = rng if isinstance(rng, Rng) else Rng(rng)
        self._trace = Trace()
        self._values: dict[int, Any] = {}
        self._next_id = 0

    def fork(self) -> Schedule:
        """An independent copy, as far as it went: the same program, trace and random variables, a forked generator."""
        other = Schedule.__new__(Schedule)
        other._sch = _TVMSchedule.__new__(_TVMSchedule)  # type: ignore[call-overload]
        other._sch.__move_handle_from__(self._sch.copy())  # the copy keeps the random variables' bindings
        other._plugin_kinds = self._plugin_kinds
        other._rng = self._rng.fork()
        other._trace = self._trace.copy()
        other._values = dict(self._values)
        other._next_id = self._next_id
        return other

    # ---- reading ---------------------------------------------------------------
    @property
    def mod(self) -> tvm.IRModule:
        """The transformed program."""
        return self._sch.mod

    @property
    def tvm(self) -> s_tir.Schedule:
        """The underlying TVM schedule, for analysis and validators (changes made here are not traced)."""
        return self._sch

    @property
    def trace(self) -> Trace:
        """A (cheap) copy of the trace recorded so far."""
        return self._trace.copy()

    @property
    def rng(self) -> Rng:
        return self._rng

    def get(self, rv: RV) -> Any:
        """The concrete value of a random variable: an int, a ``tirx.For`` or an ``SBlock``."""
        value = self._values[rv.id]
        return value if isinstance(value, int) else self._sch.get(value)

    def resolve(self, rv: RV) -> Any:
        """The TVM random variable (or int) behind ``rv``, for analysis on :attr:`tvm`."""
        return self._values[rv.id]

    def loop_extent(self, loop: LoopRV) -> int | None:
        """A loop's constant extent, or None for a dynamic loop."""
        extent = self.get(loop).extent
        return int(extent) if isinstance(extent, tvm.tirx.IntImm) else None

    # ---- recording -------------------------------------------------------------
    def _resolve(self, value: Any) -> Any:
        if isinstance(value, dict) and set(value) == {"rv"}:
            return self._values[value["rv"]]
        if isinstance(value, list):
            return [self._resolve(v) for v in value]
        return value

    def _bind(self, values: list[Any], output_ids: Sequence[int] | None) -> list[int]:
        if output_ids is None:
            output_ids = list(range(self._next_id, self._next_id + len(values)))
        elif len(output_ids) != len(values):
            raise TraceFormatError(f"the trace names {len(output_ids)} outputs, the program gives {len(values)}")
        for rv_id, value in zip(output_ids, values):
            self._values[rv_id] = value
        self._next_id = max([self._next_id, *(i + 1 for i in output_ids)])
        return list(output_ids)

    def apply(
        self,
        kind: str,
        inputs: Sequence[Any] = (),
        attrs: dict[str, Any] | None = None,
        *,
        decision: Any = None,
        output_ids: Sequence[int] | None = None,
    ) -> list[RV]:
        """Apply one instruction (trace form: RVs as ``{"rv": id}``) and record it.

        This is the single path used both when modules build a program and when a
        trace is replayed, which is what makes replay give the same program.
        """
        attrs = dict(attrs or {})
        inputs = [_encode(v) for v in inputs]
        resolved = [self._resolve(v) for v in inputs]
        if kind in SAMPLING_KINDS:
            values, decision, out_type = self._sample(kind, resolved, attrs, decision)
        elif (prim := PRIMITIVES.get(kind) or self._plugin_kinds.get(kind)) is not None:  # the language's own first
            if decision is not None:
                raise InvalidDecisionError(f"{kind} is not a sampling instruction and takes no decision")
            result = prim.apply(self._sch, resolved, attrs)
            values = [] if prim.output is None else (list(result) if prim.many else [result])
            out_type = prim.output or RV
        else:
            raise TraceFormatError(
                f"unknown instruction kind {kind!r}; known: {', '.join([*PRIMITIVES, *self._plugin_kinds, *SAMPLING_KINDS])} "
                "(a kind a plugin adds is known where the plugin is installed: `probtune plugins` lists them)"
            )
        ids = self._bind(values, output_ids)
        self._trace.append(kind, inputs, attrs, ids, decision)
        return [out_type(i) for i in ids]

    def _sample(self, kind: str, inputs: list[Any], attrs: dict[str, Any], decision: Any) -> tuple[list[Any], Any, type[RV]]:
        if kind == "sample_perfect_tile":
            extent = self._sch.get(inputs[0]).extent
            if not isinstance(extent, tvm.tirx.IntImm):
                raise InvalidDecisionError(f"sample_perfect_tile needs a constant loop extent, got {extent}")
            n, max_inner = _int_attr(attrs, "n"), _int_attr(attrs, "max_innermost_factor", 0)
            max_product = _int_attr(attrs, "max_inner_product", 0)
            if decision is None:
                decision = sample_perfect_tile(self._rng, int(extent), n, max_inner, max_product)
            else:
                check_perfect_tile(list(decision), int(extent), n, max_inner, max_product)
            return list(decision), list(decision), ExprRV
        if kind == "sample_categorical":
            candidates = list(attrs["candidates"])
            if decision is None:
                decision = sample_categorical(self._rng, list(attrs["probs"]))
            else:
                check_categorical(int(decision), len(candidates))
            return [int(candidates[decision])], int(decision), ExprRV
        # sample_compute_location: TVM knows the legal locations and samples one (seeded from our stream)
        if decision is not None:
            return [_known_compute_location(self._sch, inputs[0], int(decision))], int(decision), LoopRV
        loop, taken = tvm_compute_location(self._sch, inputs[0], self._rng)
        return [loop], taken, LoopRV

    # ---- replay ----------------------------------------------------------------
    @classmethod
    def replay(
        cls,
        mod: IRModule | PrimFunc,
        trace: Trace,
        *,
        rng: Rng | int = 0,
        until: int | None = None,
        instructions: Mapping[str, InstructionKind] | None = None,
    ) -> Schedule:
        """Apply ``trace`` to ``mod``; sampling instructions without a decision sample fresh ones from ``rng``.

        ``until`` stops before that instruction index (a mutator replays up to the decision it changes);
        ``instructions`` are the plugins' kinds the trace may hold (a space's ``context.instructions``).
        """
        sch = cls(mod, rng=rng, instructions=instructions)
        sch.replay_more(trace, 0, until)
        return sch

    def replay_more(self, trace: Trace, start: int, until: int | None = None) -> None:
        """Go on replaying ``trace`` from instruction ``start`` (up to ``until``) on this schedule, replayed that far.

        A draw can then be judged half-way (:meth:`DesignSpace.draw
        <probtune.space.design_space.DesignSpace.draw>`) and finished only if it is kept.
        """
        decisions = trace.decisions
        for index, inst in enumerate(trace.instructions[start:until], start):
            try:
                self.apply(inst.kind, inst.inputs, inst.attrs, decision=decisions.get(index), output_ids=inst.outputs)
            except InvalidDecisionError as exc:
                raise InvalidDecisionError(f"instruction {index} ({inst.kind}): {exc}") from None
            except TraceFormatError as exc:
                raise TraceFormatError(f"instruction {index} ({inst.kind}): {exc}") from None
            except (RuntimeError, KeyError, IndexError, TypeError, ValueError, OverflowError) as exc:  # TVM: RuntimeError
                raise ReplayError(f"instruction {index} ({inst.kind}) cannot be applied: {last_line(exc)}") from exc

    # ---- primitives ------------------------------------------------------------
    def get_sblock(self, name: str, func_name: str = "main") -> BlockRV:
        return self.apply("get_sblock", [], {"name": name, "func_name": func_name})[0]  # type: ignore[return-value]

    def get_loops(self, block: BlockRV) -> list[LoopRV]:
        return self.apply("get_loops", [block])  # type: ignore[return-value]

    def get_child_blocks(self, block_or_loop: BlockRV | LoopRV) -> list[BlockRV]:
        return self.apply("get_child_blocks", [block_or_loop])  # type: ignore[return-value]

    def get_producers(self, block: BlockRV) -> list[BlockRV]:
        return self.apply("get_producers", [block])  # type: ignore[return-value]

    def get_consumers(self, block: BlockRV) -> list[BlockRV]:
        return self.apply("get_consumers", [block])  # type: ignore[return-value]

    def split(self, loop: LoopRV, factors: Sequence[ExprRV | int | None], *, preserve_unit_iters: bool = True) -> list[LoopRV]:
        return self.apply("split", [loop, *factors], {"preserve_unit_iters": preserve_unit_iters})  # type: ignore[return-value]

    def fuse(self, *loops: LoopRV, preserve_unit_iters: bool = True) -> LoopRV:
        return self.apply("fuse", loops, {"preserve_unit_iters": preserve_unit_iters})[0]  # type: ignore[return-value]

    def reorder(self, *loops: LoopRV) -> None:
        self.apply("reorder", loops)

    def parallel(self, loop: LoopRV) -> None:
        self.apply("parallel", [loop])

    def vectorize(self, loop: LoopRV) -> None:
        self.apply("vectorize", [loop])

    def unroll(self, loop: LoopRV) -> None:
        self.apply("unroll", [loop])

    def bind(self, loop: LoopRV, thread_axis: str) -> None:
        """Bind ``loop`` to a GPU thread axis, named by its tag ("blockIdx.x", "vthread.x", ...)."""
        self.apply("bind", [loop], {"thread_axis": thread_axis})

    def compute_at(self, block: BlockRV, loop: LoopRV, *, preserve_unit_loops: bool = True) -> None:
        self.apply("compute_at", [block, loop], {"preserve_unit_loops": preserve_unit_loops})

    def reverse_compute_at(self, block: BlockRV, loop: LoopRV, *, preserve_unit_loops: bool = True) -> None:
        self.apply("reverse_compute_at", [block, loop], {"preserve_unit_loops": preserve_unit_loops})

    def compute_inline(self, block: BlockRV) -> None:
        self.apply("compute_inline", [block])

    def reverse_compute_inline(self, block: BlockRV) -> None:
        self.apply("reverse_compute_inline", [block])

    def cache_read(self, block: BlockRV, read_buffer_index: int, storage_scope: str = "global") -> BlockRV:
        attrs = {"read_buffer_index": read_buffer_index, "storage_scope": storage_scope}
        return self.apply("cache_read", [block], attrs)[0]  # type: ignore[return-value]

    def cache_write(self, block: BlockRV, write_buffer_index: int, storage_scope: str = "global") -> BlockRV:
        attrs = {"write_buffer_index": write_buffer_index, "storage_scope": storage_scope}
        return self.apply("cache_write", [block], attrs)[0]  # type: ignore[return-value]

    def set_scope(self, block: BlockRV, buffer_index: int, storage_scope: str) -> None:
        """Put the buffer ``block`` writes at ``buffer_index`` in ``storage_scope`` ("shared", "local", ...)."""
        self.apply("set_scope", [block], {"buffer_index": buffer_index, "storage_scope": storage_scope})

    def storage_align(self, block: BlockRV, buffer_index: int, axis: int, factor: int, offset: int) -> None:
        """Pad ``axis`` of the buffer ``block`` writes so that its stride is ``offset`` modulo ``factor`` (bank conflicts)."""
        attrs = {"buffer_index": buffer_index, "axis": axis, "factor": factor, "offset": offset}
        self.apply("storage_align", [block], attrs)

    def rfactor(self, loop: LoopRV, factor_axis: int) -> BlockRV:
        return self.apply("rfactor", [loop], {"factor_axis": factor_axis})[0]  # type: ignore[return-value]

    def blockize(self, loop: LoopRV, *, preserve_unit_iters: bool = True) -> BlockRV:
        """Make the loop nest under ``loop`` one block (a tensor intrinsic's whole tile), returned; the nest stays inside it."""
        return self.apply("blockize", [loop], {"preserve_unit_iters": preserve_unit_iters})[0]  # type: ignore[return-value]

    def decompose_reduction(self, block: BlockRV, loop: LoopRV) -> BlockRV:
        return self.apply("decompose_reduction", [block, loop])[0]  # type: ignore[return-value]

    def annotate(self, block_or_loop: BlockRV | LoopRV, key: str, value: ExprRV | int | float | str) -> None:
        if isinstance(value, ExprRV):
            self.apply("annotate", [block_or_loop, value], {"ann_key": key})
        else:
            self.apply("annotate", [block_or_loop], {"ann_key": key, "ann_val": value})

    def unannotate(self, block_or_loop: BlockRV | LoopRV, key: str) -> None:
        self.apply("unannotate", [block_or_loop], {"ann_key": key})

    # ---- sampling instructions -------------------------------------------------
    def sample_perfect_tile(self, loop: LoopRV, n: int, max_innermost_factor: int = 16, max_inner_product: int = 0) -> list[ExprRV]:
        """Sample ``n`` tile sizes whose product is the loop's extent.

        ``max_inner_product`` (if positive) bounds the product of every size
        but the outermost: the tile one outer iteration covers.
        """
        attrs = {"n": n, "max_innermost_factor": max_innermost_factor}
        if max_inner_product > 0:
            attrs["max_inner_product"] = max_inner_product
        return self.apply("sample_perfect_tile", [loop], attrs)  # type: ignore[return-value]

    def sample_categorical(self, candidates: Sequence[int], probs: Sequence[float]) -> ExprRV:
        """Sample one of ``candidates`` with the given probabilities."""
        if len(candidates) != len(probs):
            raise ValueError(f"{len(candidates)} candidates but {len(probs)} probabilities")
        attrs = {"candidates": [int(c) for c in candidates], "probs": [float(p) for p in probs]}
        return self.apply("sample_categorical", [], attrs)[0]  # type: ignore[return-value]

    def sample_uniform(self, candidates: Sequence[int]) -> ExprRV:
        """Sample one of ``candidates``, each as likely (recorded as ``sample_categorical``)."""
        return self.sample_categorical(candidates, [1.0 / len(candidates)] * len(candidates))

    def sample_compute_location(self, block: BlockRV) -> LoopRV:
        """Sample a loop at which ``block`` can be computed (or the root / inline marks)."""
        return self.apply("sample_compute_location", [block])[0]  # type: ignore[return-value]
