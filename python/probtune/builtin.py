"""The kernel's own plugin: the workload catalog, the schedule language's instructions and their mutators, local
measurement, the task schedulers and the search strategies.

Registered through the same hooks a third-party plugin uses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from probtune.hookspecs import hookimpl

__all__ = [
    "probtune_register_builders",
    "probtune_register_instructions",
    "probtune_register_mutators",
    "probtune_register_onnx_converters",
    "probtune_register_runners",
    "probtune_register_search_strategies",
    "probtune_register_task_schedulers",
    "probtune_register_workloads",
]


@hookimpl
def probtune_register_workloads(register: Callable[[Any], None]) -> None:
    from probtune.workloads.catalog import BUILTIN_WORKLOADS

    for spec in BUILTIN_WORKLOADS:
        register(spec)


@hookimpl
def probtune_register_instructions(register: Callable[[Any], None]) -> None:
    from probtune.schedule.schedule import PRIMITIVES

    for kind in PRIMITIVES.values():
        register(kind)


@hookimpl
def probtune_register_mutators(register: Callable[[Any], None]) -> None:
    from probtune.search.mutators import BUILTIN_MUTATORS

    for mutator in BUILTIN_MUTATORS:
        register(mutator)


@hookimpl
def probtune_register_onnx_converters(register: Callable[[str, Any], None]) -> None:
    from probtune.model.onnx_ops import ONNX_CONVERTERS
    from probtune.model.onnx_quantized_ops import QUANTIZED_CONVERTERS

    for op_type, converter in {**ONNX_CONVERTERS, **QUANTIZED_CONVERTERS}.items():
        register(op_type, converter)


@hookimpl
def probtune_register_builders(register: Callable[[str, Any], None]) -> None:
    from probtune.measure import LocalBuilder

    register(LocalBuilder.name, LocalBuilder)


@hookimpl
def probtune_register_runners(register: Callable[[str, Any], None]) -> None:
    from probtune.measure import LocalRunner, RPCRunner

    register(LocalRunner.name, LocalRunner)
    register(RPCRunner.name, RPCRunner)  # its tracker and key from the environment, when a target names it


@hookimpl
def probtune_register_task_schedulers(register: Callable[[str, Any], None]) -> None:
    from probtune.task.task_scheduler import BUILTIN_SCHEDULERS

    for scheduler in BUILTIN_SCHEDULERS:
        register(scheduler.name, scheduler)


@hookimpl
def probtune_register_search_strategies(register: Callable[[Any], None]) -> None:
    from probtune.search.strategies import BUILTIN_STRATEGIES

    for kind in BUILTIN_STRATEGIES:
        register(kind)
