"""Target lookup and the check that this machine can run a target's code."""

from __future__ import annotations

from functools import lru_cache

from probtune.errors import UnknownTargetError, UnsupportedTargetError
from probtune.interfaces import TargetSpec
from probtune.plugins import get_registry

__all__ = ["check_runs_here", "cpu_features", "resolve_target"]


def resolve_target(target: str | TargetSpec) -> TargetSpec:
    """The registered target of that name; a clear error lists the known ones."""
    if isinstance(target, TargetSpec):
        return target
    targets = get_registry().targets
    if target not in targets:
        known = ", ".join(sorted(targets)) or "none (is a target plugin such as probtune-x86 installed?)"
        raise UnknownTargetError(f"unknown target {target!r}; known targets: {known}")
    return targets[target]


@lru_cache(maxsize=1)
def cpu_features() -> frozenset[str]:
    """The instruction-set flags of this machine's CPU (from Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def check_runs_here(target: TargetSpec) -> None:
    """Refuse to measure locally code that would die of SIGILL on this CPU."""
    missing = [f for f in target.required_cpu_features if f not in cpu_features()]
    if missing and cpu_features():
        raise UnsupportedTargetError(
            f"target {target.name!r} needs CPU features {', '.join(missing)} that this machine lacks; "
            f"tune for 'host' instead, or measure on a matching machine"
        )
