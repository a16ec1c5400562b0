"""probtune.measure.rpc: tuning over TVM's RPC tracker, all on loopback (a tracker and two servers started here)."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator

import pytest
import tvm
from tvm.rpc.tracker import Tracker

import probtune
from conftest import host_key
from probtune import Database
from probtune.cli import main
from probtune.cli.commands import _parser
from probtune.cli.model import model_runner
from probtune.measure.rpc import tracker_servers

KEY = "loopback"
SMALL = dict(shape=(64, 64, 64), target="host", batch_size=8, confirm=0)
FAST = dict(min_repeat_ms=5.0, timeout=20.0)


@contextlib.contextmanager
def rpc_pool(servers: int, init=None) -> Iterator[tuple[str, list]]:
    """A tracker and ``servers`` servers under KEY on 127.0.0.1, until the block ends; yields the tracker's address.

    ``init`` runs in each server's process before it serves."""
    tracker = Tracker(host="127.0.0.1", port=9190, port_end=9390, silent=True)
    started = [
        tvm.rpc.Server(host="127.0.0.1", port=9400, port_end=9600, tracker_addr=("127.0.0.1", tracker.port),
                       key=KEY, silent=True, server_init_callback=init)
        for _ in range(servers)
    ]
    try:
        deadline = time.monotonic() + 30
        while tracker_servers(("127.0.0.1", tracker.port)).get(KEY, 0) < servers:
            assert time.monotonic() < deadline, "the RPC servers did not register with the tracker"
            time.sleep(0.1)
        yield f"127.0.0.1:{tracker.port}", started
    finally:
        for server in started:
            server.terminate()
        tracker.terminate()


@pytest.fixture(scope="module")
def pool() -> Iterator[str]:
    with rpc_pool(2) as (address, _):
        yield address


def _records(path) -> list:
    with Database(path) as db:
        return db.records(db.workloads()[0].id)


def test_a_tune_over_rpc_records_what_a_local_one_does(pool, tmp_path):
    with probtune.RPCRunner(pool, KEY, **FAST) as runner:
        assert runner.servers == 2
        remote = probtune.tune("matmul", trials=16, database=tmp_path / "rpc.db", runner=runner, strategy="random",
                               **SMALL)
        assert len(runner._sessions) == 2  # the batch was spread over both servers
    with probtune.LocalRunner(**FAST) as runner:
        local = probtune.tune("matmul", trials=16, database=tmp_path / "local.db", runner=runner, strategy="random",
                              **SMALL)
    assert remote.measured == local.measured == 16 and remote.statuses == local.statuses == {"ok": 16}
    over_rpc, here = _records(tmp_path / "rpc.db"), _records(tmp_path / "local.db")
    # kept apart by where they were measured: the servers' key, this machine's CPU
    assert {r.target for r in over_rpc} == {f"host@rpc:{KEY}"} and {r.target for r in here} == {host_key()}
    # a random search of the same seed: the same candidates, recorded over RPC as the servers finish them
    assert {r.decision_hash for r in over_rpc} == {r.decision_hash for r in here}
    for record in over_rpc:  # the same fields filled as a local record's
        assert record.error is None and record.mean_latency > 0 and 1 <= len(record.latencies) <= 3
        assert record.build_seconds > 0 and record.run_seconds > 0


def test_a_server_killed_mid_run_costs_at_most_its_candidate(tmp_path):
    with rpc_pool(2) as (address, servers):
        killed = []

        def kill_one(outcome) -> None:
            if outcome.trial == 4 and not killed:
                servers[1].terminate()
                killed.append(outcome.trial)

        with probtune.RPCRunner(address, KEY, **FAST) as runner:
            result = probtune.tune("matmul", trials=16, database=tmp_path / "t.db", runner=runner,
                                   progress=kill_one, **SMALL)
            assert len(runner._sessions) == 1  # the killed server's session was dropped, the other finished the run
    assert killed and result.measured == 16
    records = _records(tmp_path / "t.db")
    assert len(records) == 16  # every trial recorded, none lost
    lost = [r for r in records if r.status == probtune.MeasureStatus.DEVICE_LOST]
    assert len(lost) <= 1 and all("lost" in r.error for r in lost)
    assert sum(r.status == "ok" for r in records) >= 15


# Sent to the servers' processes by value: a lambda (cloudpickle sends a function of this module by its name).
_describe_as_emulated = functools.partial(
    tvm.register_global_func, "probtune.device.describe", lambda: "an emulated test device", override=True
)


