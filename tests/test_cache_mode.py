"""Whether a model's tasks are timed cold: by its footprint against the last-level cache, or as its records were."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

from conftest import matmul_module
from probtune.database.database import Database
from probtune.database.measure_key import MeasureKey
from probtune.defaults import MODEL_CACHE_FLUSH
from probtune.measure.runner import local_device_name
from probtune.model import cache_mode, load_model
from probtune.model.cache_mode import model_cache_flush, model_footprint
from probtune.model.tasks import extract_tasks, fuse
from probtune.targets import resolve_target

CNN_SHAPES = {"x": (1, 3, 16, 16)}


@pytest.fixture(scope="module")
def fused_cnn(small_cnn_onnx):
    spec = resolve_target("host")
    fused = fuse(load_model(small_cnn_onnx, CNN_SHAPES), spec)
    return fused, extract_tasks(fused), spec


def test_the_footprint_is_the_weights_once_and_twice_the_largest_tensor():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 16, 8), "float32"))
    weight = relax.const(np.ones((3, 3, 8, 8), "float32"))  # 2304 bytes, read by two convolutions
    bias = relax.const(np.ones((8,), "float32"))  # 32 bytes
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = relax.op.nn.conv2d(x, weight, padding=1, data_layout="NHWC", kernel_layout="HWIO")
            first = bb.emit(relax.op.add(bb.emit(conv), bias))
            second = bb.emit(relax.op.nn.conv2d(first, weight, padding=1, data_layout="NHWC", kernel_layout="HWIO"))
            pooled = bb.emit_output(relax.op.mean(second, axis=[1, 2]))
        bb.emit_func_output(pooled)
    assert model_footprint(bb.get()) == 2304 + 32 + 2 * (16 * 16 * 8 * 4)  # the largest: an 8192-byte feature map


def test_a_model_that_fits_the_last_level_cache_is_timed_warm_and_a_larger_one_cold(fused_cnn, monkeypatch):
    fused, tasks, spec = fused_cnn
    footprint = model_footprint(fused)
    monkeypatch.setattr(cache_mode, "last_level_cache_bytes", lambda: footprint)
    assert model_cache_flush(fused, tasks, spec, None, None)[0] is False
    monkeypatch.setattr(cache_mode, "last_level_cache_bytes", lambda: footprint - 1)
    cold, why = model_cache_flush(fused, tasks, spec, None, "local")
    assert cold is True and "outgrow the last-level cache" in why


def test_another_runners_machine_keeps_the_default(fused_cnn):
    fused, tasks, spec = fused_cnn
    assert model_cache_flush(fused, tasks, spec, None, "rpc")[0] is MODEL_CACHE_FLUSH


@pytest.mark.parametrize("cold", [True, False])
def test_a_database_with_the_models_records_in_one_mode_keeps_to_it(fused_cnn, tmp_path, monkeypatch, cold):
    fused, tasks, spec = fused_cnn
    monkeypatch.setattr(cache_mode, "last_level_cache_bytes", lambda: 0 if not cold else 1 << 40)  # the rule says the other
    path = tmp_path / "tuning.db"
    with Database(path) as db:
        key = db.measured_on(MeasureKey(spec.name, local_device_name(spec), cold), spec.tvm_target)
        workload = db.commit_workload(tasks[0].workload.key, tasks[0].workload.mod)
        db.add_record(workload, key, "[]", 1, "ok", [1e-3])
    assert model_cache_flush(fused, tasks, spec, path, None) == (cold, "as the database's records of the model's tasks were timed")


def test_records_of_other_workloads_or_other_devices_do_not_decide(fused_cnn, tmp_path, monkeypatch):
    fused, tasks, spec = fused_cnn
    monkeypatch.setattr(cache_mode, "last_level_cache_bytes", lambda: 1 << 40)
    path = tmp_path / "tuning.db"
    with Database(path) as db:
        other = db.measured_on(MeasureKey(spec.name, "some other machine", True), spec.tvm_target)
        db.add_record(db.commit_workload(tasks[0].workload.key, tasks[0].workload.mod), other, "[]", 1, "ok", [1e-3])
        here = db.measured_on(MeasureKey(spec.name, local_device_name(spec), True), spec.tvm_target)
        db.add_record(db.commit_workload("matmul_64", matmul_module()), here, "[]", 2, "ok", [1e-3])
    assert model_cache_flush(fused, tasks, spec, path, None)[0] is False
