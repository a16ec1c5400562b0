"""The probabilistic language: recording, replay, decisions."""

from __future__ import annotations

import math
import re

import pytest
import tvm
import tvm_ffi
from tvm import s_tir

from probtune import InvalidDecisionError, ReplayError, Rng, Schedule, Trace, TraceFormatError
from probtune.schedule.schedule import InstructionKind


def tile_matmul(sch: Schedule) -> None:
    block = sch.get_sblock("C")
    i, j, k = sch.get_loops(block)
    i_tiles = sch.sample_perfect_tile(i, n=3, max_innermost_factor=8)
    j_tiles = sch.sample_perfect_tile(j, n=3, max_innermost_factor=16)
    i0, i1, i2 = sch.split(i, i_tiles)
    j0, j1, j2 = sch.split(j, j_tiles)
    k0, k1 = sch.split(k, [None, 4])
    sch.reorder(i0, j0, i1, j1, k0, i2, k1, j2)
    sch.parallel(sch.fuse(i0, j0))
    unroll = sch.sample_categorical([0, 16, 64], [0.2, 0.4, 0.4])
    sch.annotate(block, "pragma_auto_unroll_max_step", unroll)


def test_every_step_is_recorded(matmul_mod):
    sch = Schedule(matmul_mod, rng=Rng(1))
    tile_matmul(sch)
    kinds = [inst.kind for inst in sch.trace.instructions]
    assert kinds == [
        "get_sblock", "get_loops", "sample_perfect_tile", "sample_perfect_tile", "split", "split", "split",
        "reorder", "fuse", "parallel", "sample_categorical", "annotate",
    ]
    assert sorted(sch.trace.decisions) == [2, 3, 10]
    i_tiles = sch.trace.decision(2)
    assert i_tiles[0] * i_tiles[1] * i_tiles[2] == 64 and i_tiles[2] <= 8


def test_a_fork_goes_on_apart_from_where_its_schedule_was(matmul_mod):
    sch = Schedule(matmul_mod, rng=Rng(1))
    block = sch.get_sblock("C")
    i, _, _ = sch.get_loops(block)
    before = sch.mod
    fork = sch.fork()
    fork.split(i, [None, 8])  # random variables made before the fork hold in it
    sch.parallel(i)
    assert len(fork.get_loops(block)) == 4 and len(sch.get_loops(block)) == 3
    assert [inst.kind for inst in fork.trace.instructions][2:] == ["split", "get_loops"]
    assert [inst.kind for inst in sch.trace.instructions][2:] == ["parallel", "get_loops"]
    assert tvm_ffi.structural_equal(Schedule.replay(matmul_mod, fork.trace).mod, fork.mod)
    assert "T.parallel" not in fork.mod.script() and not tvm_ffi.structural_equal(before, fork.mod)


def test_replay_gives_structurally_equal_program(matmul_mod):
    sch = Schedule(matmul_mod, rng=Rng(7))
    tile_matmul(sch)
    again = Schedule.replay(matmul_mod, Trace.from_json(sch.trace.to_json()))
    assert tvm_ffi.structural_equal(again.mod, sch.mod)
    assert again.trace == sch.trace


@pytest.mark.parametrize("until", [0, 3, 9])
def test_a_replay_stopped_part_way_goes_on_to_the_same_program(matmul_mod, until):
    sch = Schedule(matmul_mod, rng=Rng(7))
    tile_matmul(sch)
    undecided = sch.trace.with_decisions({})
    whole = Schedule.replay(matmul_mod, undecided, rng=Rng(3))
    part = Schedule.replay(matmul_mod, undecided, rng=Rng(3), until=until)
    assert len(part.trace) == until
    part.replay_more(undecided, until)
    assert part.trace == whole.trace  # the decisions drawn after the stop come from the same stream
    assert tvm_ffi.structural_equal(part.mod, whole.mod)


def test_schedules_of_one_program_start_from_it_and_stay_apart(matmul_mod):
    """Schedules of one program are copies of one kept schedule: changing one must not reach the others."""
    first = Schedule(matmul_mod, rng=Rng(1))
    tile_matmul(first)
    second = Schedule(matmul_mod, rng=Rng(2))
    assert tvm_ffi.structural_equal(second.mod, s_tir.Schedule(matmul_mod).mod)
    tile_matmul(second)
    assert not tvm_ffi.structural_equal(first.mod, second.mod)
    assert tvm_ffi.structural_equal(Schedule(matmul_mod).mod, s_tir.Schedule(matmul_mod).mod)
    assert type(second.tvm) is type(first.tvm)  # the copy keeps the class without TVM's per-call argument checks


