"""A model's tasks: TVM's Relax passes legalize and fuse it; each distinct fused PrimFunc is one task.

A task's weight is the number of call sites of its PrimFuncs: the model spends
that many calls' worth of the task's latency per inference. Identical
PrimFuncs (same structure under different names) are one task, and one
workload in the database, also across models. A concatenation that its
producers will write into (:mod:`probtune.model.concat_in_place`) is no call
and no task.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import tvm
import tvm_ffi
from tvm import relax

from probtune.errors import ModelCompileError, WorkloadShapeError, summary, warn_caller
from probtune.interfaces import GraphRewrite, TargetSpec
from probtune.measure.constant_layouts import LAYOUT_FREE_ATTR
from probtune.model.batch_norms import AFFINE_BATCH_NORMS, affine_batch_norms
from probtune.model.cast_outputs import CAST_OUTPUTS, join_cast_outputs
from probtune.model.concat_in_place import CONCAT_IN_PLACE_ATTR, concatenations_in_place
from probtune.model.concatenation import split_concatenations
from probtune.model.copy_reads import COPY_READS, read_copies_in_products
from probtune.model.importer import Model
from probtune.model.layouts import convert_layouts
from probtune.model.legalize import legalize
from probtune.model.narrow_outputs import NARROW_OUTPUTS, narrow_outputs
from probtune.model.part_reads import PART_READS, read_parts_in_products
from probtune.model.prepack import constant_arguments
from probtune.model.quantized import INTEGER_OPERATORS, integer_operators
from probtune.model.reduction_inputs import REDUCTION_INPUTS, reduction_inputs
from probtune.model.rewrites import REWRITES_ATTR, apply_graph_rewrites
from probtune.model.split_parts import SLICED_SPLITS, slice_splits
from probtune.model.variable_names import unique_variable_names
from probtune.task.task import Task
from probtune.workloads.workload import Workload

__all__ = ["extract_tasks", "fuse"]


def fuse(model: Model, target: TargetSpec, rewrites: Sequence[str | GraphRewrite] | None = None) -> tvm.IRModule:
    """The model with its quantized operators on integers (:mod:`probtune.model.quantized`), in the target's
    layouts (:mod:`probtune.model.layouts`), its batch norms a multiply and an add
    (:mod:`probtune.model.batch_norms`), through its graph rewrites (or ``rewrites``;
    :mod:`probtune.model.rewrites`), the parts of its splits made slices (:mod:`probtune.model.split_parts`),
    legalized and fused by TVM's "zero" pipeline.

    The pipeline legalizes (:mod:`probtune.model.legalize` first, for what the
    layout pass makes that TVM does not lower), names the variables apart
    (:mod:`probtune.model.variable_names`), folds the transposed weights
    into constants, joins a narrowing cast of a tensor that something else
    reads to its producer (:mod:`probtune.model.cast_outputs`), fuses
    operators, has a task that would write a widened value write the narrow
    one for its reader to widen (:mod:`probtune.model.narrow_outputs`), has
    row reductions compute the elementwise steps only they read
    (:mod:`probtune.model.reduction_inputs`) and products take the parts of a stacked tensor they read
    themselves (:mod:`probtune.model.part_reads`), and the casts and transposes they alone read where the target asks
    (:mod:`probtune.model.copy_reads`), and fuses TIR; then it folds the fused calls
    that read only constants (a GRU's recurrent weights split, concatenated
    and transposed), which the first folding missed, and splits concatenations
    where the target asks (:mod:`probtune.model.concatenation`). The fused module records what
    each rewrite changed, and whether the target writes concatenations in place.
    """
    integer, quantized = _on_integers(model.mod)
    affine, normalized = affine_batch_norms(convert_layouts(integer, target.layouts))
    rewritten, counts = apply_graph_rewrites(affine, target, rewrites)
    mod, splits = slice_splits(rewritten)
    made = ((INTEGER_OPERATORS, quantized), (AFFINE_BATCH_NORMS, normalized), (SLICED_SPLITS, splits))
    counts = {name: n for name, n in made if n} | counts
    with tvm.target.Target(target.tvm_target):
        annotated = _lowered(lambda: _annotated(unique_variable_names(legalize(mod))), target)
        annotated, joined = _optional(join_cast_outputs, CAST_OUTPUTS, annotated)
        grouped = _lowered(lambda: relax.transform.FuseOps()(annotated), target)
        grouped, narrowing = _optional(narrow_outputs, NARROW_OUTPUTS, grouped)
        grouped, computing = _optional(reduction_inputs, REDUCTION_INPUTS, grouped)
        grouped, reading = _optional(read_parts_in_products, PART_READS, grouped)
        if target.copies_in_product_reads:
            grouped, copying = _optional(read_copies_in_products, COPY_READS, grouped)
        else:
            copying = 0
        fused = _lowered(lambda: relax.transform.FoldConstant()(relax.transform.FuseTIR()(grouped)), target)
    joins = ((CAST_OUTPUTS, joined), (NARROW_OUTPUTS, narrowing), (REDUCTION_INPUTS, computing), (PART_READS, reading),
             (COPY_READS, copying))
    counts = {**counts, **{name: n for name, n in joins if n}}
    if target.split_concatenations:
        fused, _ = split_concatenations(fused)
    if target.concat_in_place:
        fused = fused.with_attr(CONCAT_IN_PLACE_ATTR, target.view_alignment)
    return fused.with_attr(REWRITES_ATTR, counts) if counts else fused


def _lowered(step: Callable[[], tvm.IRModule], target: TargetSpec) -> tvm.IRModule:
    """``step()``, a ModelCompileError where TVM's legalization or fusion refuses an operator of the model."""
    try:
        return step()
    except Exception as exc:  # noqa: BLE001 - TVM refused an operator of the model
        raise ModelCompileError(
            f"TVM cannot lower the model for target {target.name!r}: {summary(exc)}. Nothing was tuned; replace "
            "the operator it names in the model (or report it)"
        ) from None


