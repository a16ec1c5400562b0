"""Features of finished s_tir programs for a learned cost model, read without lowering.

A candidate is featurized as scheduled (``DesignSpace.realize`` output): lowering
costs tens of milliseconds per program, more than the model saves. In the spirit
of TVM MetaSchedule's per-store features, one statement walk visits every buffer
store with the loops around it and describes it by a fixed-length row; a program
is then one vector, so any regressor can learn from it.

Access patterns are read from the index expressions: each block iterator is
rewritten as a linear function of the loop variables (``floordiv``/``floormod``
by constants are approximated linearly), which gives, for every accessed buffer,
its stride along each loop and the box of elements a set of inner loops touches.

Layout. Every column is log2(1 + x) of a non-negative raw quantity x (so flags
stay 0/1 and counts, sizes and strides are compressed); ``STORE_FEATURE_NAMES``
and ``ProgramFeatures.names`` name the columns.

``ProgramFeatures(extractors)(mod)``: float32, ``2 + 2 * 145 = 292`` columns
(``BASE_FEATURE_NAMES``), then those of the feature extractors:
    ``num_stores``, ``total_float_ops`` (whole program), then ``sum.*``: the
    sum of all store rows, then ``main.*``: the row of the store with the most
    float operations (the first such; zeros if the program has no store),
    then each extractor's columns (``<name>.<column>``, log2(1 + x) of what
    it gives), in the order given; :meth:`ProgramFeatures.registered` orders
    the registered extractors by name (probtune-cuda's ``gpu``: 11 columns of
    threads, memories and tensor cores, all zero for a CPU program).

``store_features(mod)``: float32, one row per buffer store in program order
(a reduction's init and update are two stores), 145 columns:
    - ``ops.<kind>`` (7): operations in the stored value per iteration; kinds:
      float_add (add/sub), float_mul, float_div (div/mod), float_cmp
      (min/max/compare), float_math (calls such as exp), int (integer and
      boolean arithmetic, logic), select (``Select``, ``if_then_else``).
    - ``total.<kind>`` (7): the same times the loop nest's iterations.
    - loop nest (17): ``loops``, ``nontrivial_loops`` (extent > 1),
      ``iterations``, ``innermost_extent`` (of the innermost non-trivial
      loop); for ``parallel``, ``vectorized`` and ``unrolled`` loops ``.count``
      and ``.extent`` (product of extents), ``parallel.position`` (non-trivial
      loops outside the outermost parallel one), ``vectorized.innermost_extent``
      (the vector width: 1 if none), ``vectorized.is_innermost``;
      ``serial.count``; ``auto_unroll.max_step`` (the ``AUTO_UNROLL_KEY``
      annotation in scope), ``auto_unroll.copies`` (body copies unrolling will
      make: inner loop extents multiplied while they fit the step; 1 if none);
      ``iterations_per_job`` (iterations / parallel extent).
    - block (5): ``is_reduction`` (has a reduction iterator), ``is_constant``
      (the value reads no buffer: an init), ``is_copy`` (the value is a
      single load: a cache stage), ``writes_intermediate`` (the buffer is not
      a parameter: inside a cache-write stage), ``accumulates`` (reads the
      buffer it writes).
    - reads (4): ``reads.count``; reads with stride 0 (``reads.reuse``), at
      most 1 (``reads.contiguous``) or more (``reads.strided``) along the
      innermost non-trivial loop.
    - ``arithmetic_intensity`` (1): total float ops per byte of the nest's working set.
    - ``working_set.<level>.bytes`` / ``.lines`` (12): bytes of the distinct
      elements, and of the 64-byte cache lines, that the accesses of all
      buffers touch within a level. Levels (``LEVELS``): ``inner1``..``inner4``
      (the innermost 1-4 non-trivial loops), ``job`` (the loops inside the
      outermost parallel loop; all if none), ``nest`` (all loops).
    - 4 access slots (92): ``write``, then ``read0``..``read2`` (reads in
      program order, leaving out reads of the written buffer), 23 columns
      each: ``present``; ``stride`` (elements per iteration of the innermost
      non-trivial loop: 0 reused, 1 contiguous, more strided);
      ``nonzero_stride`` (of the innermost loop that moves the access);
      ``reuse_iterations`` (innermost iterations that reuse one element);
      ``buffer_bytes``; per level ``.bytes``, ``.lines`` (as above, this
      access only) and ``.reuse`` (accesses per distinct element).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import tvm
from tvm import s_tir, tirx
from tvm.ir import expr as ir_expr

from probtune.plugin import FeatureExtractor, as_list, child_stmts, get_registry, identity

__all__ = [
    "AUTO_UNROLL_KEY",
    "BASE_FEATURE_NAMES",
    "LEVELS",
    "STORE_FEATURE_NAMES",
    "ProgramFeatures",
    "store_features",
]

AUTO_UNROLL_KEY = "pragma_auto_unroll_max_step"
CACHE_LINE_BYTES = 64
LEVELS = ("inner1", "inner2", "inner3", "inner4", "job", "nest")
_OP_KINDS = ("float_add", "float_mul", "float_div", "float_cmp", "float_math", "int", "select")
_SLOTS = ("write", "read0", "read1", "read2")
_LOOP_NAMES = (
    "loops", "nontrivial_loops", "iterations", "innermost_extent",
    "parallel.count", "parallel.extent", "parallel.position",
    "vectorized.count", "vectorized.extent", "vectorized.innermost_extent", "vectorized.is_innermost",
    "unrolled.count", "unrolled.extent", "serial.count",
    "auto_unroll.max_step", "auto_unroll.copies", "iterations_per_job",
)
_BLOCK_NAMES = ("is_reduction", "is_constant", "is_copy", "writes_intermediate", "accumulates")
_READ_NAMES = ("reads.count", "reads.reuse", "reads.contiguous", "reads.strided")
_SLOT_NAMES = (
    "present", "stride", "nonzero_stride", "reuse_iterations", "buffer_bytes",
    *(f"{level}.{what}" for level in LEVELS for what in ("bytes", "lines", "reuse")),
)

STORE_FEATURE_NAMES: tuple[str, ...] = (
    tuple(f"ops.{k}" for k in _OP_KINDS)
    + tuple(f"total.{k}" for k in _OP_KINDS)
    + _LOOP_NAMES
    + _BLOCK_NAMES
    + _READ_NAMES
    + ("arithmetic_intensity",)
    + tuple(f"working_set.{level}.{what}" for level in LEVELS for what in ("bytes", "lines"))
    + tuple(f"{slot}.{name}" for slot in _SLOTS for name in _SLOT_NAMES)
)
BASE_FEATURE_NAMES: tuple[str, ...] = (
    "num_stores",
    "total_float_ops",
    *(f"sum.{n}" for n in STORE_FEATURE_NAMES),
    *(f"main.{n}" for n in STORE_FEATURE_NAMES),
)

_SERIAL, _PARALLEL, _VECTORIZED, _UNROLLED = (int(k) for k in (
    tirx.ForKind.SERIAL, tirx.ForKind.PARALLEL, tirx.ForKind.VECTORIZED, tirx.ForKind.UNROLLED))
_COMM_REDUCE = int(tirx.IterVar.CommReduce)
_CONST = -1  # key of a linear form's constant term; other keys are loop depths
_IF_THEN_ELSE = "prim.if_then_else"

# Value-expression nodes -> operation kind (index into _OP_KINDS); float kinds turn into "int" on integer operands.
_BINARY_KIND = {
    tirx.Add: 0, tirx.Sub: 0, tirx.Mul: 1, tirx.Div: 2, tirx.Mod: 2, tirx.FloorDiv: 2, tirx.FloorMod: 2,
    tirx.Min: 3, tirx.Max: 3, tirx.EQ: 3, tirx.NE: 3, tirx.LT: 3, tirx.LE: 3, tirx.GT: 3, tirx.GE: 3,
    tirx.And: 5, tirx.Or: 5, tirx.BitwiseAnd: 5, tirx.BitwiseOr: 5, tirx.BitwiseXor: 5,
    tirx.LShift: 5, tirx.RShift: 5,
}
_INT_KIND = 5
_SELECT_KIND = 6

Form = dict[int, float]  # linear form over loop depths (key _CONST: the constant term)


class _Loop(NamedTuple):
    extent: int
    kind: int


class _Buffer(NamedTuple):
    shape: np.ndarray  # elements per dimension, float64
    strides: np.ndarray  # row-major strides in elements
    itemsize: int
    is_param: bool
    nbytes: float  # computed once per buffer rather than once per access


def _int(expr: tvm.ir.expr.Expr, default: int = 1) -> int:
    """The value of a constant integer; ``default`` for a symbolic one."""
    return int(expr.value) if type(expr) is tirx.IntImm else default


def _add(a: Form, b: Form, sign: float = 1.0) -> Form:
    out = dict(a)
    for key, value in b.items():
        out[key] = out.get(key, 0.0) + sign * value
    return out


def _varying(form: Form) -> Form:
    return {k: v for k, v in form.items() if k != _CONST}


def _linear(expr: tvm.ir.expr.Expr, env: dict[int, Form]) -> Form:
    """``expr`` as a linear form over loop depths; non-linear parts keep only which loops they vary with."""
    kind = type(expr)
    if kind is tirx.Var:
        return env.get(identity(expr), {})
    if kind is tirx.IntImm or kind is tirx.FloatImm:
        return {_CONST: float(expr.value)}
    if kind is tirx.Add or kind is tirx.Sub:
        return _add(_linear(expr.a, env), _linear(expr.b, env), 1.0 if kind is tirx.Add else -1.0)
    if kind is tirx.Mul:
        a, b = _linear(expr.a, env), _linear(expr.b, env)
        if a.keys() <= {_CONST}:
            a, b = b, a
        if b.keys() <= {_CONST}:
            scale = b.get(_CONST, 0.0)
            return {k: v * scale for k, v in a.items()}
        return {k: 1.0 for k in (a.keys() | b.keys()) - {_CONST}}
    if kind in (tirx.FloorDiv, tirx.Div):
        a, b = _linear(expr.a, env), _linear(expr.b, env)
        divisor = b.get(_CONST, 0.0) if b.keys() <= {_CONST} else 0.0
        if divisor:
            return {k: v / divisor for k, v in a.items()}
        return {k: 1.0 for k in (a.keys() | b.keys()) - {_CONST}}
    if kind in (tirx.FloorMod, tirx.Mod):
        return _varying(_linear(expr.a, env))  # within one period the coefficients hold
    if kind is tirx.Cast:
        return _linear(expr.value, env)
    varying: set[int] = set()  # Min, Max, Select, calls...: depends on its variables, coefficient unknown
    for var in as_list(tirx.analysis.undefined_vars(expr)):
        varying |= env.get(identity(var), {}).keys()
    return {k: 1.0 for k in varying - {_CONST}}


def _scan_value(value: tvm.ir.expr.Expr) -> tuple[list[float], list[ir_expr.TensorLoad]]:
    """Count the operations of a stored value by kind and collect its loads (in program order)."""
    counts = [0.0] * len(_OP_KINDS)
    loads: list[ir_expr.TensorLoad] = []
    stack = [value]
    while stack:
        expr = stack.pop()
        kind = type(expr)
        if kind is ir_expr.TensorLoad:
            loads.append(expr)  # its indices are address arithmetic, not counted
        elif kind in _BINARY_KIND:
            op = _BINARY_KIND[kind]
            if op != _INT_KIND and not expr.a.ty.dtype.is_float:
                op = _INT_KIND
            counts[op] += 1
            stack += (expr.b, expr.a)
        elif kind is ir_expr.Call:
            if getattr(expr.op, "name", None) == _IF_THEN_ELSE:
                counts[_SELECT_KIND] += 1
            else:  # a call's type has no dtype where it returns a pointer (an intrinsic's operand address)
                dtype = getattr(expr.ty, "dtype", None)
                counts[4 if dtype is not None and dtype.is_float else _INT_KIND] += 1
            stack.extend(reversed(as_list(expr.args)))
        elif kind is tirx.Select:
            counts[_SELECT_KIND] += 1
            stack += (expr.false_value, expr.true_value, expr.condition)
        elif kind is tirx.Not:
            counts[_INT_KIND] += 1
            stack.append(expr.a)
        elif kind is tirx.Cast:
            stack.append(expr.value)
        elif kind is tirx.Let:
            stack += (expr.body, expr.value)
    return counts, loads


class _Store(NamedTuple):
    """What the walk records of one store; ``_rows`` turns all of a program's stores into features at once."""

    loops: tuple[_Loop, ...]
    unroll: int  # auto-unroll max step in scope
    ops: list[float]
    flags: tuple[bool, ...]  # _BLOCK_NAMES
    accesses: list[tuple[int, _Buffer, list[Form]]]  # (buffer hash, buffer, index forms): the write, then the reads