def test_replay_with_other_decisions_gives_that_program(matmul_mod):
    sch = Schedule(matmul_mod, rng=Rng(7))
    tile_matmul(sch)
    changed = sch.trace.with_decisions({2: [4, 2, 8], 3: [2, 2, 16], 10: 1})
    replayed = Schedule.replay(matmul_mod, changed)

    expected = s_tir.Schedule(matmul_mod)
    block = expected.get_sblock("C")
    i, j, k = expected.get_loops(block)
    i0, i1, i2 = expected.split(i, [4, 2, 8])
    j0, j1, j2 = expected.split(j, [2, 2, 16])
    k0, k1 = expected.split(k, [None, 4])
    expected.reorder(i0, j0, i1, j1, k0, i2, k1, j2)
    expected.parallel(expected.fuse(i0, j0))
    expected.annotate(block, "pragma_auto_unroll_max_step", 16)
    assert tvm_ffi.structural_equal(replayed.mod, expected.mod)
    assert replayed.get(_rv(replayed, 10)) == 16


def _rv(sch: Schedule, index: int):
    from probtune.schedule.schedule import ExprRV

    return ExprRV(sch.trace.instructions[index].outputs[0])


def test_invalid_tile_decision_is_rejected(matmul_mod):
    sch = Schedule(matmul_mod)
    tile_matmul(sch)
    with pytest.raises(InvalidDecisionError, match=r"instruction 2 \(sample_perfect_tile\).*product"):
        Schedule.replay(matmul_mod, sch.trace.with_decisions({2: [4, 4, 8], 3: [2, 2, 16]}))
    with pytest.raises(InvalidDecisionError, match="instruction 3"):
        Schedule.replay(matmul_mod, sch.trace.with_decisions({3: [1, 1, 64]}))  # innermost 64 > 16


def test_invalid_categorical_decision_is_rejected(matmul_mod):
    sch = Schedule(matmul_mod)
    tile_matmul(sch)
    with pytest.raises(InvalidDecisionError, match="instruction 10"):
        Schedule.replay(matmul_mod, sch.trace.with_decisions({10: 3}))


def test_a_uniform_choice_is_recorded_as_a_categorical_one(matmul_mod):
    sch = Schedule(matmul_mod, rng=Rng(3))
    chosen = sch.get(sch.sample_uniform([4, 8, 16]))
    [inst] = sch.trace.instructions
    assert inst.kind == "sample_categorical" and inst.attrs == {"candidates": [4, 8, 16], "probs": [1 / 3] * 3}
    assert chosen == [4, 8, 16][sch.trace.decisions[0]]


def test_decision_on_non_sampling_instruction_is_rejected(matmul_mod):
    sch = Schedule(matmul_mod)
    tile_matmul(sch)
    with pytest.raises(InvalidDecisionError):
        sch.trace.with_decisions({4: [1]})


def test_fresh_decisions_are_deterministic_per_seed(matmul_mod):
    sch = Schedule(matmul_mod)
    tile_matmul(sch)
    space = sch.trace.with_decisions({})
    first = [Schedule.replay(matmul_mod, space, rng=Rng(s)).trace.decisions for s in range(6)]
    second = [Schedule.replay(matmul_mod, space, rng=Rng(s)).trace.decisions for s in range(6)]
    assert first == second
    assert len({str(d) for d in first}) > 1  # different seeds explore different points


