"""The hooks through which everything concrete reaches probtune.

Every hook takes a ``register`` callback. A plugin implements a hook with
``@probtune.hookimpl`` and calls ``register(...)`` once per thing it provides.
Built-in plugins use exactly these hooks, so a third-party distribution that
declares an entry point in the ``probtune`` group is on equal footing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from probtune.catalog import WorkloadSpec
    from probtune.interfaces import (
        BuilderFactory,
        CostModelFactory,
        GraphRewrite,
        Mutator,
        OnnxConverter,
        RunnerFactory,
        SpaceModule,
        TargetSpec,
        Validator,
    )
    from probtune.schedule import InstructionKind

__all__ = [
    "hookimpl",
    "hookspec",
    "probtune_register_builders",
    "probtune_register_cost_models",
    "probtune_register_graph_rewrites",
    "probtune_register_instructions",
    "probtune_register_mutators",
    "probtune_register_onnx_converters",
    "probtune_register_runners",
    "probtune_register_space_modules",
    "probtune_register_targets",
    "probtune_register_validators",
    "probtune_register_workloads",
]

hookspec = pluggy.HookspecMarker("probtune")
hookimpl = pluggy.HookimplMarker("probtune")


@hookspec
def probtune_register_workloads(register: Callable[[WorkloadSpec], None]) -> None:
    """Register named, shape-parameterised workloads for the catalog (``probtune workloads``)."""


@hookspec
def probtune_register_targets(register: Callable[[TargetSpec], None]) -> None:
    """Register hardware targets: a TVM target dict plus the module set and validators to use."""


@hookspec
def probtune_register_instructions(register: Callable[[InstructionKind], None]) -> None:
    """Register schedule instruction kinds that modules record in traces and every replay applies.

    A design space carries the registered kinds to each replay of its traces
    (mutation, realize helpers, the database's records), so a module can use
    a TVM primitive the kernel's schedule language lacks. A name of the
    language's own kinds, sampling ones included, is refused.
    """


@hookspec
def probtune_register_space_modules(register: Callable[[SpaceModule], None]) -> None:
    """Register design-space modules: stochastic transformations applied to each block."""


@hookspec
def probtune_register_mutators(register: Callable[[Mutator], None]) -> None:
    """Register mutators that change the decisions of a trace during evolutionary search."""


@hookspec
def probtune_register_validators(register: Callable[[Validator], None]) -> None:
    """Register validators/post-processors that finish or reject a scheduled program."""


@hookspec
def probtune_register_graph_rewrites(register: Callable[[GraphRewrite], None]) -> None:
    """Register graph rewrites: whole-model rewrites a target names in ``TargetSpec.graph_rewrites``."""


@hookspec
def probtune_register_onnx_converters(register: Callable[[str, OnnxConverter], None]) -> None:
    """Register converters for ONNX operators that TVM's Relax frontend lacks, by operator type.

    ``converter(bb, inputs, attrs, opset)`` gets the node as the frontend
    does (a ``relax.BlockBuilder``, its inputs as Relax expressions with None
    for absent optional ones, its attributes, the model's opset) and returns
    a Relax expression, or a ``relax.Tuple`` for several outputs. One of
    TVM's own converters is never replaced.
    """


@hookspec
def probtune_register_cost_models(register: Callable[[str, CostModelFactory], None]) -> None:
    """Register cost-model factories by name."""


@hookspec
def probtune_register_builders(register: Callable[[str, BuilderFactory], None]) -> None:
    """Register builder factories by name (compile candidates into loadable artifacts)."""


@hookspec
def probtune_register_runners(register: Callable[[str, RunnerFactory], None]) -> None:
    """Register runner factories by name (time candidates and check their results).

    A factory is called as ``factory(timeout=float)``, and with ``cache_flush=True`` as well where
    calls are to be timed with cold caches (whole models); a runner that cannot flush raises.
    """
