"""A fused module's outputs computed on this machine's CPU, as references for code run elsewhere.

TVM's untuned build of a fused module runs each function as plain loops:
correct, but far too slow for a segmentation network's high-resolution
convolutions in float16. Here each function instead runs its task's default
program of the host target's space (:func:`~probtune.model.compile.default_program`:
parallel and vectorized, checked against onnxruntime wherever a model is
compiled for the CPU); a task whose space has no valid draw keeps TVM's loops.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tvm
from tvm import relax

from probtune.model.check import outputs_to_numpy
from probtune.model.compile import compile_model, default_programs
from probtune.model.tasks import extract_tasks
from probtune.space.space_generator import generate_space
from probtune.targets import resolve_target

__all__ = ["HOST", "host_outputs"]

HOST = "host"
"""The target whose spaces give the reference's programs: this machine's CPU."""


def host_outputs(mod: tvm.IRModule, inputs: Sequence[np.ndarray], seed: int = 0) -> list[np.ndarray]:
    """``mod`` (fused, unscheduled, any target's graph) compiled for this CPU with default programs, run on ``inputs``."""
    host = resolve_target(HOST)
    spaces = [(task.functions, generate_space(task.workload, host, seed=seed), task.workload.mod)
              for task in extract_tasks(mod)]
    executable, _, _ = compile_model(mod, default_programs(spaces, seed, host), host)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return outputs_to_numpy(vm["main"](*[tvm.runtime.tensor(np.asarray(a, order="C")) for a in inputs]))
