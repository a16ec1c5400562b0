"""Weight repacking moved to compile time: the tuned program reads the weight packed, the model still computes the same."""

from __future__ import annotations

import tvm

from probtune import Rng
from probtune.measure.constant_layouts import layout_copies
from probtune.model import extract_tasks, fuse, load_model
from probtune.model.check import check_outputs
from probtune.model.compile import CompiledModel, compile_model, default_program
from probtune.model.prepack import prepack_weights
from probtune.search.search_strategy import RandomSearch
from probtune.space.space_generator import generate_space


def _programs_with_a_weight_copy(fused, host):
    """Default programs for every task, except a dense layer's: a sample of its space that packs its weight."""
    programs, packed = {}, None
    for task in extract_tasks(fused):
        space = generate_space(task.workload, host)
        program = default_program(space)
        if packed is None and "matmul" in task.name:
            for candidate in RandomSearch(space, Rng(1)).next_batch(24):
                copies = layout_copies(candidate.mod["main"])
                if any(copy.param == 1 for copy in copies):  # the weight, a constant in the model
                    program, packed = candidate.mod, task.name
                    break
        programs.update({name: program for name in task.functions})
    assert packed is not None, "no sample of a dense layer's space packs its weight"
    return programs, packed


def test_a_packed_weight_is_packed_once_and_the_model_matches_onnxruntime(encoder_onnx, host):
    model = load_model(encoder_onnx)
    fused = fuse(model, host)
    programs, packed = _programs_with_a_weight_copy(fused, host)
    (copy,) = [c for c in layout_copies(programs[packed]["main"]) if c.param == 1]
    assert len(copy.layout.final_indices) == 3  # panels: [j // w, k, j % w]

    executable, prepacked, _ = compile_model(fused, programs, host)
    assert prepacked >= 1
    compiled = CompiledModel(executable, model.inputs, host.num_cores)
    report = check_outputs(model, compiled)
    assert report.reference == "onnxruntime"


def test_only_the_constant_weight_changes_layout(encoder_onnx, host):
    fused = fuse(load_model(encoder_onnx), host)
    programs, packed = _programs_with_a_weight_copy(fused, host)
    before = programs[packed]["main"]
    mod, updated, count = prepack_weights(fused, {packed: programs[packed]}, tvm.target.Target(host.tvm_target))
    assert "layout_transform" not in mod["main"].script()  # folded: the packed weights are constants
    assert "layout_transform" not in fused["main"].script()  # the module given is left as it is
    after = updated[packed]["main"]
    assert count == 1 and not [c for c in layout_copies(after) if c.param == 1]
    assert list(after.params[0].shape) == list(before.params[0].shape)  # the activations, not a constant
    assert len(after.params[1].shape) == 3 and len(before.params[1].shape) == 2  # the weight, in panels
