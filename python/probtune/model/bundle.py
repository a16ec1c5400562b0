"""Model bundles: a whole compiled model written for a device that only exchanges files with this machine.

:func:`write_model_bundle` lays the model out as a plan (:mod:`probtune.model.plan`),
compiles each of its functions to device code with its launch table (the
target's compiler, as for a candidate's bundle), and writes them with the
model's constants, reference inputs and outputs, the stand-alone script
:mod:`probtune.measure.run_model_bundle` and the bundle runtimes that
launch that code, which run, check and time the model there without TVM.
Weights too large to carry travel as seeds: before
anything is compiled, each floating-point constant of at least
``SEEDED_ELEMENTS`` elements is replaced by seeded values with its own mean
and deviation, so the bundle checks the model with those weights, against
a CPU build of the same module with default programs
(:mod:`probtune.model.host_reference`; not onnxruntime, which holds the
original weights).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant

from probtune.errors import ModelCompileError, TuningConfigError, summary
from probtune.interfaces import DeviceCode, TargetSpec
from probtune.measure import bundle_runtimes, run_model_bundle
from probtune.measure.bundle import carry_runtimes, device_code_of, new_folder, write_device_code
from probtune.model.compile import out_of_place_if_refused, place_programs
from probtune.model.host_reference import host_outputs
from probtune.model.importer import InputSpec
from probtune.model.plan import ModelPlan, plan_model

__all__ = ["SEEDED_ELEMENTS", "ModelBundleWritten", "Tolerance", "seed_constants", "write_model_bundle"]

SEEDED_ELEMENTS = 1 << 16  # floating-point constants this large travel as seeds, not values


@dataclass(frozen=True)
class Tolerance:
    """Outputs pass where ``|got - want| <= rtol * |want| + atol_scale * rms(want)``, as :mod:`probtune.model.check`."""

    rtol: float
    atol_scale: float


@dataclass(frozen=True)
class ModelBundleWritten:
    """What :func:`write_model_bundle` wrote: the folder, its functions and launches, constants carried and seeded."""

    path: Path
    functions: int
    launches: int
    carried_bytes: int
    seeded_bytes: int


def write_model_bundle(
    fused: tvm.IRModule,
    programs: Mapping[str, tvm.IRModule],
    target: TargetSpec,
    output: str | Path,
    *,
    name: str,
    inputs: Sequence[InputSpec],
    tolerance: Tolerance,
    seed: int = 0,
    seeded_elements: int = SEEDED_ELEMENTS,
) -> ModelBundleWritten:
    """Write the model ``fused`` with ``programs`` in place, for ``target``, into the new folder ``output``.

    Floating-point constants of at least ``seeded_elements`` elements travel as seeds.
    """
    out = new_folder(output, "bundle")
    coded = device_code_of(target)
    if coded is None:
        raise TuningConfigError(f"target {target.name!r} compiles no device code with launch tables, which model bundles "
                                "carry (a GPU target's compiler gives them)")
    device_code, kind = coded
    seeded_mod, seeded = seed_constants(fused, seed, seeded_elements)
    arrays = [spec.random(np.random.default_rng(seed)) for spec in inputs]
    expected = host_outputs(seeded_mod, arrays, seed)
    def build(in_place: bool) -> tuple[ModelPlan, dict[str, DeviceCode]]:
        mod, _, _ = place_programs(seeded_mod, programs, target, prepack=False, in_place=in_place)
        plan, codes = plan_model(mod, target.tvm_target), {}
        for function, module in plan.functions.items():
            try:
                codes[function] = device_code(module, target.tvm_target)
            except Exception as exc:  # named here, so that the error says which function's kernels failed
                raise RuntimeError(f"{function}: {summary(exc)}") from exc
        return plan, codes

    try:
        plan, codes = out_of_place_if_refused(build)
    except Exception as exc:  # TVM's lowering, a plan it cannot say, or a kernel the lint refuses
        raise ModelCompileError(
            f"the model cannot be written as a bundle for target {target.name!r}: {summary(exc)}. Nothing was "
            "written; the tuned records are kept"
        ) from exc
    (out / "kernels").mkdir(parents=True)
    functions = {function: write_device_code(code, kind, out, Path("kernels") / function) for function, code in codes.items()}
    runtimes = carry_runtimes(out, kind)
    carried, by_seed = _split_constants(plan, seeded)
    reference: dict[str, Any] = {f"input_{i}": a for i, a in enumerate(arrays)}  # numpy's stub reads a key as allow_pickle
    reference.update({f"output_{i}": a for i, a in enumerate(expected)})
    np.savez(out / "constants.npz", **carried)
    np.savez(out / "reference.npz", **reference)
    manifest = {
        "format": run_model_bundle.FORMAT, "model": name, "target": target.name, "tvm_target": target.tvm_target,
        "plan": plan.to_json(), "functions": functions, "reference": "reference.npz",
        "reference_from": "this module with the same constants, built for the CPU with default programs",
        "constants": {"file": "constants.npz", "seeded": by_seed},
        "tolerance": {"rtol": tolerance.rtol, "atol_scale": tolerance.atol_scale}, "runtimes": runtimes,
    }
    (out / run_model_bundle.MANIFEST).write_text(json.dumps(manifest, indent=1))
    for module in (run_model_bundle, bundle_runtimes):
        shutil.copyfile(str(module.__file__), out / Path(str(module.__file__)).name)
    launches = sum(len(functions[call.function]["launches"]) for call in plan.calls)
    return ModelBundleWritten(out, len(functions), launches, sum(a.nbytes for a in carried.values()),
                              sum(int(np.prod(s["shape"])) * np.dtype(s["dtype"]).itemsize for s in by_seed.values()))


def seed_constants(
    fused: tvm.IRModule, seed: int, min_elements: int = SEEDED_ELEMENTS
) -> tuple[tvm.IRModule, dict[str, dict[str, Any]]]:
    """``fused`` with each floating-point constant of at least ``min_elements`` replaced by seeded values of its mean
    and deviation. Returns the module and the seeds' specs by the digest of the values they make.
    """
    mutator = _SeedConstants(fused, seed, min_elements)
    main = mutator.visit_expr(fused["main"])
    functions = dict(fused.functions)
    functions[fused.get_global_var("main")] = main
    return tvm.IRModule(functions, attrs=fused.attrs), mutator.specs


@relax.expr_functor.mutator
class _SeedConstants(relax.PyExprMutator):  # type: ignore[misc]
    def __init__(self, mod: tvm.IRModule, seed: int, min_elements: int) -> None:
        super().__init__(mod)
        self.seed = seed
        self.min_elements = min_elements
        self.specs: dict[str, dict[str, Any]] = {}

    def visit_generic_const_(self, const: Constant) -> relax.Expr:
        array = const.value.numpy()
        if array.size < self.min_elements or not np.issubdtype(array.dtype, np.floating):
            return const
        values = array.astype(np.float64)
        seed, mean, std = self.seed * 1_000_003 + len(self.specs), float(values.mean()), float(values.std())
        made = run_model_bundle.seeded_array(seed, array.shape, str(array.dtype), mean, std)
        self.specs[run_model_bundle.digest(made)] = {"seed": seed, "shape": list(array.shape), "dtype": str(array.dtype),
                                                     "mean": mean, "std": std}
        return relax.const(made, str(array.dtype))


def _split_constants(plan: ModelPlan, seeded: Mapping[str, dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The plan's constants to carry (tensor name -> array), and those made from seeds (name -> spec with its digest)."""
    carried: dict[str, Any] = {}
    by_seed: dict[str, Any] = {}
    for tensor, array in plan.constants.items():
        key = run_model_bundle.digest(array)
        if key in seeded:
            by_seed[tensor] = {**seeded[key], "digest": key}
        else:
            carried[tensor] = array
    return carried, by_seed