def _optional(step: Callable[[tvm.IRModule], tuple[tvm.IRModule, int]], name: str, mod: tvm.IRModule
              ) -> tuple[tvm.IRModule, int]:
    """``step(mod)``; where it raises, ``mod`` as it was with a warning that names the step: each such step only
    saves work (a task or a copy), so the model compiles right without it."""
    try:
        return step(mod)
    except Exception as exc:  # noqa: BLE001 - an optional fusion step failed: the model is still right without it
        warn_caller(f"fusion step {name!r} failed and was left out ({summary(exc)}); the model is compiled without "
                    "it (please report this)")
        return mod, 0


def _annotated(mod: tvm.IRModule) -> tvm.IRModule:
    """The first steps of TVM's "zero" pipeline: operators legalized, their PrimFuncs' patterns annotated (FuseOps
    and FuseTIR follow)."""
    steps = [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant()]
    return tvm.transform.Sequential(steps)(mod)


def _on_integers(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` with its quantized operators on integers (:mod:`probtune.model.quantized`), and how many; those left
    dequantized are named in a warning, and a model the rewrite fails on keeps its float32 form, with a warning."""
    try:
        integer, quantized, left = integer_operators(mod)
    except Exception as exc:  # noqa: BLE001 - TVM's pattern rewriting refused the model: its float32 form is still right
        warn_caller(f"quantized operators keep their dequantized float32 form: rewriting them on integers failed "
                    f"({summary(exc)}); the model is compiled and checked as it was imported")
        return mod, 0
    if left:
        warn_caller(
            f"{len(left)} quantized operator(s) ({', '.join(sorted(set(left)))}) keep their dequantized float32 form "
            "(weights with a nonzero zero point, or a bias not quantized with the product's scale): they are "
            "compiled and checked, but not computed on integers"
        )
    return integer, quantized


def extract_tasks(fused: tvm.IRModule) -> list[Task]:
    """One task per distinct PrimFunc called from the fused module's Relax functions, heaviest first.

    A function that only reshapes is none: TVM's VM runs it as a view of its input (``RewriteDataflowReshape``).
    A model with no such call has no task: it is compiled as it is.
    """
    written = Counter(site.concat.value.args[0].name_hint for site in concatenations_in_place(fused))
    calls = _call_sites(relax.transform.RewriteDataflowReshape()(fused)) - written  # reshapes run as views
    constant = constant_arguments(fused)
    by_structure: dict[int, list[str]] = {}
    workloads: dict[int, Workload] = {}
    for gv in fused.get_global_vars():
        func = fused[gv]
        if not isinstance(func, tvm.tirx.PrimFunc) or calls[gv.name_hint] == 0:
            continue
        if constant.get(gv.name_hint):  # the space may then pack those weights whatever their reuse
            func = func.with_attr(LAYOUT_FREE_ATTR, sorted(constant[gv.name_hint]))
        try:
            workload = Workload.from_module(func, name=gv.name_hint)
        except WorkloadShapeError as exc:  # a scalar parameter (a range's bounds): compiled as TVM lowers it
            warn_caller(f"{gv.name_hint} is not tuned: {exc}")
            continue
        key = workload.structural_hash
        by_structure.setdefault(key, []).append(gv.name_hint)
        workloads.setdefault(key, workload)
    tasks = [
        Task(workloads[key], sum(calls[name] for name in names), tuple(sorted(names)))
        for key, names in by_structure.items()
    ]
    return sorted(tasks, key=lambda task: (-task.weight * (task.workload.flops or 0.0), task.name))


def _call_sites(fused: tvm.IRModule) -> Counter[str]:
    """How many times each PrimFunc is called (``call_tir``) from the module's Relax functions."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    counts: Counter[str] = Counter()

    def visit(call: relax.Call) -> None:
        if call.op.same_as(call_tir):
            counts[call.args[0].name_hint] += 1

    for gv in fused.get_global_vars():
        if isinstance(fused[gv], relax.Function):
            tvm_ffi.structural_walk(fused[gv], (relax.Call, visit))
    return counts
