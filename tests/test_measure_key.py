"""MeasureKey: where records were measured, and the exact string the database keeps them under."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from probtune.database.database import Database
from probtune.database.measure_key import COLD_CACHE, MeasureKey

XEON = "Intel(R) Xeon(R) Processor @ 2.50GHz"  # a real CPU model: an '@' inside the device's name
HOST = {"kind": "llvm", "mcpu": "znver4"}
OLD = Path(__file__).parent / "data" / "old_database.db"


@pytest.mark.parametrize(
    ("key", "text"),
    [
        (MeasureKey("host", "AMD EPYC 9R14"), "host@AMD EPYC 9R14"),
        (MeasureKey("host", "AMD EPYC 9R14", cold=True), "host+cold-llc@AMD EPYC 9R14"),
        (MeasureKey("host", XEON, cold=True), f"host+cold-llc@{XEON}"),
        (MeasureKey("arm-neon", "rpc:arm+neon@lab"), "arm-neon@rpc:arm+neon@lab"),
        (MeasureKey("host", "AMD EPYC", digest="0123abcd"), "host@AMD EPYC#0123abcd"),
        (MeasureKey("host"), "host"),  # made before devices were kept: the target's name alone
        (MeasureKey("host", cold=True), "host" + COLD_CACHE),
    ],
)
def test_a_key_is_written_as_the_database_holds_it_and_parsed_back(key: MeasureKey, text: str) -> None:
    assert key.text == str(key) == text
    assert MeasureKey.parse(text) == key


def test_cold_and_warm_keys_of_one_target_and_device_differ_only_in_the_timing_mode() -> None:
    warm, cold = MeasureKey.parse(f"host@{XEON}"), MeasureKey.parse(f"host+cold-llc@{XEON}")
    assert (warm.target, warm.device, warm.cold) == ("host", XEON, False)
    assert (cold.target, cold.device, cold.cold) == ("host", XEON, True)
    assert (warm.timed_target, cold.timed_target) == ("host", "host+cold-llc")


@pytest.mark.parametrize("text", ["", "@", "host@", "a@b@c", "host#0123abcd", "host@dev#0123", "host@dev#0123ABCD",
                                  "x+cold-llc+cold-llc@d#00000000", "+cold-llc"])
def test_any_string_parses_into_a_key_written_back_the_same(text: str) -> None:
    assert MeasureKey.parse(text).text == text


def test_a_known_target_name_holding_an_at_sign_splits_after_it() -> None:
    key = MeasureKey.parse("lab@7+cold-llc@board", "lab@7+cold-llc")
    assert (key.target, key.device, key.cold) == ("lab@7", "board", True) and key.text == "lab@7+cold-llc@board"
    assert MeasureKey.parse("lab@7", "lab@7") == MeasureKey("lab@7")


def test_a_digest_follows_a_device_and_is_eight_hex_digits() -> None:
    with pytest.raises(ValueError, match="digest"):
        MeasureKey("host", digest="0123abcd")
    with pytest.raises(ValueError, match="digest"):
        MeasureKey("host", "dev", digest="xyz")
    text = json.dumps(HOST, sort_keys=True)
    assert MeasureKey("host", "dev").with_digest_of(text).digest == hashlib.sha256(text.encode()).hexdigest()[:8]


def test_the_keys_of_an_old_database_parse_into_their_target_device_and_timing_mode() -> None:
    with sqlite3.connect(OLD) as conn:
        rows = conn.execute("SELECT key, target, device FROM measured_on ORDER BY key").fetchall()
    conn.close()
    assert rows, "the fixture registers its keys"
    for text, target, device in rows:
        key = MeasureKey.parse(text)
        assert (key.text, key.timed_target, key.device) == (text, target, device)
    assert {MeasureKey.parse(text).cold for text, _, _ in rows} == {False, True}


def test_the_database_registers_a_key_with_its_timed_target_and_device(tmp_path: Path) -> None:
    with Database(tmp_path / "t.db") as db:
        cold = db.measured_on(MeasureKey("host", XEON, cold=True), HOST)
        assert cold == MeasureKey("host", XEON, cold=True)
        [registered] = db.measurements("host+cold-llc")
        assert (registered.key, registered.target, registered.device, registered.tvm_target) == (
            cold, "host+cold-llc", XEON, HOST
        )
        other = db.measured_on(MeasureKey("host", XEON, cold=True), {"kind": "llvm", "mcpu": "znver3"})
        assert other.digest is not None and other.text.startswith(cold.text + "#")
        assert [m.key for m in db.measurements("host+cold-llc")] == sorted([cold, other], key=lambda k: k.text)
    with sqlite3.connect(tmp_path / "t.db") as conn:
        rows = conn.execute("SELECT key, target, device FROM measured_on ORDER BY key").fetchall()
    conn.close()
    assert rows == [(cold.text, "host+cold-llc", XEON), (other.text, "host+cold-llc", XEON)]
