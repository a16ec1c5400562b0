"""Realizing candidates in helper processes gives what realizing them here gives."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pytest
import tvm
import tvm_ffi

import probtune.plugins
import probtune.search.realize as realize_module
from probtune import Rng, hookimpl
from probtune.plugins import get_registry, load_registry
from probtune.schedule.schedule import InstructionKind
from probtune.search.realize import REPLAY_FAILED, Realized, Realizer, Rejected, _Chunks, realize_in_process
from probtune.search.search_strategy import EvolutionarySearch
from probtune.space.space_generator import generate_space
from probtune.workloads.catalog import resolve_workload
from probtune_xgb.model import XGBCostModel

_PARENT_PID = "PROBTUNE_TEST_PARENT_PID"


@dataclass(frozen=True)
class RejectByHash:
    """Rejects about a third of the programs, by their structural hash: some pass, some do not."""

    name: str = "reject-by-hash"

    def check(self, sch, ctx):
        return "hash" if tvm_ffi.structural_hash(sch.mod) % 3 == 0 else None


@dataclass(frozen=True)
class CrashInHelper:
    """Kills the process it runs in unless that is the test's own: a candidate that crashes a helper."""

    name: str = "crash-in-helper"

    def check(self, sch, ctx):
        if str(os.getpid()) != os.environ[_PARENT_PID]:
            os._exit(3)
        return None


@dataclass(frozen=True)
class SlowInHelper:
    """Takes a quarter of a second per candidate in a helper and no time in the test's process."""

    name: str = "slow-in-helper"

    def check(self, sch, ctx):
        if str(os.getpid()) != os.environ[_PARENT_PID]:
            time.sleep(0.25)
        return None


def _stream(sch, inputs, attrs):
    sch.annotate(inputs[0], "accel.stream", attrs["depth"])


class StreamPlugin:
    """Adds an instruction kind to the language, which a module below records."""

    __name__ = "stream"

    @hookimpl
    def probtune_register_instructions(self, register):
        register(InstructionKind("accel_stream", _stream))


@dataclass(frozen=True)
class StreamOuterLoop:
    name: str = "stream-outer-loop"

    def apply(self, sch, block, ctx):
        if sch.get(block).name_hint == "C":
            loop = sch.get_loops(block)[0]
            outer, _ = sch.split(loop, sch.sample_perfect_tile(loop, 2))
            sch.apply("accel_stream", [outer], {"depth": 2})


def _space(host, validators=None):
    workload = resolve_workload("matmul", (64, 64, 64), "float32", get_registry().workloads)
    return generate_space(workload, host, validators=validators)


def _jobs(space, count=12, seed=0):
    rng = Rng(seed)
    undecided = space.trace.with_decisions({})
    return [(undecided, rng.fork()) for _ in range(count)]


def _summary(outcomes):
    return [
        (o.trace.decision_hash(), o.program_hash, o.features.tobytes()) if isinstance(o, Realized) else o.by
        for o in outcomes
    ]


def _here_and_in_a_helper(serial_space, helped_space, jobs=None):
    """The same jobs realized in this process (in ``serial_space``) and by one helper (in ``helped_space``)."""
    jobs = jobs or _jobs
    serial = Realizer(serial_space, XGBCostModel(), workers=0).realize(jobs(serial_space))
    with_helpers = Realizer(helped_space, XGBCostModel(), workers=1)
    try:
        assert with_helpers.workers == 1
        return serial, with_helpers.realize(jobs(helped_space))
    finally:
        with_helpers.close()


def test_helpers_realize_what_this_process_would(host):
    validators = [*host.validators, RejectByHash()]
    serial_space, helped_space = _space(host, validators), _space(host, validators)
    serial, helped = _here_and_in_a_helper(serial_space, helped_space)
    assert _summary(helped) == _summary(serial)
    assert {type(o) for o in serial} == {Realized, Rejected}  # both kinds crossed the pipe
    assert helped_space.rejections == serial_space.rejections
    assert helped_space.rejections["reject-by-hash"] == sum(o == Rejected("reject-by-hash") for o in serial)
    # Programs realized here are kept for building; the helper's are not sent back.
    assert all(o.mod is not None for o in serial if isinstance(o, Realized))


