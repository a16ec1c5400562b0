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
    from probtune.interfaces import (
        BuilderFactory,
        BundleRuntime,
        CostModelFactory,
        FeatureExtractor,
        GraphRewrite,
        Mutator,
        OnnxConverter,
        RunnerFactory,
        SpaceModule,
        TargetSpec,
        Validator,
    )
    from probtune.schedule.schedule import InstructionKind
    from probtune.search.strategies import StrategyKind
    from probtune.task.task_scheduler import TaskScheduler
    from probtune.workloads.catalog import WorkloadSpec

__all__ = [
    "hookimpl",
    "hookspec",
    "probtune_register_builders",
    "probtune_register_bundle_runtimes",
    "probtune_register_cost_models",
    "probtune_register_feature_extractors",
    "probtune_register_graph_rewrites",
    "probtune_register_instructions",
    "probtune_register_mutators",
    "probtune_register_onnx_converters",
    "probtune_register_runners",
    "probtune_register_search_strategies",
    "probtune_register_space_modules",
    "probtune_register_targets",
    "probtune_register_task_schedulers",
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


@hookspec
def probtune_register_bundle_runtimes(register: Callable[[BundleRuntime], None]) -> None:
    """Register bundle runtimes (``probtune.plugin.BundleRuntime``): what launches a bundle's device code without TVM.

    A target whose compiler gives device code (``Compiler.device_code``, a
    ``probtune.plugin.DeviceCode``) has it carried by its bundles, with the
    ``source`` file of every runtime whose ``kinds`` hold the code's kind
    (``Compiler.device_code_kind``).
    On the device, the bundle's script loads that file by path and calls,
    at module level:

    - ``available() -> bool``: whether this machine can use it (its library is installed);
    - ``device_name() -> str``: the device it runs on, as the results name it;
    - ``measure(timing) -> run``: ``timing`` is the bundle's ``timing`` module;
      ``run(task, candidate, bundle, inputs, expected)`` checks and times one
      candidate (``task`` a ``timing.RunTask``, ``candidate`` its manifest
      entry, whose ``kernels`` are its launch table with the code's path
      under the kind, relative to the ``bundle`` folder) and returns a
      ``timing.RunReply``;
    - ``healthy() -> bool``: False once a candidate has left the device
      unusable for this process (the run then stops, and goes on in a new one);
    - ``load_model(bundle, manifest, constants) -> model``, for model bundles:
      the model's plan in device memory, ``constants`` (name, array) pairs
      put in place; ``model.launches`` (a count), ``model.run(inputs) ->
      outputs``, ``model.time(repeat, min_repeat_ms) -> seconds per call``
      and ``model.profile(min_repeat_ms) -> {function: {"seconds", "launches"}}``.

    The name ``tvm`` is the kernel's (TVM's runtime loading each candidate's library).
    """


@hookspec
def probtune_register_feature_extractors(register: Callable[[FeatureExtractor], None]) -> None:
    """Register feature extractors (``probtune.plugin.FeatureExtractor``): columns a cost model adds to its features.

    ``extract(func)`` describes a scheduled program by ``columns`` raw,
    non-negative values (a GPU's threads and memories, say), which a cost
    model that asks the registry for its extractors (the ``xgb`` one does,
    ordering them by name) appends to its own, as ``<name>.<column>``.
    Adding or removing an extractor changes the features' layout: a cost
    model saved under another layout starts again untrained.
    """


@hookspec
def probtune_register_task_schedulers(register: Callable[[str, Callable[[], TaskScheduler]], None]) -> None:
    """Register task schedulers by name: a factory called with no arguments gives a new scheduler for one run.

    A scheduler (``probtune.plugin.TaskScheduler``) picks the task that gets
    the next round of a model's budget from each task's ``TaskProgress``, or
    None when none can use one. ``tune_model(scheduler=NAME)`` and
    ``probtune tune-model --scheduler NAME`` choose it.
    """


@hookspec
def probtune_register_search_strategies(register: Callable[[StrategyKind], None]) -> None:
    """Register search strategies (``probtune.plugin.StrategyKind``): a name, whether a cost model guides it, and
    ``start(SearchStart) -> SearchStrategy``, called once per task.

    The strategy proposes batches of candidates (``next_batch``), learns how
    they measured (``observe``) and stops its helpers (``close``); it must not
    offer a program twice. ``tune(strategy=NAME)`` and ``--strategy NAME``
    choose it.
    """