def test_what_a_server_says_of_its_device_is_told_once(tmp_path):
    with rpc_pool(1, init=_describe_as_emulated) as (address, _), probtune.RPCRunner(address, KEY, **FAST) as runner:
        with pytest.warns(UserWarning, match=r"the RPC servers of key 'loopback' run on an emulated test device"):
            probtune.tune("matmul", trials=4, database=tmp_path / "t.db", runner=runner, **SMALL)
        assert runner.descriptions == {"an emulated test device"}


def test_a_tracker_that_cannot_be_reached_is_named_before_any_trial():
    with pytest.raises(probtune.DeviceError, match=r"cannot reach the RPC tracker at 127\.0\.0\.1:9"):
        probtune.RPCRunner("127.0.0.1:9", KEY)


def test_a_key_without_servers_is_named_before_any_trial(pool, tmp_path):
    with pytest.raises(probtune.DeviceError, match=r"no server with key 'rasp4b'"):
        probtune.RPCRunner(pool, "rasp4b")
    code = main(["tune", "--trials", "1", "--shape", "16,16,16", "--database", str(tmp_path / "t.db"),
                 "--rpc-tracker", pool, "--rpc-key", "rasp4b"])
    assert code == 2 and not (tmp_path / "t.db").exists()


def test_the_cli_lists_what_the_tracker_offers(pool, capsys):
    assert main(["rpc-servers", "--rpc-tracker", pool]) == 0
    assert f"{KEY:<24} 2" in capsys.readouterr().out


@pytest.mark.parametrize(("option", "flushes"), [([], True), (["--cache-flush"], True), (["--no-cache-flush"], False)])
def test_tune_model_over_rpc_flushes_the_caches_unless_told_not_to(pool, option, flushes):
    args = _parser().parse_args(["tune-model", "m.onnx", "--rpc-tracker", pool, "--rpc-key", KEY, *option])
    with model_runner(args) as runner:
        assert runner.cache_flush is flushes  # the servers' caches are not known here: MODEL_CACHE_FLUSH


def test_rpc_options_go_together(capsys):
    assert main(["tune", "--trials", "1", "--rpc-key", KEY]) == 2
    assert "--rpc-tracker and --rpc-key go together" in capsys.readouterr().err


def test_wrong_crashing_and_hanging_candidates_cost_only_themselves(tmp_path):
    from test_measure import CANDIDATES, TARGET, matmul

    from probtune.measure import LocalBuilder, prepare_reference
    from probtune.workloads.workload import Workload

    names = ["good", "wrong", "segfaults", "hangs", "good"]
    reference = prepare_reference(Workload.from_module(matmul(), name="matmul"), tmp_path, seed=0)
    with LocalBuilder(workers=2) as builder:
        built = dict(builder.build([CANDIDATES[name]() for name in names], TARGET, tmp_path))
    # three servers: the crash and the hang each take one session down at most, the third finishes the batch
    with rpc_pool(3) as (address, _), probtune.RPCRunner(address, KEY, repeat=1, min_repeat_ms=1.0, timeout=5.0) as runner:
        results = dict(runner.run(reference, [built[i] for i in range(len(names))], TARGET))
        statuses = {name: results[i].status for i, name in enumerate(names)}
        assert statuses == {"good": "ok", "wrong": "wrong_result", "segfaults": "device_lost", "hangs": "timeout"}
        assert "no answer from RPC session" in results[3].error
        assert results[0].status == results[4].status == "ok"  # the rest went on, on the session still answering


def test_a_model_tuned_over_rpc_is_compiled_checked_and_timed_on_a_server(small_cnn_onnx, tmp_path):
    from probtune.model import tune_model
    from probtune.model.remote import RemoteModel

    with rpc_pool(2) as (address, _), probtune.RPCRunner(address, KEY, **FAST) as runner:
        result = tune_model(small_cnn_onnx, trials=8, input_shapes={"x": (1, 3, 16, 16)}, database=tmp_path / "t.db",
                            runner=runner, batch_size=4, confirm=0)
        remote = result.compile(on=runner)
        assert isinstance(remote, RemoteModel) and remote.check is not None  # outputs checked against onnxruntime
        assert remote.check.reference == "onnxruntime"
        assert all(seconds > 0 for seconds in remote.time(result.model.random_inputs(1), repeat=2, min_repeat_ms=10))
        with pytest.raises(ValueError, match=r"input 'x' must be float32\[1, 3, 16, 16\], got float64"):
            remote(result.model.random_inputs(1)[0].astype("float64"))  # checked here, as a local model checks it
    with Database(tmp_path / "t.db") as db:
        assert {m.key.text for m in db.measurements()} == {f"host@rpc:{KEY}"}  # the runner's own setting: warm
