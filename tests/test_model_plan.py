"""A compiled model as a plan of calls over planned memory: replayed call by call, it computes what the model computes."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from probtune.measure.codegen import compile_for
from probtune.model import extract_tasks, fuse, load_model
from probtune.model.compile import CompiledModel, compile_model, default_programs, place_programs
from probtune.model.plan import ModelPlan, plan_model
from probtune.space.space_generator import generate_space


def _defaults(fused, target):
    entries = [(task.functions, generate_space(task.workload, target), task.workload.mod) for task in extract_tasks(fused)]
    return default_programs(entries, 0, target)


def _replay(plan: ModelPlan, target, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The plan run call by call on this CPU: each call's tensors copied out of the planned bytes and back."""
    memory = {name: np.zeros(size, np.uint8) for name, size in plan.storages.items()}

    def view(name: str) -> np.ndarray:
        tensor = plan.tensors[name]
        raw = memory[tensor.storage][tensor.offset : tensor.offset + tensor.nbytes]
        return raw.view(tensor.dtype).reshape(tensor.shape)

    for name, array in [*plan.constants.items(), *zip(plan.inputs, inputs)]:
        view(name)[...] = array
    functions = {name: compile_for(module, target)["main"] for name, module in plan.functions.items()}
    for call in plan.calls:
        tensors = [tvm.runtime.tensor(np.ascontiguousarray(view(arg))) for arg in call.args]
        functions[call.function](*tensors)
        for arg, tensor in zip(call.args, tensors):
            view(arg)[...] = tensor.numpy()
    return [view(name).copy() for name in plan.outputs]


SHAPES = {"small_cnn_onnx": {"x": (1, 3, 16, 16)}, "encoder_onnx": None}


@pytest.mark.parametrize("onnx_fixture", sorted(SHAPES))
def test_a_plan_replayed_call_by_call_gives_the_compiled_models_outputs(onnx_fixture, host, request):
    model = load_model(request.getfixturevalue(onnx_fixture), SHAPES[onnx_fixture])
    fused = fuse(model, host)
    programs = _defaults(fused, host)
    mod, _, _ = place_programs(fused, programs, host)
    plan = plan_model(mod, host.tvm_target)
    assert plan.calls and set(plan.functions) == {call.function for call in plan.calls}
    planned = sum(size for name, size in plan.storages.items() if name not in plan.constants and name not in plan.inputs)
    private = sum(plan.tensors[arg].nbytes for call in plan.calls for arg in call.args[-1:])
    assert planned < private  # the planner reuses memory: the outputs of all calls would take more
    inputs = model.random_inputs(3)
    executable, _, _ = compile_model(fused, programs, host)
    want = CompiledModel(executable, model.inputs, host.num_cores)(*inputs)
    got = _replay(plan, host, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_the_plans_json_names_every_tensor_it_uses(small_cnn_onnx, host):
    fused = fuse(load_model(small_cnn_onnx, SHAPES["small_cnn_onnx"]), host)
    mod, _, _ = place_programs(fused, _defaults(fused, host), host)
    plan = plan_model(mod, host.tvm_target)
    text = plan.to_json()
    used = {arg for call in text["calls"] for arg in call["args"]} | set(text["inputs"]) | set(text["outputs"])
    assert used <= set(text["tensors"])
    assert {t["storage"] for t in text["tensors"].values()} <= set(text["storages"])
    assert set(text["constants"]) == set(plan.constants)
