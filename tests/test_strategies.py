"""Search strategies come from the registry: the built-ins and a plugin's, started by the tuning loop alike."""

from __future__ import annotations

from typing import ClassVar

import pytest

import probtune
import probtune.plugins
from probtune.errors import TuningConfigError
from probtune.plugin import SearchStart, StrategyKind, hookimpl
from probtune.plugins import load_registry
from probtune.search.search_strategy import RandomSearch
from probtune.task.driver import strategy_kind

SMALL = dict(shape=(64, 64, 64), target="host", batch_size=4, confirm=0)


class CountingSearch(RandomSearch):
    """Random search that counts what the loop asked of it."""

    batches: ClassVar[list[int]] = []
    starts: ClassVar[list[SearchStart]] = []

    @classmethod
    def start(cls, start: SearchStart) -> CountingSearch:
        cls.starts.append(start)
        return cls(start.space, start.rng, seen_decisions=start.seen_decisions, seen_programs=start.seen_programs)

    def next_batch(self, size: int):
        self.batches.append(size)
        return super().next_batch(size)


class CountingPlugin:
    @hookimpl
    def probtune_register_search_strategies(self, register):
        register(StrategyKind("counting", False, CountingSearch.start))


@pytest.fixture
def counting(monkeypatch):
    monkeypatch.setattr(probtune.plugins, "_registry", load_registry(extra_plugins=[CountingPlugin()]))
    CountingSearch.batches, CountingSearch.starts = [], []


def test_the_built_in_strategies_are_registered_through_the_hook():
    registry = load_registry()
    assert list(registry.search_strategies) == ["evolutionary", "random"]
    assert registry.search_strategies["evolutionary"].uses_cost_model
    assert not registry.search_strategies["random"].uses_cost_model
    assert "search_strategies" in registry.plugins["probtune.builtin"].registered


def test_a_plugin_s_strategy_drives_the_tuning_loop(tmp_path, counting):
    # No cost model is made for a strategy that uses none: an unknown cost model's name is never looked up.
    result = probtune.tune("matmul", trials=6, database=tmp_path / "t.db", strategy="counting",
                           cost_model="no-such-model", **SMALL)
    assert result.measured == 6 and sum(CountingSearch.batches) >= 6
    (start,) = CountingSearch.starts
    assert start.cost_model is None and start.group == result.workload.key and not start.measured


def test_an_unknown_strategy_is_named_with_the_registered_ones(tmp_path, counting):
    with pytest.raises(TuningConfigError, match="unknown search strategy 'annealing'; choose one of evolutionary, random, counting"):
        probtune.tune("matmul", trials=1, database=tmp_path / "t.db", strategy="annealing", **SMALL)
    assert strategy_kind("counting").start == CountingSearch.start