class _Walker:
    """One pass over a PrimFunc's statements, carrying the loops in scope to every store."""

    def __init__(self, func: tirx.PrimFunc) -> None:
        self.func = func
        self.env: dict[int, Form] = {}  # identity of a loop or block variable -> its linear form
        self.buffers: dict[int, _Buffer] = {}
        self.params = {identity(p) for p in as_list(func.params)}
        self.stores: list[_Store] = []

    def run(self) -> list[_Store]:
        stack: list[tuple[tirx.Stmt, tuple[_Loop, ...], int, bool]] = [(self.func.body, (), 0, False)]
        while stack:
            node, loops, unroll, reduction = stack.pop()
            kind = type(node)
            if kind is tirx.For:
                self.env[identity(node.loop_var)] = {len(loops): 1.0}
                step = int(node.annotations.get(AUTO_UNROLL_KEY, unroll))
                stack.append((node.body, (*loops, _Loop(_int(node.extent), int(node.kind))), step, reduction))
            elif kind is s_tir.SBlockRealize:
                block = node.block
                is_reduction = False
                for iter_var, value in zip(as_list(block.iter_vars), as_list(node.iter_values)):
                    self.env[identity(iter_var.var)] = _linear(value, self.env)
                    is_reduction |= int(iter_var.iter_type) == _COMM_REDUCE
                step = int(block.annotations.get(AUTO_UNROLL_KEY, unroll))
                stack.append((block.body, loops, step, is_reduction))
                if block.init is not None:
                    stack.append((block.init, loops, step, False))
            elif kind is tirx.BufferStore:
                self.stores.append(self._store(node, loops, unroll, reduction))
            else:
                stack.extend((c, loops, unroll, reduction) for c in reversed(child_stmts(node)))
        return self.stores

    def _buffer(self, var: tirx.Var) -> tuple[int, _Buffer]:
        key = identity(var)
        info = self.buffers.get(key)
        if info is None:
            shape = np.array([max(_int(d), 1) for d in as_list(var.shape)] or [1], dtype=np.float64)  # a 0-d buffer: one dim
            strides = np.ones_like(shape)
            strides[:-1] = np.cumprod(shape[::-1])[::-1][1:]
            itemsize = max(var.dtype.itemsize, 1)
            info = _Buffer(shape, strides, itemsize, key in self.params, np.prod(shape) * itemsize)
            self.buffers[key] = info
        return key, info

    def _store(self, store: tirx.BufferStore, loops: tuple[_Loop, ...], unroll: int, reduction: bool) -> _Store:
        ops, loads = _scan_value(store.value)
        accesses = []
        for buffer, indices in [(store.buffer, store.indices)] + [(load.source, load.indices) for load in loads]:
            key, info = self._buffer(buffer)
            forms = [_linear(index, self.env) for index in as_list(indices)]
            accesses.append((key, info, forms + [{}] * (len(info.shape) - len(forms))))
        write_key, write_info = accesses[0][:2]
        flags = (
            reduction,
            not loads,
            type(store.value) is ir_expr.TensorLoad,
            not write_info.is_param,
            any(key == write_key for key, _, _ in accesses[1:]),
        )
        return _Store(loops, unroll, ops, flags, accesses)