def test_helpers_replay_the_instruction_kinds_a_plugin_adds(host, monkeypatch):
    monkeypatch.setattr(probtune.plugins, "_registry", load_registry(extra_plugins=[StreamPlugin()]))
    workload = resolve_workload("matmul", (64, 64, 64), "float32", get_registry().workloads)
    space = generate_space(workload, host, modules=[StreamOuterLoop()], validators=[])
    assert "accel_stream" in space.context.instructions and "split" not in space.context.instructions  # plugins' only
    serial, helped = _here_and_in_a_helper(space, space)
    assert {type(o) for o in serial} == {Realized} and _summary(helped) == _summary(serial)


def test_helpers_keep_their_programs_for_those_chosen_and_forget_the_rest(host):
    space = _space(host)
    realizer = Realizer(space, XGBCostModel(), workers=1)
    try:
        outcomes = realizer.realize(_jobs(space, count=16))
        elsewhere = [o.trace for o in outcomes if isinstance(o, Realized) and o.mod is None]
        assert len(elsewhere) >= 3, "the helper realized too few of the jobs for this test"
        chosen, carried, dropped = elsewhere[0], elsewhere[1], elsewhere[2]
        texts = realizer.programs([chosen.decision_hash(), 12345], keep=[carried.decision_hash()])
        assert list(texts) == [chosen.decision_hash()]  # a key no helper holds is left for the caller
        assert tvm_ffi.structural_equal(tvm.ir.load_json(texts[chosen.decision_hash()]), space.program(chosen))
        assert realizer.programs([dropped.decision_hash()], keep=[carried.decision_hash()]) == {}  # not kept
        texts = realizer.programs([carried.decision_hash()])
        assert tvm_ffi.structural_equal(tvm.ir.load_json(texts[carried.decision_hash()]), space.program(carried))
    finally:
        realizer.close()


def test_programs_of_a_replaced_helper_are_missing_not_wrong(host):
    space = _space(host)
    realizer = Realizer(space, XGBCostModel(), workers=1)
    try:
        outcomes = realizer.realize(_jobs(space, count=16))
        keys = [o.trace.decision_hash() for o in outcomes if isinstance(o, Realized) and o.mod is None]
        assert keys, "the helper realized none of the jobs"
        for helper in realizer._borrow():
            helper.kill()  # the builder replaces it at the next loan, without the programs it kept
        assert realizer.programs(keys) == {}
        assert realizer.workers == 1  # a replaced helper is not a failed one
    finally:
        realizer.close()


def test_a_trace_that_does_not_replay_is_rejected_as_such(host):
    space = _space(host)
    sampled = space.sample(Rng(0)).trace
    tile = next(i for i, inst in enumerate(sampled.instructions) if inst.kind == "sample_perfect_tile")
    broken = sampled.with_decisions({**sampled.decisions, tile: [3, 3, 3, 3]})
    outcomes = Realizer(space, XGBCostModel()).realize([(broken, None), (sampled, None)])
    assert outcomes[0] == Rejected(REPLAY_FAILED)
    assert isinstance(outcomes[1], Realized) and outcomes[1].trace.decision_hash() == sampled.decision_hash()
    assert space.rejections[REPLAY_FAILED] == 1


def test_a_helper_that_dies_is_reported_and_its_share_realized_here(host, monkeypatch):
    monkeypatch.setenv(_PARENT_PID, str(os.getpid()))
    space = _space(host, [*host.validators, CrashInHelper()])
    realizer = Realizer(space, XGBCostModel(), workers=1)
    try:
        died = r"a realize helper \(probtune builder worker\) died \(exit code 3\)"
        with pytest.warns(UserWarning, match=died) as caught:
            outcomes = realizer.realize(_jobs(space, count=6))
        assert [w.filename for w in caught if "realize helper" in str(w.message)] == [__file__]  # where it was called
        assert realizer.workers == 0
        assert _summary(outcomes) == _summary(Realizer(space, XGBCostModel()).realize(_jobs(space, count=6)))
    finally:
        realizer.close()


def test_jobs_go_to_whichever_process_is_free(host, monkeypatch):
    """A helper that falls behind gets fewer jobs than a fixed split would give it; the outcomes are the same."""
    monkeypatch.setenv(_PARENT_PID, str(os.getpid()))
    space = _space(host, [*host.validators, SlowInHelper()])
    here: list[int] = []

    def counting(space, jobs, featurize):
        here.append(len(jobs))
        return realize_in_process(space, jobs, featurize)

    realizer = Realizer(space, XGBCostModel(), workers=1)
    try:
        monkeypatch.setattr(realize_module, "realize_in_process", counting)
        outcomes = realizer.realize(_jobs(space, count=24))
    finally:
        realizer.close()
    assert sum(here) > 12, here  # half would have been this process's share
    assert _summary(outcomes) == _summary(Realizer(space, XGBCostModel()).realize(_jobs(space, count=24)))


