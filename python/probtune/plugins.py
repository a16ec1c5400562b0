"""The plugin manager: loads the ``probtune`` entry points and collects what they register.

``PROBTUNE_LOAD_PLUGINS`` (comma-separated entry-point names) is an allow-list:
only those plugins load; set it to an empty string to load none.
``PROBTUNE_BLOCK_PLUGINS`` names plugins that must not load. A plugin that
raises while loading or registering is reported by name in a warning and the
others still load.
"""

from __future__ import annotations

import importlib.metadata
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pluggy

from probtune import hookspecs
from probtune.errors import PluginError

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
    "PROJECT",
    "PluginInfo",
    "PluginLoadWarning",
    "Registry",
    "get_registry",
    "load_registry",
    "name_list",
    "reset_registry",
]

PROJECT = "probtune"
ALLOW_ENV = "PROBTUNE_LOAD_PLUGINS"
BLOCK_ENV = "PROBTUNE_BLOCK_PLUGINS"
KERNEL_PLUGIN = "probtune.builtin"


class PluginLoadWarning(UserWarning):
    """A plugin failed to load or register; the others are unaffected."""


@dataclass
class PluginInfo:
    """One loaded plugin: where it comes from and what it registered."""

    name: str
    distribution: str
    version: str
    registered: dict[str, list[str]] = field(default_factory=dict)
    error: str | None = None


# hook name -> (registry attribute, whether register() takes (name, factory))
_HOOKS: dict[str, tuple[str, bool]] = {
    "probtune_register_workloads": ("workloads", False),
    "probtune_register_targets": ("targets", False),
    "probtune_register_instructions": ("instructions", False),
    "probtune_register_space_modules": ("space_modules", False),
    "probtune_register_mutators": ("mutators", False),
    "probtune_register_validators": ("validators", False),
    "probtune_register_graph_rewrites": ("graph_rewrites", False),
    "probtune_register_onnx_converters": ("onnx_converters", True),
    "probtune_register_cost_models": ("cost_models", True),
    "probtune_register_builders": ("builders", True),
    "probtune_register_runners": ("runners", True),
    "probtune_register_bundle_runtimes": ("bundle_runtimes", False),
    "probtune_register_feature_extractors": ("feature_extractors", False),
    "probtune_register_task_schedulers": ("task_schedulers", True),
    "probtune_register_search_strategies": ("search_strategies", False),
}


@dataclass
class Registry:
    """Everything the loaded plugins registered, by kind and name, each table typed as its hook registers it."""

    workloads: dict[str, WorkloadSpec] = field(default_factory=dict)
    targets: dict[str, TargetSpec] = field(default_factory=dict)
    instructions: dict[str, InstructionKind] = field(default_factory=dict)
    space_modules: dict[str, SpaceModule] = field(default_factory=dict)
    mutators: dict[str, Mutator] = field(default_factory=dict)
    validators: dict[str, Validator] = field(default_factory=dict)
    graph_rewrites: dict[str, GraphRewrite] = field(default_factory=dict)
    onnx_converters: dict[str, OnnxConverter] = field(default_factory=dict)
    cost_models: dict[str, CostModelFactory] = field(default_factory=dict)
    builders: dict[str, BuilderFactory] = field(default_factory=dict)
    runners: dict[str, RunnerFactory] = field(default_factory=dict)
    bundle_runtimes: dict[str, BundleRuntime] = field(default_factory=dict)
    feature_extractors: dict[str, FeatureExtractor] = field(default_factory=dict)
    task_schedulers: dict[str, Callable[[], TaskScheduler]] = field(default_factory=dict)
    search_strategies: dict[str, StrategyKind] = field(default_factory=dict)
    plugins: dict[str, PluginInfo] = field(default_factory=dict)


def name_list(value: str) -> tuple[str, ...]:
    """The names of a comma-separated list, in order, blanks dropped (``PROBTUNE_LOAD_PLUGINS``, ``--graph-rewrites``)."""
    return tuple(part.strip() for part in value.split(",") if part.strip())


def _wanted(name: str) -> bool:
    allow = os.environ.get(ALLOW_ENV)
    if allow is not None and name not in name_list(allow):
        return False
    return name not in name_list(os.environ.get(BLOCK_ENV, ""))


