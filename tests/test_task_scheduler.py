"""Task schedulers with a fake measurer: every task is reached first, then trials go where they cut the most."""

from __future__ import annotations

import pytest

from probtune.task.driver import make_scheduler
from probtune.task.task_scheduler import GradientScheduler, RoundRobinScheduler, TaskProgress, spend


class FakeTasks:
    """Tasks whose best latency after n trials is ``floor + (start - floor) / (1 + n / pace)``; some run out."""

    def __init__(self, specs: list[tuple[float, float, float, float]], capacity: dict[int, int] | None = None) -> None:
        self.specs = specs  # (weight, start, floor, pace)
        self.capacity = capacity or {}
        self.trials = [0] * len(specs)
        self.order: list[int] = []
        self.sizes: list[int] = []  # each round's size, as asked for

    def progress(self) -> list[TaskProgress]:
        return [TaskProgress(f"task{i}", weight) for i, (weight, *_rest) in enumerate(self.specs)]

    def run_round(self, index: int, size: int) -> tuple[int, float | None]:
        self.sizes.append(size)
        left = self.capacity.get(index, 10**9) - self.trials[index]
        measured = max(0, min(size, left))
        self.trials[index] += measured
        if measured:
            self.order.append(index)
        _, start, floor, pace = self.specs[index]
        return measured, floor + (start - floor) / (1 + self.trials[index] / pace)


def test_every_task_gets_a_round_first_then_the_heavy_slow_task_gets_most():
    fake = FakeTasks([(1, 1.0, 0.9, 4), (10, 5.0, 1.0, 16), (1, 0.1, 0.09, 4)])
    tasks = fake.progress()
    spent = spend(300, tasks, GradientScheduler(), fake.run_round, batch_size=10)
    assert spent == 300 and sum(t.trials for t in tasks) == 300
    assert sorted(fake.order[:3]) == [0, 1, 2]  # one round each before anything else
    assert fake.trials[1] > fake.trials[0] + fake.trials[2]
    assert all(t.rounds[-1][0] == t.trials for t in tasks)


def test_round_robin_takes_turns():
    fake = FakeTasks([(1, 1.0, 0.5, 4), (100, 5.0, 1.0, 4), (1, 1.0, 0.5, 4)])
    tasks = fake.progress()
    spend(60, tasks, make_scheduler("round-robin"), fake.run_round, batch_size=10)
    assert fake.order == [0, 1, 2, 0, 1, 2]


def test_an_exhausted_task_stops_drawing_budget_and_the_rest_goes_on():
    fake = FakeTasks([(100, 5.0, 1.0, 4), (1, 1.0, 0.5, 4)], capacity={0: 12})
    tasks = fake.progress()
    spent = spend(100, tasks, GradientScheduler(), fake.run_round, batch_size=8)
    assert tasks[0].done and fake.trials[0] == 12
    assert spent == 100 and fake.trials[1] == 88


def test_all_exhausted_ends_early():
    fake = FakeTasks([(1, 1.0, 0.5, 4), (1, 1.0, 0.5, 4)], capacity={0: 5, 1: 7})
    tasks = fake.progress()
    assert spend(100, tasks, RoundRobinScheduler(), fake.run_round, batch_size=4) == 12
    assert all(t.done for t in tasks)


def test_a_small_budget_is_spread_over_the_tasks_first_rounds():
    fake = FakeTasks([(1, 1.0, 0.5, 4)] * 5)
    tasks = fake.progress()
    assert spend(20, tasks, GradientScheduler(), fake.run_round, batch_size=16) == 20
    assert sorted(fake.order[:5]) == [0, 1, 2, 3, 4] and fake.sizes[:5] == [2] * 5  # half the budget, shared


def test_the_first_rounds_of_many_tasks_leave_half_the_budget_to_the_slow_ones():
    # 40 tasks, one holding most of the time: rounds of 16 each first would take 640 of the 1000 trials.
    fake = FakeTasks([(50, 5.0, 1.0, 16)] + [(1, 0.1, 0.09, 4)] * 39)
    tasks = fake.progress()
    assert spend(1000, tasks, GradientScheduler(), fake.run_round, batch_size=16) == 1000
    assert fake.sizes[:40] == [12] * 40  # 500 trials over 40 first rounds
    assert fake.trials[0] > 500


def test_a_share_of_one_gives_full_first_rounds():
    fake = FakeTasks([(1, 1.0, 0.5, 4)] * 5)
    spend(100, fake.progress(), GradientScheduler(), fake.run_round, batch_size=16, first_rounds_share=1.0)
    assert fake.sizes[:5] == [16] * 5


def test_fewer_trials_than_tasks_reach_the_first_tasks_only():
    fake = FakeTasks([(1, 1.0, 0.5, 4)] * 5)
    tasks = fake.progress()
    assert spend(3, tasks, GradientScheduler(), fake.run_round, batch_size=16) == 3
    assert fake.trials == [1, 1, 1, 0, 0]


def test_a_task_that_never_gives_a_correct_program_is_given_up():
    class Failing(FakeTasks):
        def run_round(self, index, size):
            measured, best = super().run_round(index, size)
            return measured, None if index == 0 else best

    fake = Failing([(1000, 1.0, 0.5, 4), (1, 1.0, 0.5, 4)])
    tasks = fake.progress()
    spend(200, tasks, GradientScheduler(max_failed_rounds=2), fake.run_round, batch_size=10)
    assert len(tasks[0].rounds) == 2 and fake.trials[1] == 180


def test_a_task_tuned_before_starts_where_it_was():
    fake = FakeTasks([(1, 1.0, 0.5, 4), (1, 1.0, 0.5, 4)])
    tasks = fake.progress()
    tasks[0].trials, tasks[0].rounds = 500, [(500, 0.5)]  # from the database: no first round needed
    spend(20, tasks, GradientScheduler(), fake.run_round, batch_size=10)
    assert fake.order[0] == 1


def test_gain_weighs_recent_improvement_and_weight():
    scheduler = GradientScheduler(alpha=0.5, window=1)
    flat = TaskProgress("flat", 1.0, trials=20, rounds=[(10, 1.0), (20, 1.0)])
    improving = TaskProgress("improving", 1.0, trials=20, rounds=[(10, 2.0), (20, 1.0)])
    heavy = TaskProgress("heavy", 3.0, trials=20, rounds=[(10, 1.0), (20, 1.0)])
    assert scheduler.gain(improving) > scheduler.gain(flat) and scheduler.gain(heavy) == 3 * scheduler.gain(flat)


def test_unknown_scheduler_is_named():
    with pytest.raises(ValueError, match="unknown task scheduler 'fastest'; choose one of gradient, round-robin"):
        make_scheduler("fastest")


def test_a_plugin_s_scheduler_is_made_by_name(monkeypatch):
    import probtune.plugins
    from probtune.plugin import hookimpl
    from probtune.plugins import load_registry

    class LastFirst:
        """The last unfinished task first."""

        name = "last-first"

        def next_task(self, tasks):
            return next((i for i in reversed(range(len(tasks))) if not tasks[i].done), None)

    class Plugin:
        @hookimpl
        def probtune_register_task_schedulers(self, register):
            register(LastFirst.name, LastFirst)

    monkeypatch.setattr(probtune.plugins, "_registry", load_registry(extra_plugins=[Plugin()]))
    fake = FakeTasks([(1, 1.0, 0.5, 4)] * 3)
    spend(6, fake.progress(), make_scheduler("last-first"), fake.run_round, batch_size=2)
    assert fake.trials == [0, 0, 6]
    assert list(load_registry().task_schedulers) == ["gradient", "round-robin"]
