"""The probtune-xgb plugin: program features, and the ``xgb`` and ``random`` cost models."""

from __future__ import annotations

import io
import subprocess
import sys
import time

import numpy as np
import pytest
import tvm
from tvm import s_tir, te
from tvm.script import tirx as T

import probtune.plugins
from conftest import categorical_sites
from probtune import Rng, hookimpl
from probtune.interfaces import CostModel
from probtune.plugin import iter_stmts
from probtune.plugins import get_registry, load_registry
from probtune.space.space_generator import generate_space
from probtune.workloads.catalog import resolve_workload
from probtune_cuda.features import GPU_FEATURE_NAMES
from probtune_xgb import RandomCostModel, XGBCostModel
from probtune_xgb.features import AUTO_UNROLL_KEY, STORE_FEATURE_NAMES, ProgramFeatures, store_features

program_features = ProgramFeatures.registered()  # the xgb model's: the registered extractors' columns (gpu.*) last
PROGRAM_FEATURE_NAMES = program_features.names

COLUMN = {name: i for i, name in enumerate(STORE_FEATURE_NAMES)}


def _log(x: float) -> float:
    return float(np.log2(1.0 + x))


def _candidates(host, name: str, shape, count: int) -> list:
    """``count`` distinct finished programs of a catalog workload."""
    workload = resolve_workload(name, shape, "float32", get_registry().workloads)
    space = generate_space(workload, host)
    found: dict[int, object] = {}
    seed = 0
    while len(found) < count and seed < 20 * count:
        seed += 1
        candidate = space.sample(Rng(seed))
        if candidate is not None:
            found.setdefault(candidate.program_hash, candidate)
    assert len(found) == count, f"only {len(found)} valid samples of {name}"
    return list(found.values())


@pytest.fixture(scope="module")
def matmul_programs(host) -> list[tvm.IRModule]:
    return [c.mod for c in _candidates(host, "matmul", (1024, 1024, 1024), 8)]


@pytest.fixture(scope="module")
def conv_programs(host) -> list[tvm.IRModule]:
    return [c.mod for c in _candidates(host, "conv2d_nchw", None, 8)]


def _gpu_columns(vector: np.ndarray) -> dict[str, float]:
    """The ``gpu.*`` columns of a program vector, as raw quantities."""
    start = PROGRAM_FEATURE_NAMES.index(f"gpu.{GPU_FEATURE_NAMES[0]}")
    return {name: float(2.0 ** vector[start + i] - 1.0) for i, name in enumerate(GPU_FEATURE_NAMES)}