def _warn(plugin: str, what: str, exc: BaseException) -> None:
    warnings.warn(
        f"probtune plugin {plugin!r} failed to {what}: {type(exc).__name__}: {exc}",
        PluginLoadWarning,
        stacklevel=3,
    )


def _make_register(
    registry: Registry, info: PluginInfo, attr: str, named: bool, reserved: frozenset[str] = frozenset()
) -> Callable[..., None]:
    table: dict[str, Any] = getattr(registry, attr)

    def register(*args: Any) -> None:
        if named:
            if len(args) != 2 or not isinstance(args[0], str) or not callable(args[1]):
                raise PluginError(f"register() for {attr} takes (name: str, factory: callable)")
            name, item = args
        else:
            if len(args) != 1:
                raise PluginError(f"register() for {attr} takes exactly one object")
            item = args[0]
            name = getattr(item, "name", None)
            if not isinstance(name, str) or not name:
                raise PluginError(f"{attr[:-1]} {item!r} has no string 'name' attribute")
        if name in reserved:
            raise PluginError(f"{attr[:-1]} {name!r} is a name the kernel keeps for itself")
        if name in table:
            owner = next(p.name for p in registry.plugins.values() if name in p.registered.get(attr, []))
            raise PluginError(f"{attr[:-1]} {name!r} is already registered by plugin {owner!r}")
        table[name] = item
        info.registered.setdefault(attr, []).append(name)

    return register


def _entry_point_plugins(pm: pluggy.PluginManager) -> dict[str, PluginInfo]:
    infos: dict[str, PluginInfo] = {}
    for ep in importlib.metadata.entry_points(group=PROJECT):
        if not _wanted(ep.name) or ep.name in infos:
            continue
        dist = ep.dist
        info = PluginInfo(ep.name, dist.name if dist else "?", dist.version if dist else "?")
        infos[ep.name] = info
        try:
            plugin = ep.load()
            pm.register(plugin, name=ep.name)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not take the others down
            info.error = f"load: {type(exc).__name__}: {exc}"
            _warn(ep.name, "load", exc)
    return infos


def load_registry(extra_plugins: list[ModuleType | object] | None = None) -> Registry:
    """Load the kernel's own plugin, every wanted entry point and ``extra_plugins``; collect registrations."""
    from probtune import builtin
    from probtune.measure.run_bundle import TVM_RUNTIME
    from probtune.schedule.schedule import SAMPLING_KINDS

    # The sampling instructions and the TVM bundle runtime are the kernel's, not registered.
    reserved = {"instructions": frozenset(SAMPLING_KINDS), "bundle_runtimes": frozenset({TVM_RUNTIME})}

    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(builtin, name=KERNEL_PLUGIN)
    registry = Registry()
    registry.plugins[KERNEL_PLUGIN] = PluginInfo(KERNEL_PLUGIN, PROJECT, _own_version())
    registry.plugins.update(_entry_point_plugins(pm))
    for extra in extra_plugins or []:
        name = getattr(extra, "__name__", None) or type(extra).__name__
        pm.register(extra, name=name)
        registry.plugins[name] = PluginInfo(name, "(registered in process)", "")

    for hook_name, (attr, named) in _HOOKS.items():
        hook = getattr(pm.hook, hook_name)
        for impl in hook.get_hookimpls():  # registration order: kernel first
            info = registry.plugins[impl.plugin_name]
            if info.error:
                continue
            try:
                impl.function(register=_make_register(registry, info, attr, named, reserved.get(attr, frozenset())))
            except Exception as exc:  # noqa: BLE001 - a hook that fails names its plugin, the others still register
                info.error = f"{hook_name}: {type(exc).__name__}: {exc}"
                _warn(impl.plugin_name, f"run {hook_name}", exc)
    return registry


def _own_version() -> str:
    try:
        return importlib.metadata.version(PROJECT)
    except importlib.metadata.PackageNotFoundError:
        return "dev"


_registry: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry, loaded on first use."""
    global _registry
    if _registry is None:
        _registry = load_registry()
    return _registry


def reset_registry() -> None:
    """Forget the loaded registry (after installing a plugin or changing the environment variables)."""
    global _registry
    _registry = None
