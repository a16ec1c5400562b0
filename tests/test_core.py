"""The Python-visible API of the Rust core, probtune._core."""

from __future__ import annotations

import copy
import json
import math
import pickle
import subprocess
import sys

import numpy as np
import pytest

from probtune._core import (
    Instruction,
    InvalidDecisionError,
    Rng,
    Trace,
    TraceFormatError,
    check_categorical,
    check_perfect_tile,
    sample_categorical,
    sample_perfect_tile,
)


def small_trace() -> Trace:
    """get_sblock -> get_loops -> sample_perfect_tile -> split -> sample_categorical."""
    trace = Trace()
    trace.append("get_sblock", [], {"name": "C", "func_name": "main"}, [0])
    trace.append("get_loops", [{"rv": 0}], {}, [1, 2])
    trace.append("sample_perfect_tile", [{"rv": 1}], {"n": 2, "max_innermost_factor": 16}, [3, 4], [8, 8])
    trace.append("split", [{"rv": 1}, [{"rv": 3}, {"rv": 4}]], {"preserve_unit_iters": True}, [5, 6])
    trace.append("sample_categorical", [], {"candidates": [0, 16], "probs": [0.5, 0.5]}, [7], 1)
    return trace


# ---- building and reading traces ------------------------------------------------------


def test_empty_trace():
    trace = Trace()
    assert len(trace) == 0
    assert trace.instructions == []
    assert trace.decisions == {}
    assert repr(trace) == "Trace(0 instructions, 0 decisions)"


def test_append_returns_indices_and_records_everything():
    trace = Trace()
    assert trace.append("get_sblock", [], {"name": "C"}, [0]) == 0
    assert trace.append("sample_categorical", [None, True, -3, 2.5, "s"], {"nested": {"a": [{"rv": 0}]}}, [1], 0) == 1
    inst = trace.instruction(1)
    assert isinstance(inst, Instruction)
    assert inst.kind == "sample_categorical"
    assert inst.inputs == [None, True, -3, 2.5, "s"]
    assert inst.attrs == {"nested": {"a": [{"rv": 0}]}}
    assert inst.outputs == [1]
    assert trace.instructions == [trace.instruction(0), inst]
    assert repr(trace) == "Trace(2 instructions, 1 decisions)"


def test_argument_types_survive_the_round_trip_exactly():
    trace = Trace()
    trace.append("get_sblock", [], {}, [0])
    inputs = [{"rv": 0}, {"rv": 0, "extra": 1}, 1, 1.0, True, None, [], {}]
    trace.append("annotate", inputs, {}, [])
    got = trace.instruction(1).inputs
    assert got == inputs
    assert [type(v) for v in got] == [type(v) for v in inputs]


def test_instruction_and_decision_index_errors():
    trace = small_trace()
    with pytest.raises(IndexError):
        trace.instruction(5)
    with pytest.raises(IndexError):
        trace.instruction(-1)
    with pytest.raises(IndexError):
        trace.decision(99)


def test_decisions_and_sampling_indices():
    trace = small_trace()
    assert trace.decisions == {2: [8, 8], 4: 1}
    assert trace.decision(2) == [8, 8]
    assert trace.decision(4) == 1
    assert trace.decision(3) is None
    assert trace.sampling_indices() == [2, 4]


def test_decision_on_non_sampling_instruction_is_rejected():
    trace = small_trace()
    with pytest.raises(InvalidDecisionError, match=r"instruction 5 \(fuse\) is not a sampling instruction"):
        trace.append("fuse", [{"rv": 5}], {}, [8], 3)
    assert len(trace) == 5


def test_reused_output_is_rejected():
    trace = small_trace()
    with pytest.raises(ValueError, match="output rv 7 is already defined"):
        trace.append("fuse", [], {}, [7])
    with pytest.raises(ValueError, match="output rv 9 is already defined"):
        trace.append("fuse", [], {}, [9, 9])
    assert len(trace) == 5