def _loop_features(store: _Store) -> list[float]:
    """The raw ``_LOOP_NAMES`` of one store's nest."""
    extents = [float(loop.extent) for loop in store.loops]
    kinds = [loop.kind for loop in store.loops]
    nontrivial = [i for i, e in enumerate(extents) if e > 1]
    iterations = math.prod(extents)

    def of_kind(kind: int) -> list[int]:
        return [i for i, k in enumerate(kinds) if k == kind]

    parallel, vectorized, unrolled = of_kind(_PARALLEL), of_kind(_VECTORIZED), of_kind(_UNROLLED)
    parallel_extent = math.prod(extents[i] for i in parallel)
    copies = 1.0  # what auto-unroll does: whole inner loops, while their iterations fit the step
    for i in reversed(nontrivial):
        if kinds[i] == _PARALLEL:
            break
        if kinds[i] == _UNROLLED or (kinds[i] != _VECTORIZED and copies * extents[i] <= store.unroll):
            copies *= extents[i]
        elif kinds[i] != _VECTORIZED:
            break
    return [
        len(kinds), len(nontrivial), iterations, extents[nontrivial[-1]] if nontrivial else 1.0,
        len(parallel), parallel_extent, sum(1 for i in nontrivial if parallel and i < parallel[0]),
        len(vectorized), math.prod(extents[i] for i in vectorized), extents[vectorized[-1]] if vectorized else 1.0,
        float(bool(nontrivial) and kinds[nontrivial[-1]] == _VECTORIZED),
        len(unrolled), math.prod(extents[i] for i in unrolled), kinds.count(_SERIAL),
        store.unroll, copies, iterations / parallel_extent,
    ]


