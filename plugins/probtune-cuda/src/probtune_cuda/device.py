"""Whether this machine can run a CUDA target's programs: a GPU that TVM's runtime sees."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CUDARequirement"]


@dataclass(frozen=True)
class CUDARequirement:
    """A target's ``runs_here``: None where TVM sees a CUDA device, else why not.

    A dataclass rather than a closure, so that a target holding it pickles.
    """

    device_id: int = 0

    def __call__(self) -> str | None:
        import tvm

        if tvm.cuda(self.device_id).exist:
            return None
        return (
            f"no CUDA device {self.device_id} is visible to TVM on this machine; its candidates build here "
            "(CUDA source, compiled to a cubin and linted by NVRTC) but are timed only on a machine with an NVIDIA GPU"
        )
