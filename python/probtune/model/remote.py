"""A compiled model on a device behind TVM's RPC tracker: uploaded, then called, checked and timed there."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax

from probtune.interfaces import TargetSpec
from probtune.measure.codegen import device_type
from probtune.model.check import CheckReport, outputs_to_numpy
from probtune.model.compile import checked_inputs, export_model
from probtune.model.importer import InputSpec

__all__ = ["RemoteModel"]


class RemoteModel:
    """A tuned model running on one server of an RPC tracker: ``model(*inputs)`` takes and returns numpy arrays.

    ``session`` is a TVM RPC session (``RPCRunner.request_session``). The
    library is linked here as the target links it, uploaded, and run by a Relax
    VM on the server, on ``num_threads`` of its threads.
    """

    def __init__(self, executable: Any, inputs: Sequence[InputSpec], target: TargetSpec, session: Any,
                 num_threads: int) -> None:
        self.executable = executable
        self.inputs = tuple(inputs)
        self.target = target
        self.num_threads = num_threads
        self.check: CheckReport | None = None
        self.prepacked = 0
        self.in_place = 0
        name = f"probtune-model-{uuid.uuid4().hex}.so"
        with tempfile.TemporaryDirectory(prefix="probtune-model-") as scratch:
            path = export_model(target.compiler, executable, Path(scratch) / name)
            session.upload(bytearray(path.read_bytes()), target=name)  # TVM's upload of a path leaves it open
        self._session = session
        # 1: big cores, workers pinned one per core: RPC cannot pass the list of cores set_num_threads frees them over
        session.get_function("runtime.config_threadpool")(1, num_threads)
        self._device = session.device(device_type(target), 0)
        self._vm = relax.VirtualMachine(session.load_module(name), self._device)

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        return outputs_to_numpy(self._vm["main"](*self._tensors(inputs)))

    def time(self, inputs: Sequence[np.ndarray], repeat: int = 10, min_repeat_ms: int = 100) -> list[float]:
        """Seconds per call of the model on the device, one figure per repeat (TVM's timer, run there): a repeat runs
        the model once, or as many times as last ``min_repeat_ms``."""
        self._vm.set_input("main", *self._tensors(inputs))
        timer = self._vm.time_evaluator("invoke_stateful", self._device, number=1, repeat=repeat,
                                        min_repeat_ms=int(min_repeat_ms))
        return [float(r) for r in timer("main").results]

    def threads(self) -> int:
        return self.num_threads

    def export_library(self, path: str | os.PathLike[str]) -> Path:
        """Write the model as a shared library for the target's device (linked as the target links it)."""
        return export_model(self.target.compiler, self.executable, path)

    def _tensors(self, inputs: Sequence[np.ndarray]) -> list[Any]:
        return [tvm.runtime.tensor(array, self._device) for array in checked_inputs(inputs, self.inputs)]