def test_undefined_rv_is_rejected_with_index_and_id():
    trace = small_trace()
    with pytest.raises(ValueError, match=r"instruction 5 \(fuse\): input refers to undefined rv 17"):
        trace.append("fuse", [{"rv": 5}, [{"rv": 17}]], {}, [8])
    with pytest.raises(ValueError, match=r'attr "loop" refers to undefined rv 40'):
        trace.append("annotate", [], {"loop": {"rv": 40}}, [])
    with pytest.raises(ValueError, match="undefined rv 8"):
        trace.append("fuse", [{"rv": 8}], {}, [8])  # an instruction cannot use its own output
    assert len(trace) == 5


@pytest.mark.parametrize(
    "bad, fragment",
    [
        (np.arange(3), "numpy.ndarray"),
        ({1, 2}, "set"),
        ((1, 2), "tuple"),
        (2**63, str(2**63)),
        (-(2**63) - 1, str(-(2**63) - 1)),
        (object(), "object"),
        (b"bytes", "bytes"),
        ({1: "a"}, "keys must be str"),
        ([1, [np.int64(3)]], "numpy.int64"),
    ],
)
def test_non_json_arguments_are_type_errors_naming_the_value(bad, fragment):
    trace = Trace()
    with pytest.raises(TypeError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        trace.append("annotate", [bad], {}, [])
    with pytest.raises(TypeError):
        trace.append("annotate", [], {"value": bad}, [])
    assert len(trace) == 0


@pytest.mark.parametrize("bad", [math.nan, math.inf, {"rv": -1}, {"rv": 2**32}, {"rv": "x"}, {"rv": 1.0}])
def test_unencodable_values_are_value_errors(bad):
    trace = Trace()
    trace.append("get_sblock", [], {}, [0, 1])
    with pytest.raises(ValueError):
        trace.append("annotate", [bad], {}, [])


@pytest.mark.parametrize("bad", ["4", 4.0, [4, "4"], [4.0], True, [True], (2, 2), None])
def test_decisions_must_be_int_or_list_of_ints(bad):
    trace = Trace()
    trace.append("get_sblock", [], {}, [0])
    if bad is None:
        trace.append("sample_categorical", [], {}, [1], bad)  # None means "no decision"
        assert trace.decisions == {}
        return
    with pytest.raises(TypeError, match="decision must be an int or a list of ints"):
        trace.append("sample_categorical", [], {}, [1], bad)


# ---- with_decisions --------------------------------------------------------------------


def test_with_decisions_replaces_all_decisions():
    trace = small_trace()
    changed = trace.with_decisions({2: [16, 4], 4: 0})
    assert changed.decisions == {2: [16, 4], 4: 0}
    assert changed.instructions == trace.instructions
    assert trace.decisions == {2: [8, 8], 4: 1}, "the original keeps its decisions"
    assert trace.with_decisions({4: 0}).decisions == {4: 0}
    assert trace.with_decisions({}).decisions == {}


def test_with_decisions_rejects_non_sampling_and_missing_instructions():
    trace = small_trace()
    with pytest.raises(InvalidDecisionError, match=r"instruction 3 \(split\) is not a sampling instruction"):
        trace.with_decisions({3: 1})
    with pytest.raises(InvalidDecisionError, match="instruction 9"):
        trace.with_decisions({9: 1})
    with pytest.raises(InvalidDecisionError, match="instruction -1"):
        trace.with_decisions({-1: 1})
    with pytest.raises(TypeError):
        trace.with_decisions({"2": [8, 8]})
    with pytest.raises(TypeError):
        trace.with_decisions({2: "8"})


# ---- hashing ---------------------------------------------------------------------------


def test_decision_hash_depends_on_decisions_only():
    trace = small_trace()
    same = Trace.from_json(trace.to_json())
    assert trace.decision_hash() == same.decision_hash()
    assert trace.with_decisions({2: [8, 8], 4: 1}).decision_hash() == trace.decision_hash()
    assert trace.with_decisions({2: [16, 4], 4: 1}).decision_hash() != trace.decision_hash()
    assert trace.with_decisions({}).decision_hash() != trace.decision_hash()
    assert 0 <= trace.decision_hash() < 2**64


def test_structure_hash_ignores_decisions():
    trace = small_trace()
    assert trace.structure_hash() == trace.with_decisions({}).structure_hash()
    longer = trace.copy()
    longer.append("fuse", [{"rv": 5}, {"rv": 6}], {}, [8])
    assert longer.structure_hash() != trace.structure_hash()


def test_hashes_are_stable_across_processes():
    trace = small_trace()
    script = (
        "from probtune._core import Trace; import sys; "
        "t = Trace.from_json(sys.stdin.read()); print(t.decision_hash(), t.structure_hash())"
    )
    hashes = set()
    for seed in ("0", "12345"):
        result = subprocess.run(
            [sys.executable, "-c", script],
            input=trace.to_json(),
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed},
        )
        hashes.add(result.stdout.strip())
    assert hashes == {f"{trace.decision_hash()} {trace.structure_hash()}"}


