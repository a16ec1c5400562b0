"""Layout copies of constant parameters, made once instead of on every call: as the compiled model runs and as its tasks are timed.

A program may copy a parameter into another layout before computing with it
(the CPU space packs a weight into vector-wide panels). Where the parameter
is a constant (a model's weight), the program can instead read it already in
the copy's layout (TVM's ``transform_layout`` on the parameter, then the copy
inlined into its readers): the compiled model packs its weights so, once
(:mod:`probtune.model.prepack`), and :class:`MeasuredForm` times a model
task's candidates so, with the reference inputs put in the same layouts, so
that the tuner ranks the programs the model will run. Nothing here knows a
target: a copy is recognized by its form alone.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

from probtune.measure import MeasureReference, save_reference
from probtune.measure.timing import load_arrays
from probtune.schedule.analysis import is_spatial

__all__ = ["LAYOUT_FREE_ATTR", "LayoutCopy", "MeasuredForm", "layout_copies", "layout_free_params", "read_constants_packed"]

# TVM's name for a PrimFunc attribute listing the parameters its callers pass as constants (weights)
LAYOUT_FREE_ATTR = "layout_free_buffers"

# the block annotation TVM's RemoveWeightLayoutRewriteBlock looks for
_PREPROC_ATTR = "meta_schedule.layout_rewrite_preproc"


def layout_free_params(func: tirx.PrimFunc) -> set[int]:
    """Positions of ``func``'s parameters marked constant (``LAYOUT_FREE_ATTR``): a layout copy of one is made once, not per call."""
    attrs = func.attrs
    return {int(i) for i in attrs[LAYOUT_FREE_ATTR]} if attrs is not None and LAYOUT_FREE_ATTR in attrs else set()


@dataclass(frozen=True)
class LayoutCopy:
    """A block ``B[f(v)] = P[v]`` that copies parameter ``param`` of a program into the layout ``f``."""

    block: str
    param: int
    layout: tirx.IndexMap


def layout_copies(func: tirx.PrimFunc) -> list[LayoutCopy]:
    """The blocks of ``func`` that copy one of its parameters, element for element, into another buffer's layout."""
    params = list(func.params)
    found: list[LayoutCopy] = []

    def visit(block: s_tir.SBlock) -> None:
        store = block.body
        if not isinstance(store, tirx.BufferStore) or block.init is not None or len(block.reads) != 1:
            return
        load = store.value
        if not isinstance(load, TensorLoad) or any(p.same_as(store.buffer) for p in params):
            return
        index = next((i for i, p in enumerate(params) if p.same_as(load.source)), None)
        iter_vars = [iv.var for iv in block.iter_vars]
        if index is None or len(load.indices) != len(iter_vars):
            return
        if not all(i.same_as(v) for i, v in zip(load.indices, iter_vars)):
            return
        if not is_spatial(block):
            return
        found.append(LayoutCopy(block.name_hint, index, tirx.IndexMap(iter_vars, list(store.indices), None)))

    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, visit))
    return found


def read_constants_packed(program: tvm.IRModule, constants: Collection[int]) -> tuple[tvm.IRModule, dict[int, tirx.IndexMap]]:
    """``program`` reading each parameter in ``constants`` (positions) that it copies in its copy's layout; the layouts by position.

    A parameter copied twice keeps its second copy; a copy TVM cannot fold
    away is left as it is.
    """
    layouts: dict[int, tirx.IndexMap] = {}
    for copy in layout_copies(program["main"]):
        if copy.param not in constants or copy.param in layouts:
            continue
        packed = _read_packed(program, copy)
        if packed is not None:
            program = packed
            layouts[copy.param] = copy.layout
    return program, layouts


def _read_packed(program: tvm.IRModule, copy: LayoutCopy) -> tvm.IRModule | None:
    """``program`` reading the copied parameter in the copy's layout, the copy gone; None where TVM refuses."""
    sch = s_tir.Schedule(program)
    try:
        block = sch.get_sblock(copy.block)
        sch.transform_layout(block, ("read", 0), copy.layout)
        sch.compute_inline(block)
    except (RuntimeError, ValueError):  # a ScheduleError is a RuntimeError
        return _copy_as_parameter(program, copy)
    return sch.mod


def _copy_as_parameter(program: tvm.IRModule, copy: LayoutCopy) -> tvm.IRModule | None:
    """``program`` taking the copy's buffer as the parameter, the copy gone; None unless the copy alone reads it.

    For a copy that cannot be inlined because its buffer is matched into a
    tensorized block (``match_buffer``): TVM's ``RemoveWeightLayoutRewriteBlock``
    drops a copy so annotated and makes its destination the parameter.
    """
    func = program["main"]
    param = func.params[copy.param]
    readers = [b.name_hint for b in _blocks(func) if any(r.source.same_as(param) for r in b.reads)]
    if readers != [copy.block]:
        return None
    sch = s_tir.Schedule(program)
    sch.annotate(sch.get_sblock(copy.block), _PREPROC_ATTR, True)
    try:
        return s_tir.transform.RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(sch.mod)
    except (RuntimeError, ValueError):  # TVM's pass refused the copy
        return None


def _blocks(func: tirx.PrimFunc) -> list[s_tir.SBlock]:
    found: list[s_tir.SBlock] = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, found.append))
    return found


@dataclass
class MeasuredForm:
    """A task's candidates as they are timed: with the layout copies of its ``constants`` made beforehand.

    Calling it with a candidate's program (or its JSON text) gives the program to build and
    the reference to run it against: the task's own, or one whose inputs at
    the packed positions are in the program's layouts (written once per set
    of layouts, in the reference's folder). With no ``constants`` (an
    operator tuned alone, whose inputs all change between calls) every
    program is timed as it is.
    """

    reference: MeasureReference
    constants: frozenset[int] = frozenset()
    _packed: dict[str, MeasureReference] = field(default_factory=dict, repr=False)

    def __call__(self, program: tvm.IRModule | str) -> tuple[tvm.IRModule | str, MeasureReference]:
        """The program to build (``tvm.ir.save_json`` text stays text where nothing changes) and its reference."""
        if not self.constants:
            return program, self.reference
        if isinstance(program, str):
            program = tvm.ir.load_json(program)
        program, layouts = read_constants_packed(program, self.constants)
        if not layouts:
            return program, self.reference
        key = ";".join(f"{position}:{layouts[position]}" for position in sorted(layouts))
        if key not in self._packed:
            self._packed[key] = self._packed_reference(layouts)
        return program, self._packed[key]

    def _packed_reference(self, layouts: dict[int, tirx.IndexMap]) -> MeasureReference:
        """The reference with its inputs at ``layouts``' positions in those layouts."""
        arrays = load_arrays(self.reference.path)
        for position, layout in layouts.items():
            name = f"input_{position}"
            arrays[name] = layout.map_tensor(tvm.runtime.tensor(arrays[name])).numpy()
        reference = self.reference
        path = Path(reference.path)
        name = f"{path.stem.removeprefix('reference-')}-packed"
        return save_reference(arrays, name, path.parent, reference.num_inputs, reference.rtol, reference.atol)