def test_compute_location_is_sampled_and_checked():
    from tvm import te

    a = te.placeholder((64, 64), name="A")
    b = te.compute((64, 64), lambda i, j: a[i, j] * 2.0, name="B")
    c = te.compute((64, 64), lambda i, j: b[i, j] + 1.0, name="C")
    mod = tvm.IRModule({"main": te.create_prim_func([a, c])})

    sch = Schedule(mod, rng=Rng(3))
    producer = sch.get_sblock("B")
    consumer = sch.get_sblock("C")
    _, j = sch.get_loops(consumer)
    sch.split(j, [8, 8])
    location = sch.sample_compute_location(producer)
    sch.compute_at(producer, location)
    decision = sch.trace.decision(4)
    assert isinstance(decision, int) and -2 <= decision <= 2

    for legal in (-1, 0, 1, 2):
        replayed = Schedule.replay(mod, sch.trace.with_decisions({4: legal}))
        assert replayed.trace.decision(4) == legal
    with pytest.raises(InvalidDecisionError, match="instruction 4"):
        Schedule.replay(mod, sch.trace.with_decisions({4: 7}))


def test_illegal_program_is_a_replay_error(matmul_mod):
    trace = Trace()
    trace.append("get_sblock", [], {"name": "C", "func_name": "main"}, [0])
    trace.append("get_loops", [{"rv": 0}], {}, [1, 2, 3])
    trace.append("parallel", [{"rv": 3}], {}, [])  # k is a reduction loop
    with pytest.raises(ReplayError, match=r"instruction 2 \(parallel\)"):
        Schedule.replay(matmul_mod, trace)


def test_unknown_instruction_kind_is_a_format_error(matmul_mod):
    trace = Trace()
    trace.append("get_sblock", [], {"name": "C", "func_name": "main"}, [0])
    trace.append("teleport", [{"rv": 0}], {}, [])
    with pytest.raises(TraceFormatError, match="teleport"):
        Schedule.replay(matmul_mod, trace)


@pytest.mark.parametrize(
    ("n", "shown"),
    [("4.5", "4.5"), ("123456789012345678901234", "1.23456789"), ('"4"', "'4'")],  # too large: read as a float
)
def test_a_tile_count_that_is_not_an_integer_is_a_format_error(matmul_mod, n, shown):
    sch = Schedule(matmul_mod, rng=Rng(0))
    i, _, _ = sch.get_loops(sch.get_sblock("C"))
    sch.sample_perfect_tile(i, n=2, max_innermost_factor=16)
    text = sch.trace.to_json()
    assert text.count('"n":2') == 1
    damaged = Trace.from_json(text.replace('"n":2', f'"n":{n}'))
    named = rf"instruction 2 \(sample_perfect_tile\): attribute 'n' must be an integer, got {re.escape(shown)}"
    with pytest.raises(TraceFormatError, match=named):
        Schedule.replay(matmul_mod, damaged)


def test_malformed_trace_json_is_rejected():
    for text in ["{", '{"version": 1}', '{"version": 99, "insts": [], "decisions": []}', "[]"]:
        with pytest.raises(TraceFormatError):
            Trace.from_json(text)


def test_gpu_primitives_are_recorded_and_replayed(matmul_mod):
    """bind, set_scope and storage_align replay from JSON to the same program (the GPU space needs them)."""
    sch = Schedule(matmul_mod, rng=Rng(5))
    block = sch.get_sblock("C")
    i, j, k = sch.get_loops(block)
    i0, i1 = sch.split(i, [None, 16])
    j0, j1 = sch.split(j, [None, 16])
    sch.reorder(i0, j0, i1, j1, k)
    sch.bind(sch.fuse(i0, j0), "blockIdx.x")
    sch.bind(sch.fuse(i1, j1), "threadIdx.x")
    copy = sch.cache_read(block, 0, "global")
    sch.set_scope(copy, 0, "shared")
    sch.storage_align(copy, 0, axis=0, factor=32, offset=1)
    kinds = [inst.kind for inst in sch.trace.instructions]
    assert {"bind", "set_scope", "storage_align"} <= set(kinds)
    assert 'thread="threadIdx.x"' in sch.mod.script() and 'scope="shared"' in sch.mod.script()
    again = Schedule.replay(matmul_mod, Trace.from_json(sch.trace.to_json()))
    assert tvm_ffi.structural_equal(again.mod, sch.mod)


def test_blockize_is_recorded_and_replayed(matmul_mod):
    """blockize makes a 16x16x16 tile one block (what a tensor intrinsic replaces), and replays to the same program."""
    sch = Schedule(matmul_mod)
    block = sch.get_sblock("C")
    loops = [sch.split(loop, [None, 16]) for loop in sch.get_loops(block)]
    sch.reorder(*[outer for outer, _ in loops], *[inner for _, inner in loops])
    tile = sch.blockize(loops[0][1])
    assert sch.get(tile).name_hint == "C_o" and [sch.loop_extent(loop) for loop in sch.get_loops(block)] == [16, 16, 16]
    again = Schedule.replay(matmul_mod, Trace.from_json(sch.trace.to_json()))
    assert tvm_ffi.structural_equal(again.mod, sch.mod)