# ---- JSON ------------------------------------------------------------------------------


def test_json_round_trip_is_canonical():
    trace = small_trace()
    text = trace.to_json()
    doc = json.loads(text)
    assert doc["version"] == 1
    assert doc["decisions"] == [[2, [8, 8]], [4, 1]]
    assert doc["insts"][3] == {
        "kind": "split",
        "inputs": [{"rv": 1}, [{"rv": 3}, {"rv": 4}]],
        "attrs": {"preserve_unit_iters": True},
        "outputs": [5, 6],
    }
    parsed = Trace.from_json(text)
    assert parsed == trace
    assert parsed.to_json() == text
    assert Trace.from_json(json.dumps(doc, indent=2)) == trace


def _doc() -> dict:
    return json.loads(small_trace().to_json())


def _mutated(change) -> str:
    doc = _doc()
    change(doc)
    return json.dumps(doc)


MALFORMED = [
    ("garbage", "expected value"),
    ("", "EOF"),
    ("[]", "expected a trace object"),
    ("null", "expected a trace object"),
    (small_trace().to_json() + " x", "trailing characters"),
    (_mutated(lambda d: d.update(version=2)), "unsupported trace format version 2"),
    (_mutated(lambda d: d.pop("version")), "missing field `version`"),
    (_mutated(lambda d: d.pop("insts")), "missing field `insts`"),
    (_mutated(lambda d: d.update(extra=1)), "unknown field `extra`"),
    (_mutated(lambda d: d["insts"][1].update(kind=3)), "insts[1].kind"),
    (_mutated(lambda d: d["insts"][1].pop("attrs")), "missing field `attrs`"),
    (_mutated(lambda d: d["insts"][1].update(outputs=[-1, 2])), "insts[1].outputs[0]"),
    (_mutated(lambda d: d["insts"][1].update(outputs=[2**32, 2])), "insts[1].outputs[0]"),
    (_mutated(lambda d: d["insts"][0]["attrs"].update(big=2**63)), "insts[0].attrs.big"),
    (_mutated(lambda d: d["insts"][1].update(inputs=[{"rv": 17}])), "instruction 1 (get_loops): input refers to undefined rv 17"),
    (_mutated(lambda d: d["insts"][1].update(inputs=[{"rv": -1}])), "rv reference"),
    (_mutated(lambda d: d["insts"][1].update(outputs=[0, 2])), "instruction 1 (get_loops): output rv 0 is already defined"),
    (_mutated(lambda d: d["decisions"].append([3, 1])), "instruction 3 (split) is not a sampling instruction"),
    (_mutated(lambda d: d["decisions"].append([50, 1])), "decision for instruction 50, but the trace has 5 instructions"),
    (_mutated(lambda d: d["decisions"].append([2, [4, 16]])), "instruction 2 is given two decisions"),
    (_mutated(lambda d: d["decisions"].append([-2, 1])), "decisions[2]"),
    (_mutated(lambda d: d["decisions"].append([4, "x"])), "decisions[2]"),
    (_mutated(lambda d: d["decisions"].append([4, 2**63])), "does not fit"),
    (_mutated(lambda d: d["decisions"].append([4])), "decisions[2]"),
]