def test_chunks_cover_every_job_once_and_shrink():
    chunks = _Chunks(100, processes=2)
    spans = []
    while chunks.left:
        spans.append(chunks.take())
    assert [i for span in spans for i in range(span.start, span.stop)] == list(range(100))
    sizes = [span.stop - span.start for span in spans]
    assert sizes[0] == 25 and sizes == sorted(sizes, reverse=True) and min(sizes) >= 1
    assert _Chunks(3, processes=4).take() == slice(0, 2)  # never below two jobs while there are two


def test_no_helpers_without_picklable_features_or_validators(host):
    @dataclass(frozen=True)
    class LocalValidator:  # defined in a function: does not pickle
        name: str = "local"

        def check(self, sch, ctx):
            return None

    class NoProgramFeatures:
        featurize = XGBCostModel().featurize

    assert Realizer(_space(host, [LocalValidator()]), XGBCostModel(), workers=1).workers == 0
    assert Realizer(_space(host), NoProgramFeatures(), workers=1).workers == 0
    with pytest.raises(ValueError, match="workers must not be negative"):
        Realizer(_space(host), XGBCostModel(), workers=-1)


def test_search_is_the_same_with_and_without_helpers(host):
    runs = []
    for workers in (0, 1):
        space = _space(host)
        search = EvolutionarySearch(
            space, Rng(5), XGBCostModel(seed=0), list(get_registry().mutators.values()), group="matmul",
            population_size=24, init_samples=12, generations=2, realize_workers=workers,
        )
        try:
            batches = [search.next_batch(6)]
            for _ in range(2):
                search.observe([(c, 1e-3 * (1 + c.program_hash % 7)) for c in batches[-1]])
                batches.append(search.next_batch(6))
        finally:
            search.close()
        assert all(batches)
        runs.append(([[c.decision_hash for c in b] for b in batches], dict(space.rejections)))
        candidates = [c for batch in batches for c in batch]
        for candidate in candidates:  # chosen programs are finished, whoever realized them
            assert tvm_ffi.structural_equal(candidate.mod, space.program(candidate.trace))
        # the programs the helper realized come back as text, not realized again here
        assert any(isinstance(c.program, str) for c in candidates) == (workers == 1)
    assert runs[0] == runs[1]


def test_a_helper_is_sent_its_next_chunk_only_after_it_answered_the_last(host, monkeypatch):
    """Both ends write without reading otherwise: a large reply and a large next chunk then block each other."""
    space = _space(host)
    owed: dict[int, int] = {}
    send, receive = Realizer._send, Realizer._receive

    def sending(self, helper, chunk):
        assert owed.get(id(helper), 0) == 0, "a chunk was sent to a helper that still owed a reply"
        owed[id(helper)] = 1
        send(self, helper, chunk)

    def receiving(self, helper, chunk):
        owed[id(helper)] = 0
        return receive(self, helper, chunk)

    monkeypatch.setattr(Realizer, "_send", sending)
    monkeypatch.setattr(Realizer, "_receive", receiving)
    realizer = Realizer(space, XGBCostModel(), workers=1)
    try:
        outcomes = realizer.realize(_jobs(space, count=24))
    finally:
        realizer.close()
    assert owed, "no chunk went to the helper"
    assert _summary(outcomes) == _summary(Realizer(space, XGBCostModel()).realize(_jobs(space, count=24)))


def test_a_helper_draws_from_every_sketch_of_the_space(host):
    from conftest import AnnotatedOrNot, annotated
    from probtune_cpu.multi_level_tiling import MultiLevelTiling

    def space():
        return generate_space(resolve_workload("matmul", "64,64,64", "float32"), host,
                              modules=[AnnotatedOrNot(), MultiLevelTiling()])

    def jobs(space):
        return [(space.undecided(Rng(seed)), Rng(seed)) for seed in range(8)]

    serial_space, helped_space = space(), space()
    serial, helped = _here_and_in_a_helper(serial_space, helped_space, jobs)
    assert _summary(helped) == _summary(serial)
    assert {annotated(o.trace) for o in serial if isinstance(o, Realized)} == {False, True}
