"""This machine's CPU: its model, and whether it runs a target's code (its architecture and instruction-set flags)."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["CPURequirement", "cpu_features", "cpu_model"]


@lru_cache(maxsize=1)
def cpu_features() -> frozenset[str]:
    """The instruction-set flags of this machine's CPU (from Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("flags", "Features")):  # x86 names them flags, AArch64 Features
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@lru_cache(maxsize=1)
def cpu_model() -> str:
    """This machine's CPU model, as Linux names it (/proc/cpuinfo), or its architecture where it does not."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


@dataclass(frozen=True)
class CPURequirement:
    """A CPU target's ``runs_here``: the architecture (``platform.machine()``) and flags its code needs.

    Flags are only checked where this machine lists its own (Linux).
    """

    machines: tuple[str, ...]
    features: tuple[str, ...] = ()

    def __call__(self) -> str | None:
        machine = platform.machine()
        if machine not in self.machines:
            return f"its code is for {' or '.join(self.machines)}, this machine is {machine or 'unknown'}"
        have = cpu_features()
        missing = [flag for flag in self.features if flag not in have]
        if missing and have:
            return f"this CPU lacks {', '.join(missing)}; tune for 'host' instead, or measure on a matching machine"
        return None