@pytest.mark.parametrize("text, fragment", MALFORMED)
def test_malformed_json_raises_trace_format_error(text, fragment):
    with pytest.raises(TraceFormatError) as info:
        Trace.from_json(text)
    message = str(info.value)
    assert message.startswith("trace JSON: ")
    assert fragment in message


def test_trace_format_error_is_a_value_error():
    assert issubclass(TraceFormatError, ValueError)
    assert issubclass(InvalidDecisionError, ValueError)
    assert TraceFormatError.__module__ == "probtune._core"


# ---- copying, equality, pickling -------------------------------------------------------


def test_copies_are_equal_and_independent():
    trace = small_trace()
    for duplicate in (trace.copy(), copy.copy(trace), copy.deepcopy(trace)):
        assert duplicate == trace
        duplicate.append("fuse", [{"rv": 5}, {"rv": 6}], {}, [8])
        assert duplicate != trace
        assert len(trace) == 5


def test_equality_compares_instructions_and_decisions():
    assert small_trace() == small_trace()
    assert small_trace() != small_trace().with_decisions({})
    assert small_trace() != Trace()
    assert small_trace() != "trace"


def test_pickle_round_trip():
    trace = small_trace()
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        restored = pickle.loads(pickle.dumps(trace, protocol=protocol))
        assert restored == trace
        assert restored.decision_hash() == trace.decision_hash()


# ---- Rng -------------------------------------------------------------------------------


def test_rng_is_deterministic_per_seed():
    a, b = Rng(42), Rng(42)
    assert [a.next_u64() for _ in range(10)] == [b.next_u64() for _ in range(10)]
    assert Rng(42).next_u64() != Rng(43).next_u64()
    assert Rng(2024).next_u64() == 1029197146548041518  # pinned: same stream on every platform


def test_rng_draws_are_in_range():
    rng = Rng(1)
    draws = [rng.randint(-3, 4) for _ in range(2000)]
    assert set(draws) == set(range(-3, 4))
    floats = [rng.random() for _ in range(2000)]
    assert all(0.0 <= x < 1.0 for x in floats)
    assert 0 <= rng.next_u64() < 2**64
    assert -(2**63) <= rng.randint(-(2**63), 2**63 - 1) < 2**63 - 1


def test_randint_rejects_empty_range():
    with pytest.raises(ValueError, match="empty range"):
        Rng(0).randint(5, 5)


def test_rng_rejects_bad_seeds():
    with pytest.raises(OverflowError):
        Rng(-1)
    with pytest.raises(TypeError):
        Rng("seed")


def test_fork_is_deterministic_and_independent():
    parent_a, parent_b = Rng(7), Rng(7)
    child_a, child_b = parent_a.fork(), parent_b.fork()
    assert child_a == child_b
    assert parent_a == parent_b
    child_stream = {child_a.next_u64() for _ in range(100)}
    parent_stream = {parent_a.next_u64() for _ in range(100)}
    assert not child_stream & parent_stream


def test_rng_state_resumes_the_stream():
    rng = Rng(9)
    rng.next_u64()
    state = rng.state
    assert len(state) == 4
    resumed = Rng.from_state(state)
    assert [rng.next_u64() for _ in range(5)] == [resumed.next_u64() for _ in range(5)]
    with pytest.raises(ValueError):
        Rng.from_state([1, 2, 3])
    with pytest.raises(ValueError):
        Rng.from_state([0, 0, 0, 0])


def test_rng_pickles_mid_stream():
    rng = Rng(11)
    rng.random()
    restored = pickle.loads(pickle.dumps(rng))
    assert restored == rng
    assert restored.next_u64() == rng.next_u64()


# ---- sampling --------------------------------------------------------------------------