def _rows(stores: list[_Store]) -> tuple[np.ndarray, np.ndarray]:
    """Raw (unscaled) feature rows of all stores and their float operations, computed together.

    Strides come from the index coefficients; footprints are boxes: per
    buffer dimension, the span the level's loops cover, at most the distinct
    positions they reach and the dimension's size.
    """
    num = len(stores)
    depth = max([len(s.loops) for s in stores] + [1])
    extents = np.ones((num, depth))
    kinds = np.full((num, depth), -1)
    for s, store in enumerate(stores):
        extents[s, : len(store.loops)] = [loop.extent for loop in store.loops]
        kinds[s, : len(store.loops)] = [loop.kind for loop in store.loops]
    # Levels' loops, for all stores at once: the innermost 1-4 non-trivial loops, those inside the outermost parallel one, all.
    nontrivial_loops = extents > 1
    nontrivial_within = np.cumsum(nontrivial_loops[:, ::-1], axis=1)[:, ::-1]  # non-trivial loops at or inside each loop
    is_parallel = kinds == _PARALLEL
    outermost_parallel = np.where(is_parallel.any(axis=1), is_parallel.argmax(axis=1), -1)
    masks = np.zeros((num, len(LEVELS), depth))
    for level, inner in enumerate((1, 2, 3, 4)):
        masks[:, level] = nontrivial_loops & (nontrivial_within <= inner)
    masks[:, 4] = np.arange(depth) > outermost_parallel[:, None]
    masks[:, 5] = 1.0
    log_extents = np.log(extents)
    level_iterations = np.exp(masks @ log_extents[:, :, None])[:, :, 0]  # stores x levels

    # One row per buffer dimension of every access; accesses are contiguous runs of rows.
    forms = [form for store in stores for _, _, access_forms in store.accesses for form in access_forms]
    coeffs = np.zeros((len(forms), depth))
    for row, form in enumerate(forms):
        for loop, value in form.items():
            if loop != _CONST:
                coeffs[row, loop] = value
    accesses = [(s, key, info) for s, store in enumerate(stores) for key, info, _ in store.accesses]
    access_store = np.array([s for s, _, _ in accesses])
    sizes = [len(info.shape) for _, _, info in accesses]
    starts = np.cumsum([0, *sizes[:-1]])
    lasts = starts + np.array(sizes) - 1
    row_store = np.repeat(access_store, sizes)
    shape = np.concatenate([info.shape for _, _, info in accesses])
    row_strides = np.concatenate([info.strides for _, _, info in accesses])
    itemsize = np.array([info.itemsize for _, _, info in accesses], dtype=np.float64)

    magnitude = np.abs(coeffs)
    spans = np.einsum("rl,rkl->rk", magnitude, (masks * (extents - 1.0)[:, None, :])[row_store])
    spans = np.minimum(1.0 + spans, shape[:, None])
    moves = np.exp(np.einsum("rl,rkl->rk", (magnitude > 0).astype(np.float64), (masks * log_extents[:, None, :])[row_store]))
    per_dim = np.minimum(spans, moves)
    unique = np.multiply.reduceat(per_dim, starts, axis=0)  # accesses x levels
    inner_lines = np.minimum(per_dim[lasts], np.ceil(spans[lasts] * itemsize[:, None] / CACHE_LINE_BYTES))
    nbytes = unique * itemsize[:, None]
    line_bytes = unique / per_dim[lasts] * inner_lines * CACHE_LINE_BYTES
    reuse = level_iterations[access_store] / unique

    flat = np.abs(np.add.reduceat(row_strides[:, None] * coeffs, starts, axis=0))  # accesses x loops
    nontrivial = extents[access_store] > 1
    positions = np.arange(depth)
    innermost = np.where(nontrivial, positions, -1).max(axis=1)
    first_moving = np.where(nontrivial & (flat > 0), positions, -1).max(axis=1)  # innermost loop that moves it
    index = np.arange(len(accesses))
    stride = np.where(innermost >= 0, flat[index, innermost], 0.0)
    nonzero_stride = np.where(first_moving >= 0, flat[index, first_moving], 0.0)
    reuse_iterations = np.exp((log_extents[access_store] * (positions > first_moving[:, None])).sum(axis=1))
    buffer_bytes = np.array([info.nbytes for _, _, info in accesses])

    # Working set: each distinct buffer of a store counts once, with its largest footprint.
    groups = {(s, key): g for g, (s, key) in enumerate(dict.fromkeys((s, key) for s, key, _ in accesses))}
    group_of = np.array([groups[s, key] for s, key, _ in accesses])
    group_bytes = np.zeros((len(groups), len(LEVELS)))
    group_lines = np.zeros((len(groups), len(LEVELS)))
    np.maximum.at(group_bytes, group_of, nbytes)
    np.maximum.at(group_lines, group_of, line_bytes)
    group_store = np.array([s for s, _ in groups])
    working_bytes = np.zeros((num, len(LEVELS)))
    working_lines = np.zeros((num, len(LEVELS)))
    np.add.at(working_bytes, group_store, group_bytes)
    np.add.at(working_lines, group_store, group_lines)

    is_read = np.ones(len(accesses), dtype=bool)
    is_read[np.cumsum([0] + [len(store.accesses) for store in stores[:-1]])] = False
    read_counts = [
        np.bincount(access_store[is_read & cls], minlength=num)
        for cls in (np.ones_like(is_read), stride == 0, (stride > 0) & (stride <= 1), stride > 1)
    ]

    access_features = np.concatenate([
        np.stack([np.ones(len(accesses)), stride, nonzero_stride, reuse_iterations, buffer_bytes], axis=1),
        np.stack([nbytes, line_bytes, reuse], axis=2).reshape(len(accesses), -1),
    ], axis=1)
    access_features = np.vstack([access_features, np.zeros(len(_SLOT_NAMES))])  # index -1: an empty slot
    slots = np.full((num, len(_SLOTS)), -1)
    first_access = 0
    for s, store in enumerate(stores):
        write_key = store.accesses[0][0]
        reads = [first_access + i for i, (key, _, _) in enumerate(store.accesses) if i and key != write_key]
        chosen = [first_access, *reads[: len(_SLOTS) - 1]]
        slots[s, : len(chosen)] = chosen
        first_access += len(store.accesses)

    ops = np.array([store.ops for store in stores], dtype=np.float64).reshape(num, len(_OP_KINDS))
    iterations = level_iterations[:, 5]
    float_ops = ops[:, :5].sum(axis=1) * iterations
    rows = np.concatenate([
        ops,
        ops * iterations[:, None],
        np.array([_loop_features(store) for store in stores]).reshape(num, len(_LOOP_NAMES)),
        np.array([store.flags for store in stores], dtype=np.float64).reshape(num, len(_BLOCK_NAMES)),
        np.stack(read_counts, axis=1),
        (float_ops / np.maximum(working_bytes[:, 5], 1.0))[:, None],
        np.stack([working_bytes, working_lines], axis=2).reshape(num, -1),
        access_features[slots].reshape(num, -1),
    ], axis=1)
    return rows, float_ops


