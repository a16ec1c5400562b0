"""Target lookup and the check that this machine can run a target's code."""

from __future__ import annotations

from probtune.errors import UnknownTargetError, UnsupportedTargetError
from probtune.interfaces import TargetSpec
from probtune.plugins import get_registry

__all__ = ["check_runs_here", "resolve_target"]


def resolve_target(target: str | TargetSpec) -> TargetSpec:
    """The registered target of that name; a clear error lists the known ones."""
    if isinstance(target, TargetSpec):
        return target
    targets = get_registry().targets
    if target not in targets:
        known = ", ".join(sorted(targets)) or "none (is a target plugin installed?)"
        raise UnknownTargetError(f"unknown target {target!r}; known targets: {known}")
    return targets[target]


def check_runs_here(target: TargetSpec) -> None:
    """Refuse to measure on this machine code it cannot run (it would die of SIGILL, or find no device)."""
    reason = target.runs_here() if target.runs_here is not None else None
    if reason:
        raise UnsupportedTargetError(f"target {target.name!r} cannot run on this machine: {reason}")