def test_a_tile_limited_per_outer_iteration_is_recorded_and_checked_on_replay(matmul_mod):
    sch = Schedule(matmul_mod, rng=Rng(2))
    loop = sch.get_loops(sch.get_sblock("C"))[0]
    factors = sch.sample_perfect_tile(loop, 3, max_innermost_factor=4, max_inner_product=8)
    assert math.prod(sch.get(f) for f in factors[1:]) <= 8
    text = sch.trace.to_json()
    assert '"max_inner_product":8' in text.replace(" ", "")
    plain = Schedule(matmul_mod, rng=Rng(2))
    plain.sample_perfect_tile(plain.get_loops(plain.get_sblock("C"))[0], 3, max_innermost_factor=4)
    assert "max_inner_product" not in plain.trace.to_json()  # traces without the limit are unchanged
    too_big = Trace.from_json(text).with_decisions({2: [1, 16, 4]})
    with pytest.raises(InvalidDecisionError, match="max_inner_product 8"):
        Schedule.replay(matmul_mod, too_big)


def test_a_bind_to_an_unknown_thread_axis_is_a_replay_error(matmul_mod):
    sch = Schedule(matmul_mod)
    loop = sch.get_loops(sch.get_sblock("C"))[0]
    sch.bind(loop, "threadIdx.x")
    text = sch.trace.to_json().replace('"threadIdx.x"', '"warpIdx.q"')
    with pytest.raises(ReplayError, match="instruction 2 \\(bind\\)"):
        Schedule.replay(matmul_mod, Trace.from_json(text))


def _stream(sch: s_tir.Schedule, inputs: list, attrs: dict) -> None:
    sch.annotate(inputs[0], "accel.stream", attrs["depth"])


STREAM = InstructionKind("stream", _stream)


def test_an_instruction_kind_a_plugin_adds_is_recorded_and_replayed(matmul_mod):
    sch = Schedule(matmul_mod, instructions={"stream": STREAM})
    loop = sch.get_loops(sch.get_sblock("C"))[0]
    assert sch.apply("stream", [loop], {"depth": 2}) == []
    assert '"accel.stream": 2' in sch.mod.script()
    text = sch.trace.to_json()
    again = Schedule.replay(matmul_mod, Trace.from_json(text), instructions={"stream": STREAM})
    assert tvm_ffi.structural_equal(again.mod, sch.mod)
    with pytest.raises(TraceFormatError, match=r"instruction 2 \(stream\): unknown instruction kind 'stream'.*plugins"):
        Schedule.replay(matmul_mod, Trace.from_json(text))  # a schedule not given the plugin's kinds


def test_the_language_keeps_its_own_kinds_over_a_plugin_s(matmul_mod):
    shadow = InstructionKind("split", lambda sch, inputs, attrs: [])
    sch = Schedule(matmul_mod, instructions={"split": shadow})
    i = sch.get_loops(sch.get_sblock("C"))[0]
    assert len(sch.split(i, [None, 4])) == 2


def test_allows_asks_tvm_on_a_copy_and_leaves_the_schedule_as_it_was():
    from tvm import te

    from probtune.schedule.analysis import allows

    a = te.placeholder((8, 8), "float32", name="A")
    k = te.reduce_axis((0, 8), "k")
    total = te.compute((8,), lambda i: te.sum(a[i, k], axis=k), name="total")
    scaled = te.compute((8,), lambda i: total[i] * 2.0, name="scaled")
    raw = s_tir.Schedule(te.create_prim_func([a, scaled]))
    before = raw.mod.script()
    total_rv, scaled_rv = raw.get_sblock("total"), raw.get_sblock("scaled")
    assert not allows(raw, lambda trial: trial.compute_inline(total_rv))  # a reduction does not inline
    assert allows(raw, lambda trial: trial.reverse_compute_at(scaled_rv, trial.get_loops(total_rv)[0]))
    assert raw.mod.script() == before
