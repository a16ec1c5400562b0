"""What a plugin imports from probtune: the one kernel module a plugin needs.

A plugin is a package with an entry point in the ``probtune`` group whose
module implements hooks (:mod:`probtune.hookspecs`) with ``@hookimpl``. What
it registers satisfies the Protocols here (:mod:`probtune.interfaces`); a
design-space module writes programs with :class:`Schedule` and its random
variables, a plugin's own schedule instruction is an :class:`InstructionKind`;
the TIR analysis (:mod:`probtune.schedule.analysis`) reads programs; :class:`AutoUnroll` is
a space module every target's space shares; a task scheduler or a search
strategy reads :class:`TaskProgress` or starts from :class:`SearchStart`; a graph rewrite edits a
Relax module with :func:`mutated` (counting reads with :func:`variable_uses`; :data:`ELEMENTWISE_UNARY` and
:data:`ELEMENTWISE_BINARY` name the operators a layout change commutes with; :func:`split_bounds` where a split
cuts); :func:`import_parsed` imports a TVM module that parses TVMScript as it loads (tensor intrinsics);
a cost model finds the registered feature
extractors with :func:`get_registry`; errors say what failed. The rest of the
kernel may change without notice: the built-in plugins import nothing else
(``tests/test_plugin_sdk.py``). Each name is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from probtune._lazy import lazy_attributes

if TYPE_CHECKING:
    from probtune.defaults import MAX_PRODUCT_POWER, TARGET_PRECISIONS
    from probtune.errors import (
        NOT_REPLAYABLE,
        InvalidDecisionError,
        PluginError,
        ProbtuneError,
        ReplayError,
        TraceFormatError,
        UnsupportedTargetError,
        last_line,
        warn_caller,
    )
    from probtune.hookspecs import hookimpl
    from probtune.interfaces import (
        Builder,
        BuilderFactory,
        BundleRuntime,
        Compiler,
        CostModel,
        CostModelFactory,
        DeviceCode,
        FeatureExtractor,
        GraphRewrite,
        Mutator,
        OnnxConverter,
        Runner,
        RunnerFactory,
        SpaceContext,
        SpaceModule,
        TargetSpec,
        Validator,
    )
    from probtune.measure.constant_layouts import layout_free_params
    from probtune.model.concat_in_place import variable_uses
    from probtune.model.split_parts import split_bounds
    from probtune.model.transposes import ELEMENTWISE_BINARY, ELEMENTWISE_UNARY, mutated, static_shape
    from probtune.plugins import get_registry
    from probtune.schedule.analysis import (
        OTHER,
        REDUCTION,
        SPATIAL,
        allows,
        as_list,
        at_root,
        block_names,
        child_stmts,
        contiguous_along,
        find_realize,
        identity,
        indexing_dims,
        is_one,
        is_spatial,
        iter_stmts,
        loop_kinds,
        nested_sblocks,
        realize_of,
        reuses_data,
        root_tile,
        sblock_names,
        thread_tag,
        variable_ids,
    )
    from probtune.schedule.schedule import BlockRV, ExprRV, InstructionKind, LoopRV, Schedule
    from probtune.schedule.script_imports import import_parsed
    from probtune.search.search_strategy import SearchStrategy
    from probtune.search.strategies import SearchStart, StrategyKind
    from probtune.space.design_space import Candidate
    from probtune.space.unroll import UNROLL_KEY, AutoUnroll
    from probtune.task.task_scheduler import TaskProgress, TaskScheduler

_FROM = {
    "probtune.hookspecs": ["hookimpl"],
    "probtune.interfaces": [
        "Builder", "BuilderFactory", "BundleRuntime", "Compiler", "CostModel", "CostModelFactory", "DeviceCode",
        "FeatureExtractor", "GraphRewrite", "Mutator",
        "OnnxConverter", "Runner", "RunnerFactory", "SpaceContext", "SpaceModule", "TargetSpec", "Validator",
    ],
    "probtune.schedule.schedule": ["BlockRV", "ExprRV", "InstructionKind", "LoopRV", "Schedule"],
    "probtune.schedule.script_imports": ["import_parsed"],
    "probtune.schedule.analysis": [
        "OTHER", "REDUCTION", "SPATIAL", "allows", "as_list", "at_root", "block_names", "child_stmts", "contiguous_along",
        "find_realize", "identity", "indexing_dims", "is_one", "is_spatial", "iter_stmts", "loop_kinds", "nested_sblocks",
        "realize_of", "reuses_data", "root_tile", "sblock_names", "thread_tag", "variable_ids",
    ],
    "probtune.space.unroll": ["UNROLL_KEY", "AutoUnroll"],
    "probtune.search.search_strategy": ["SearchStrategy"],
    "probtune.space.design_space": ["Candidate"],
    "probtune.search.strategies": ["SearchStart", "StrategyKind"],
    "probtune.task.task_scheduler": ["TaskProgress", "TaskScheduler"],
    "probtune.measure.constant_layouts": ["layout_free_params"],
    "probtune.model.concat_in_place": ["variable_uses"],
    "probtune.model.split_parts": ["split_bounds"],
    "probtune.model.transposes": ["ELEMENTWISE_BINARY", "ELEMENTWISE_UNARY", "mutated", "static_shape"],
    "probtune.plugins": ["get_registry"],
    "probtune.defaults": ["MAX_PRODUCT_POWER", "TARGET_PRECISIONS"],
    "probtune.errors": [
        "NOT_REPLAYABLE", "InvalidDecisionError", "PluginError", "ProbtuneError", "ReplayError", "TraceFormatError",
        "UnsupportedTargetError", "last_line", "warn_caller",
    ],
}
_SOURCE_OF = {name: module for module, names in _FROM.items() for name in names}

__all__ = [
    "ELEMENTWISE_BINARY",
    "ELEMENTWISE_UNARY",
    "MAX_PRODUCT_POWER",
    "NOT_REPLAYABLE",
    "OTHER",
    "REDUCTION",
    "SPATIAL",
    "TARGET_PRECISIONS",
    "UNROLL_KEY",
    "AutoUnroll",
    "BlockRV",
    "Builder",
    "BuilderFactory",
    "BundleRuntime",
    "Candidate",
    "Compiler",
    "CostModel",
    "CostModelFactory",
    "DeviceCode",
    "ExprRV",
    "FeatureExtractor",
    "GraphRewrite",
    "InstructionKind",
    "InvalidDecisionError",
    "LoopRV",
    "Mutator",
    "OnnxConverter",
    "PluginError",
    "ProbtuneError",
    "ReplayError",
    "Runner",
    "RunnerFactory",
    "Schedule",
    "SearchStart",
    "SearchStrategy",
    "SpaceContext",
    "SpaceModule",
    "StrategyKind",
    "TargetSpec",
    "TaskProgress",
    "TaskScheduler",
    "TraceFormatError",
    "UnsupportedTargetError",
    "Validator",
    "allows",
    "as_list",
    "at_root",
    "block_names",
    "child_stmts",
    "contiguous_along",
    "find_realize",
    "get_registry",
    "hookimpl",
    "identity",
    "import_parsed",
    "indexing_dims",
    "is_one",
    "is_spatial",
    "iter_stmts",
    "last_line",
    "layout_free_params",
    "loop_kinds",
    "mutated",
    "nested_sblocks",
    "realize_of",
    "reuses_data",
    "root_tile",
    "sblock_names",
    "split_bounds",
    "static_shape",
    "thread_tag",
    "variable_ids",
    "variable_uses",
    "warn_caller",
]

__getattr__, __dir__ = lazy_attributes(__name__, _SOURCE_OF, __all__)