def test_gpu_columns_describe_threads_shared_memory_and_tensor_core_calls(matmul_programs):
    """CPU programs leave them zero; a tensor-core program's multiply-accumulates are counted, though not stores."""
    assert all(not any(_gpu_columns(program_features(mod)).values()) for mod in matmul_programs)
    sm90 = get_registry().targets["cuda-sm90"]
    found, found_scripts = {}, {}
    for name, dtype in (("matmul", "float16"), ("matmul", "float32")):
        space = generate_space(resolve_workload(name, (256, 256, 256), dtype), sm90, seed=0)
        candidate = next(c for c in (space.sample(Rng(seed)) for seed in range(1, 40)) if c is not None)
        found[dtype] = _gpu_columns(program_features(candidate.mod))
        found_scripts[dtype] = candidate.mod.script()  # an mma.sync program stores its fragments with plain stores
    half, single = found["float16"], found["float32"]
    assert half["blocks"] >= 1 and half["threads"] >= 32 and half["shared_bytes"] > 0 and half["fragment_bytes"] > 0
    tiles = (256 // 16) ** 3  # 16x16x16 multiply-accumulates of a 256^3 matmul, each one call of one warp
    assert half["mma_calls"] * half["threads"] / 32 * half["blocks"] == pytest.approx(tiles)
    assert half["fragment_loads"] > 0 and (half["fragment_stores"] > 0 or "ldmatrix" in found_scripts["float16"])
    assert single["threads"] > 1 and single["local_bytes"] > 0 and single["mma_calls"] == single["fragment_bytes"] == 0


def test_gpu_columns_count_mma_sync_tiles_as_wmma_tiles():
    """A program moved to ldmatrix and mma.sync (two PTX mma per 16x16x16 tile) does the same tiles as with WMMA."""
    space = generate_space(resolve_workload("matmul", (256, 256, 256), "float16"), get_registry().targets["cuda-sm90"])
    instruction = categorical_sites(space.trace, (0, 1))[0]
    candidate = next(c for c in (space.sample(Rng(seed)) for seed in range(1, 40)) if c is not None)
    for choice in (0, 1):  # WMMA, mma.sync
        sch, rejected = space.realize(candidate.trace.with_decisions({**candidate.trace.decisions, instruction: choice}))
        assert rejected is None and ('scope="warp"' in sch.mod.script()) == (choice == 1)
        columns = _gpu_columns(program_features(sch.mod))
        assert columns["mma_calls"] * columns["threads"] / 32 * columns["blocks"] == pytest.approx((256 // 16) ** 3)
        assert columns["fragment_loads"] > 0 and columns["fragment_bytes"] > 0


def test_gpu_columns_tell_how_deep_a_reduction_is_pipelined():
    """0 stages and no async copies unpipelined; 2 stages register-staged; 3 stages with cp.async."""
    space = generate_space(resolve_workload("matmul", (512, 512, 512), "float16"), get_registry().targets["cuda-sm90"])
    seen: dict[tuple[float, float], str] = {}
    rng = Rng(2)
    for _ in range(60):
        candidate = space.sample(rng)
        if candidate is not None:
            columns = _gpu_columns(program_features(candidate.mod))
            script = candidate.mod.script()
            kind = "async" if "software_pipeline_async" in script else "staged" if "local_stage" in script else "none"
            seen.setdefault((columns["pipeline_stages"], columns["async_copies"]), kind)
    assert seen == {(0.0, 0.0): "none", (2.0, 0.0): "staged", (3.0, 1.0): "async"}


def _elementwise(read=lambda a, i, j: a[i, j], n: int = 64) -> tvm.IRModule:
    a = te.placeholder((n, n), name="A")
    b = te.compute((n, n), lambda i, j: read(a, i, j) * 2.0, name="B")
    return tvm.IRModule({"main": te.create_prim_func([a, b])})


def _row(mod: tvm.IRModule, name: str) -> float:
    rows = store_features(mod)
    assert rows.shape == (1, len(STORE_FEATURE_NAMES))
    return float(rows[0, COLUMN[name]])


# ---- features ---------------------------------------------------------------


def test_program_features_are_fixed_length_finite_and_deterministic(matmul_programs, conv_programs):
    vectors = [program_features(mod) for mod in matmul_programs + conv_programs]
    for mod, vector in zip(matmul_programs + conv_programs, vectors):
        assert vector.shape == (len(PROGRAM_FEATURE_NAMES),) and vector.dtype == np.float32
        assert np.isfinite(vector).all() and (vector >= 0).all()
        assert np.array_equal(vector, program_features(mod))
    assert len({v.tobytes() for v in vectors}) == len(vectors)  # distinct programs, distinct features
    assert len(set(PROGRAM_FEATURE_NAMES)) == len(PROGRAM_FEATURE_NAMES)


@pytest.mark.parametrize("name", ["batch_matmul", "dense_bias_relu", "conv2d_nhwc", "depthwise_conv2d_nchw", "softmax", "layer_norm"])
def test_features_of_catalog_workloads(host, name):
    spec = get_registry().workloads[name]
    workload = spec.instantiate(spec.small_shape)
    programs = [workload.mod] + [c.mod for c in _candidates(host, name, spec.small_shape, 2)]
    for mod in programs:
        rows = store_features(mod)
        assert rows.shape[0] >= 1 and rows.shape[1] == len(STORE_FEATURE_NAMES)
        assert np.isfinite(rows).all()
        assert np.isfinite(program_features(mod)).all()


def test_a_realistic_matmul_is_described(matmul_programs):
    rows = store_features(matmul_programs[0])  # init, update, write-back of the cache-write stage
    update = rows[np.argmax(rows[:, COLUMN["total.float_mul"]])]
    assert update[COLUMN["ops.float_add"]] == update[COLUMN["ops.float_mul"]] == _log(1)
    assert update[COLUMN["total.float_mul"]] == pytest.approx(_log(1024**3), abs=1e-3)
    assert update[COLUMN["is_reduction"]] == update[COLUMN["accumulates"]] == 1
    assert update[COLUMN["writes_intermediate"]] == 1
    assert update[COLUMN["parallel.count"]] >= _log(1)
    assert rows[:, COLUMN["is_constant"]].max() == 1  # the decomposed init
    assert rows[:, COLUMN["is_copy"]].max() == 1  # the cache write-back


def test_vectorized_and_scalar_programs_differ():
    def split_inner(vectorize: bool) -> tvm.IRModule:
        sch = s_tir.Schedule(_elementwise())
        _, j = sch.get_loops(sch.get_sblock("B"))
        _, inner = sch.split(j, [None, 16])
        if vectorize:
            sch.vectorize(inner)
        return sch.mod

    vector, scalar = split_inner(True), split_inner(False)
    assert _row(vector, "vectorized.count") == _log(1) and _row(scalar, "vectorized.count") == 0
    assert _row(vector, "vectorized.innermost_extent") == pytest.approx(_log(16))
    assert _row(vector, "vectorized.is_innermost") == 1 and _row(scalar, "vectorized.is_innermost") == 0
    assert not np.array_equal(program_features(vector), program_features(scalar))


def test_strides_of_contiguous_strided_and_reused_reads():
    contiguous = _elementwise(lambda a, i, j: a[i, j])
    strided = _elementwise(lambda a, i, j: a[j, i])
    reused = _elementwise(lambda a, i, j: a[i, 0])
    assert _row(contiguous, "write.stride") == _log(1)
    assert _row(contiguous, "read0.stride") == _log(1)
    assert _row(strided, "read0.stride") == pytest.approx(_log(64))
    assert _row(reused, "read0.stride") == 0
    assert _row(reused, "read0.nonzero_stride") == pytest.approx(_log(64))
    assert _row(reused, "read0.reuse_iterations") == pytest.approx(_log(64))
    assert _row(reused, "reads.reuse") == _log(1) and _row(strided, "reads.strided") == _log(1)
    # The innermost loop touches 64 floats either way: 4 cache lines in a row, 64 lines down a column.
    assert _row(contiguous, "read0.inner1.bytes") == _row(strided, "read0.inner1.bytes") == pytest.approx(_log(256))
    assert _row(contiguous, "read0.inner1.lines") == pytest.approx(_log(4 * 64))
    assert _row(strided, "read0.inner1.lines") == pytest.approx(_log(64 * 64))
    assert _row(reused, "read0.inner1.reuse") == pytest.approx(_log(64))
    assert _row(contiguous, "working_set.nest.bytes") == pytest.approx(_log(2 * 64 * 64 * 4))


def test_auto_unroll_annotation_is_read():
    sch = s_tir.Schedule(_elementwise())
    i, _ = sch.get_loops(sch.get_sblock("B"))
    sch.annotate(i, AUTO_UNROLL_KEY, 64)
    assert _row(sch.mod, "auto_unroll.max_step") == pytest.approx(_log(64))
    assert _row(sch.mod, "auto_unroll.copies") == pytest.approx(_log(64))  # the inner loop fits, the pair does not
    assert _row(_elementwise(), "auto_unroll.max_step") == 0


@T.prim_func(s_tir=True)
def _scalar(A: T.Buffer((), "float32"), B: T.Buffer((), "float32")):
    with T.sblock("B"):
        T.reads(A[()])
        T.writes(B[()])
        B[()] = A[()] + T.float32(1)


@T.prim_func(s_tir=True)
def _branches(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
    for i in range(16):
        with T.sblock("B"):
            vi = T.axis.spatial(16, i)
            if vi % 2 == 0:
                B[vi] = T.exp(A[vi]) / T.max(A[vi], T.float32(1))
            else:
                B[vi] = T.Select(A[vi] > T.float32(0), A[vi], T.float32(0))


def test_programs_without_loops_or_with_branches():
    scalar = store_features(tvm.IRModule({"main": _scalar}))
    assert scalar.shape == (1, len(STORE_FEATURE_NAMES)) and np.isfinite(scalar).all()
    assert scalar[0, COLUMN["loops"]] == 0 and scalar[0, COLUMN["ops.float_add"]] == _log(1)
    branches = store_features(tvm.IRModule({"main": _branches}))  # one row per store, both arms
    assert branches.shape == (2, len(STORE_FEATURE_NAMES))
    then, other = branches
    assert then[COLUMN["ops.float_math"]] == then[COLUMN["ops.float_div"]] == then[COLUMN["ops.float_cmp"]] == _log(1)
    assert other[COLUMN["ops.select"]] == other[COLUMN["ops.float_cmp"]] == _log(1)
    assert other[COLUMN["total.select"]] == pytest.approx(_log(16))
    assert np.isfinite(program_features(_branches)).all()


def test_featurize_speed(matmul_programs, conv_programs, record_property):
    """Measured and reported, not asserted: the machine may be busy."""
    for name, programs in (("matmul_1024", matmul_programs), ("conv2d_nchw", conv_programs)):
        started = time.perf_counter()
        for mod in programs:
            program_features(mod)
        ms = (time.perf_counter() - started) / len(programs) * 1e3
        record_property(f"featurize_ms_{name}", round(ms, 2))
        print(f"featurize {name}: {ms:.2f} ms/program")


# ---- models -----------------------------------------------------------------


def _synthetic(rng: np.random.Generator, n: int, scale: float = 1.0, width: int = 12):
    """Features in [0, 1); the latency grows with columns 0 and 1, the others are noise."""
    features = rng.random((n, width)).astype(np.float32)
    latency = scale * np.exp(2.0 * features[:, 0] + features[:, 1]) * (1.0 + 0.02 * rng.random(n))
    return features, latency


def _pairwise_accuracy(scores: np.ndarray, latencies: np.ndarray) -> float:
    i, j = np.triu_indices(len(latencies), 1)
    return float(np.mean((scores[i] > scores[j]) == (latencies[i] < latencies[j])))


def test_untrained_model_gives_seeded_scores():
    features = [np.zeros(5, dtype=np.float32)] * 7
    first, second = XGBCostModel(seed=3), XGBCostModel(seed=3)
    scores = first.predict(features)
    assert scores.shape == (7,) and np.isfinite(scores).all()
    assert np.array_equal(scores, second.predict(features))
    assert not np.array_equal(scores, XGBCostModel(seed=4).predict(features))
    assert first.num_samples == 0 and first.predict([]).shape == (0,)
    first.update(features[:2], [1e-3, 1e-3], ["w", "w"])  # one distinct latency: nothing to rank by yet
    assert first.num_samples == 2 and np.isfinite(first.predict(features)).all()


def test_making_a_model_starts_importing_xgboost_on_a_thread():
    """In a fresh interpreter, where nothing imported xgboost yet; the model then trains as usual."""
    check = """
import sys
import numpy as np
from probtune_xgb import model
assert "xgboost" not in sys.modules
xgb = model.XGBCostModel()
assert model._importing is not None and model._importing.name == "probtune-xgb import"
model._importing.join()
assert "xgboost" in sys.modules
xgb.update([np.array([1.0, 0.0]), np.array([0.0, 1.0])], [1e-3, 2e-3], ["w", "w"])
assert xgb.predict([np.array([1.0, 0.0])]).shape == (1,)
"""
    subprocess.run([sys.executable, "-c", check], check=True, timeout=120)


def test_model_learns_a_synthetic_relationship():
    rng = np.random.default_rng(0)
    features, latency = _synthetic(rng, 240)
    model = XGBCostModel(seed=0)
    model.update(list(features[:160]), list(latency[:160]), ["w"] * 160)
    assert model.num_samples == 160
    held_out = model.predict(list(features[160:]))
    assert _pairwise_accuracy(held_out, latency[160:]) > 0.75


def test_training_threads_do_not_change_the_trees():
    """The search's determinism rests on this: two threads train the same model as one."""
    features, latency = _synthetic(np.random.default_rng(5), 200, width=40)
    predictions = []
    for threads in (1, 2):
        model = XGBCostModel(seed=0, nthread=threads)
        model.update(list(features[:160]), list(latency[:160]), ["w"] * 160)
        predictions.append(model.predict(list(features[160:])))
    assert np.array_equal(predictions[0], predictions[1])


def test_groups_with_different_latency_scales_rank_within_each():
    rng = np.random.default_rng(1)
    fast, fast_latency = _synthetic(rng, 200, scale=1e-5)
    slow, slow_latency = _synthetic(rng, 200, scale=1.0)
    slow[:, 5] = fast[:, 5] = 0.5  # nothing tells the groups apart: only within-group order can be learned
    model = XGBCostModel(seed=0)
    model.update(
        list(fast[:120]) + list(slow[:120]),
        list(fast_latency[:120]) + list(slow_latency[:120]),
        ["fast"] * 120 + ["slow"] * 120,
    )
    assert _pairwise_accuracy(model.predict(list(fast[120:])), fast_latency[120:]) > 0.75
    assert _pairwise_accuracy(model.predict(list(slow[120:])), slow_latency[120:]) > 0.75


def test_failed_samples_are_kept_and_rank_low():
    rng = np.random.default_rng(2)
    features, latency = _synthetic(rng, 120)
    failed = features[:, 3] > 0.8  # these fail whatever their other features say
    model = XGBCostModel(seed=0)
    model.update(list(features), [None if f else float(t) for f, t in zip(failed, latency)], ["w"] * 120)
    assert model.num_samples == 120
    working = features[~failed]
    failing = working.copy()
    failing[:, 3] = 0.9
    assert np.mean(model.predict(list(failing)) < model.predict(list(working))) > 0.8


def test_update_checks_its_arguments():
    model = XGBCostModel(seed=0)
    with pytest.raises(ValueError, match="one latency and one group"):
        model.update([np.zeros(3)], [1.0, 2.0], ["w"])
    model.update([np.zeros(3), np.ones(3)], [1.0, 2.0], ["w", "w"])
    with pytest.raises(ValueError, match="columns"):
        model.update([np.zeros(4)], [1.0], ["w"])
    with pytest.raises(ValueError, match="columns"):
        model.predict([np.zeros(4)])


def test_save_load_round_trip():
    rng = np.random.default_rng(3)
    features, latency = _synthetic(rng, 60)
    model = XGBCostModel(seed=5)
    model.update(list(features[:40]), list(latency[:40]), ["a"] * 20 + ["b"] * 20)
    restored = XGBCostModel(seed=5)
    restored.load(model.save())
    assert restored.num_samples == 40
    assert np.array_equal(restored.predict(list(features[40:])), model.predict(list(features[40:])))
    model.update(list(features[40:]), list(latency[40:]), ["a"] * 20)  # continues where it stopped
    restored.update(list(features[40:]), list(latency[40:]), ["a"] * 20)
    assert np.array_equal(restored.predict(list(features)), model.predict(list(features)))

    untrained = XGBCostModel(seed=9)
    untrained.predict([np.zeros(3)])
    copy = XGBCostModel(seed=9)
    copy.load(untrained.save())
    assert np.array_equal(copy.predict([np.zeros(3)] * 4), untrained.predict([np.zeros(3)] * 4))


def _archive(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def test_malformed_state_is_a_value_error():
    rng = np.random.default_rng(4)
    features, latency = _synthetic(rng, 20)
    model = XGBCostModel(seed=0)
    model.update(list(features), list(latency), ["w"] * 20)
    good = model.save()
    with np.load(io.BytesIO(good)) as archive:
        fields = {key: archive[key] for key in archive.files}
    bad_states = [
        b"",
        b"not a model",
        good[: len(good) // 2],
        RandomCostModel().save(),
        _archive(**{**fields, "format": np.array(99)}),
        _archive(**{**fields, "feature_layout": np.array(12345)}),
        _archive(**{key: value for key, value in fields.items() if key != "booster"}),
        _archive(**{**fields, "groups": fields["groups"][:-1]}),
        _archive(**{**fields, "booster": np.frombuffer(b"{broken", dtype=np.uint8)}),
        _archive(**{**fields, "latencies": np.array(["x"] * 20)}),
    ]
    for state in bad_states:
        with pytest.raises(ValueError):
            XGBCostModel().load(state)
    for state in (b"", b"{}", b"\xff", good, b'{"model": "random", "format": 1}'):
        with pytest.raises(ValueError):
            RandomCostModel().load(state)


def test_random_model_is_seeded_and_saves_its_stream():
    features = RandomCostModel().featurize([tvm.IRModule()] * 3)
    assert len(features) == 3 and all(f.size == 0 for f in features)
    first, second = RandomCostModel(seed=7), RandomCostModel(seed=7)
    assert np.array_equal(first.predict(features), second.predict(features))
    assert not np.array_equal(RandomCostModel(seed=8).predict(features), RandomCostModel(seed=7).predict(features))
    first.update(features, [1.0, None, 2.0], ["w"] * 3)
    assert first.num_samples == 3
    restored = RandomCostModel(seed=7)
    restored.load(first.save())
    assert restored.num_samples == 3
    assert np.array_equal(restored.predict(features), first.predict(features))


def test_plugin_registers_both_models():
    registry = get_registry()
    assert registry.plugins["xgb"].distribution == "probtune-xgb"
    models = registry.cost_models
    assert models["xgb"] is XGBCostModel and models["random"] is RandomCostModel
    for name, factory in models.items():
        if name in ("xgb", "random"):
            model = factory(seed=1)
            assert isinstance(model, CostModel) and model.name == name


def test_model_fits_real_timings(host):
    """End to end on measured programs: featurize, train, predict. Held-out ranking from a dozen
    timings is close to chance on this noisy shared machine, so the check is that the model fits
    what it was shown."""
    candidates = _candidates(host, "matmul", (128, 128, 128), 12)
    workload = resolve_workload("matmul", (128, 128, 128), "float32", get_registry().workloads)
    target = tvm.target.Target(host.tvm_target)
    device = tvm.cpu()
    tensors = [tvm.runtime.tensor(a, device) for a in workload.random_inputs(0)]
    tensors += [tvm.runtime.tensor(np.zeros(s, d), device) for s, d in workload.param_specs()[workload.num_inputs :]]
    latencies = []
    for candidate in candidates:
        lib = tvm.compile(candidate.mod, target=target)
        timer = lib.mod.time_evaluator("main", device, number=3, repeat=3)
        latencies.append(float(np.median(timer(*tensors).results)))
    model = XGBCostModel(seed=0)
    features = model.featurize([c.mod for c in candidates])
    model.update(features, latencies, [workload.key] * len(candidates))
    assert _pairwise_accuracy(model.predict(features), np.array(latencies)) > 0.8


# ---- feature extractors registered by plugins -----------------------------------


class _Loops:
    """An extractor of a plugin's own: how many loops a program has, and a constant."""

    name = "aaa-loops"
    columns = ("loops", "seven")

    def extract(self, func) -> np.ndarray:
        return np.array([sum(isinstance(stmt, tvm.tirx.For) for stmt in iter_stmts(func.body)), 7.0])


class _Broken:
    name = "broken"
    columns = ("one",)

    def extract(self, func) -> np.ndarray:
        return np.array([1.0, 2.0])


class _ExtractorPlugin:
    __name__ = "extractors"

    @hookimpl
    def probtune_register_feature_extractors(self, register):
        register(_Loops())


def test_a_plugins_feature_extractor_adds_its_columns_and_a_layout_of_its_own(monkeypatch, matmul_programs):
    """The model asks the registry: the columns of every extractor, ordered by name, as log2(1 + x)."""
    base = XGBCostModel(seed=0)
    monkeypatch.setattr(probtune.plugins, "_registry", load_registry(extra_plugins=[_ExtractorPlugin()]))
    model = XGBCostModel(seed=0)
    names = model.program_features.names
    assert names[:292] == base.program_features.names[:292]
    extractors = base.program_features.names[292:]  # the installed plugins' columns, gpu.* and x86.*
    assert names[292:] == ("aaa-loops.loops", "aaa-loops.seven", *extractors)
    assert extractors[: len(GPU_FEATURE_NAMES)] == tuple(f"gpu.{n}" for n in GPU_FEATURE_NAMES)
    vector = model.featurize(matmul_programs[:1])[0]
    assert vector.shape == (len(names),) and vector[293] == np.float32(np.log2(8.0)) and vector[292] > 0
    assert np.array_equal(np.delete(vector, [292, 293]), base.featurize(matmul_programs[:1])[0])
    rng = np.random.default_rng(0)
    base.update([rng.random(len(base.program_features.names)) for _ in range(4)], [1e-3, 2e-3, 3e-3, None], ["w"] * 4)
    with pytest.raises(ValueError, match="another feature layout"):  # samples of other columns are not mixed in
        model.load(base.save())


def test_an_extractor_that_gives_other_columns_than_it_names_is_refused(matmul_programs):
    with pytest.raises(ValueError, match="'broken' gave"):
        ProgramFeatures((_Broken(),))(matmul_programs[0])