def _main_func(program: tvm.IRModule | tirx.PrimFunc) -> tirx.PrimFunc:
    return program["main"] if isinstance(program, tvm.IRModule) else program


def store_features(program: tvm.IRModule | tirx.PrimFunc) -> np.ndarray:
    """One row per buffer store (columns: ``STORE_FEATURE_NAMES``), in program order."""
    stores = _Walker(_main_func(program)).run()
    if not stores:
        return np.zeros((0, len(STORE_FEATURE_NAMES)), dtype=np.float32)
    rows, _ = _rows(stores)
    return np.log2(1.0 + rows).astype(np.float32)


@dataclass(frozen=True)
class ProgramFeatures:
    """The fixed-length vector of a program (columns: ``names``): the store features, then each extractor's columns.

    ``extractors`` are feature extractors (``probtune.plugin.FeatureExtractor``),
    their columns appended in this order as ``<name>.<column>``, each
    log2(1 + x) of the raw quantity it gives. A dataclass, so that it pickles
    into the search's helper processes (the extractors with it).
    """

    extractors: tuple[FeatureExtractor, ...] = ()

    @classmethod
    def registered(cls) -> ProgramFeatures:
        """With every registered feature extractor, ordered by name (a plugin's load order does not move columns)."""
        extractors = get_registry().feature_extractors
        return cls(tuple(extractors[name] for name in sorted(extractors)))

    @property
    def names(self) -> tuple[str, ...]:
        return BASE_FEATURE_NAMES + tuple(f"{e.name}.{column}" for e in self.extractors for column in e.columns)

    def __call__(self, program: tvm.IRModule | tirx.PrimFunc) -> np.ndarray:
        func = _main_func(program)
        out = np.zeros(len(BASE_FEATURE_NAMES), dtype=np.float32)
        extra = [np.log2(1.0 + _extracted(extractor, func)) for extractor in self.extractors]
        stores = _Walker(func).run()
        if stores:
            rows, float_ops = _rows(stores)
            rows = np.log2(1.0 + rows)
            width = len(STORE_FEATURE_NAMES)
            out[0] = np.log2(1.0 + len(stores))
            out[1] = np.log2(1.0 + float_ops.sum())
            out[2 : 2 + width] = rows.sum(axis=0)
            out[2 + width : 2 + 2 * width] = rows[int(np.argmax(float_ops))]
        return np.concatenate([out, *extra], dtype=np.float32) if extra else out


def _extracted(extractor: FeatureExtractor, func: tirx.PrimFunc) -> np.ndarray:
    """An extractor's raw columns of ``func``, refused unless one finite non-negative value per column."""
    values = np.asarray(extractor.extract(func))
    if values.shape != (len(extractor.columns),) or not (np.isfinite(values) & (values >= 0)).all():
        raise ValueError(f"feature extractor {extractor.name!r} gave {values.shape} values, not {len(extractor.columns)} "
                         "finite non-negative ones")
    return values