@pytest.mark.parametrize("extent, n, limit", [(512, 4, 16), (1024, 2, 64), (384, 3, 0), (7, 2, 1), (1, 3, 4), (2**20, 2, 2)])
def test_perfect_tiles_are_valid(extent, n, limit):
    rng = Rng(0)
    for _ in range(200):
        factors = sample_perfect_tile(rng, extent, n, limit)
        assert len(factors) == n
        assert math.prod(factors) == extent
        assert limit <= 0 or factors[-1] <= limit
        check_perfect_tile(factors, extent, n, limit)


def test_perfect_tiles_keep_the_inner_product_limit():
    """``max_inner_product`` bounds every factor but the outermost: the tile one outer iteration covers."""
    rng = Rng(5)
    draws = [sample_perfect_tile(rng, 4096, 4, 4, 8) for _ in range(200)]
    for factors in draws:
        assert math.prod(factors) == 4096 and math.prod(factors[1:]) <= 8 and factors[-1] <= 4
        check_perfect_tile(factors, 4096, 4, 4, 8)
    assert len({tuple(f) for f in draws}) > 5
    with pytest.raises(InvalidDecisionError, match="product exceeds max_inner_product 8"):
        check_perfect_tile([64, 4, 4, 4], 4096, 4, 4, 8)
    check_perfect_tile([64, 4, 4, 4], 4096, 4, 4)  # without the limit, the same decision is valid


def test_perfect_tile_sampling_is_deterministic_and_varied():
    draws = [sample_perfect_tile(Rng(3), 256, 3, 16) for _ in range(2)]
    assert draws[0] == draws[1]
    rng = Rng(3)
    assert len({tuple(sample_perfect_tile(rng, 256, 3, 16)) for _ in range(100)}) > 10


@pytest.mark.parametrize("extent, n, limit", [(0, 2, 0), (-4, 2, 0), (8, 0, 0), (8, -1, 0), (32, 1, 16)])
def test_perfect_tile_rejects_bad_arguments(extent, n, limit):
    with pytest.raises(ValueError):
        sample_perfect_tile(Rng(0), extent, n, limit)


@pytest.mark.parametrize(
    "decision, extent, n, limit, message",
    [
        ([3, 5], 16, 2, 0, "perfect tile decision [3, 5] has product 15, loop extent is 16"),
        ([4, 4], 16, 3, 0, "perfect tile decision [4, 4] has 2 factors, expected 3"),
        ([-4, -4], 16, 2, 0, "perfect tile decision [-4, -4] has non-positive factor -4"),
        ([1, 16], 16, 2, 8, "perfect tile decision [1, 16] has innermost factor 16 > max_innermost_factor 8"),
        ([2**62, 4], 16, 2, 0, "has a product that overflows"),
    ],
)
def test_check_perfect_tile_explains_the_problem(decision, extent, n, limit, message):
    with pytest.raises(InvalidDecisionError) as info:
        check_perfect_tile(decision, extent, n, limit)
    assert message in str(info.value)


def test_check_perfect_tile_accepts_valid_decisions():
    check_perfect_tile([2, 8], 16, 2, 8)
    check_perfect_tile([16], 16, 1, 0)


def test_categorical_sampling():
    rng = Rng(8)
    draws = [sample_categorical(rng, [1.0, 0.0, 3.0]) for _ in range(2000)]
    assert 1 not in draws
    assert 350 < draws.count(0) < 650
    assert [sample_categorical(Rng(5), [1, 2, 3]) for _ in range(3)] == [sample_categorical(Rng(5), [1, 2, 3])] * 3


@pytest.mark.parametrize("probs", [[], [0.0, 0.0], [1.0, -0.5], [math.nan], [math.inf]])
def test_categorical_rejects_bad_probabilities(probs):
    with pytest.raises(ValueError):
        sample_categorical(Rng(0), probs)


def test_check_categorical():
    check_categorical(0, 3)
    check_categorical(2, 3)
    with pytest.raises(InvalidDecisionError, match="categorical decision 3 is out of range for 3 candidates"):
        check_categorical(3, 3)
    with pytest.raises(InvalidDecisionError):
        check_categorical(-1, 3)
