"""Importing models: ONNX files with their shape computations folded, Relax modules, and every bad input named."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from probtune.errors import ModelImportError
from probtune.model import load_model
from probtune.model.examples import IR_VERSION, OPSET, make_model


def _write(tmp_path, nodes, inputs, outputs, name="m.onnx", initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    path = tmp_path / name
    onnx.save(model, path)
    return path


def _relu_model(tmp_path, shape):
    return _write(
        tmp_path, [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )


def test_a_runtime_shape_computation_is_folded_with_the_input_shape_given(small_cnn_onnx):
    with pytest.raises(Exception, match="Reshape requires the input new shape"):  # what the frontend alone says
        from tvm.relax.frontend.onnx import from_onnx

        from_onnx(onnx.load(small_cnn_onnx), shape_dict={"x": [1, 3, 16, 16]}, keep_params_in_input=False)
    model = load_model(small_cnn_onnx, {"x": (1, 3, 16, 16)})
    assert [(s.name, s.shape, s.dtype) for s in model.inputs] == [("x", (1, 3, 16, 16), "float32")]
    assert isinstance(model.mod["main"], relax.Function) and model.onnx_model is not None
    assert model.name == "small_cnn"


def test_a_dynamic_input_without_a_shape_is_named(small_cnn_onnx):
    with pytest.raises(ModelImportError, match=r"input 'x' has a dynamic shape \(\?,3,16,16\); give it"):
        load_model(small_cnn_onnx)


def test_an_input_shape_of_the_wrong_rank_is_named(small_cnn_onnx):
    with pytest.raises(ModelImportError, match=r"input 'x' has rank 4 in the model, but the given shape \(3, 16, 16\) has rank 3"):
        load_model(small_cnn_onnx, {"x": "3,16,16"})


def test_a_shape_that_contradicts_a_fixed_dimension_is_named(small_cnn_onnx):
    with pytest.raises(ModelImportError, match=r"input 'x' is fixed at \[None, 3, 16, 16\]"):
        load_model(small_cnn_onnx, {"x": (1, 4, 16, 16)})


def test_an_unknown_input_name_is_named(small_cnn_onnx):
    with pytest.raises(ModelImportError, match=r"input_shapes names \['image'\], but the model's inputs are \['x'\]"):
        load_model(small_cnn_onnx, {"image": (1, 3, 16, 16)})


def test_not_a_file_and_not_onnx(tmp_path):
    with pytest.raises(ModelImportError, match="no such file"):
        load_model(tmp_path / "missing.onnx")
    with pytest.raises(ModelImportError, match="no such file"):
        load_model(tmp_path)  # a folder
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\x01 this is not a protobuf \xff\xfe" * 10)
    with pytest.raises(ModelImportError, match="not an ONNX model"):
        load_model(junk)


def test_an_unsupported_operator_is_named_with_its_node(tmp_path):
    path = _write(
        tmp_path, [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Frobnicate", ["r"], ["y"], name="frob_1", domain="acme")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
    )
    with pytest.raises(ModelImportError, match=r"operator Frobnicate \(domain 'acme'\) at node 'frob_1' is not supported"):
        load_model(path)


def test_a_fixed_shape_model_needs_no_shapes(tmp_path):
    model = load_model(_relu_model(tmp_path, [2, 8]))
    assert model.inputs[0].shape == (2, 8) and model.name == "m"


def test_a_relax_module_is_taken_as_it_is():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(x))
        bb.emit_func_output(out)
    model = load_model(bb.get())
    assert [(s.name, s.shape) for s in model.inputs] == [("x", (4, 8))] and model.onnx_model is None
    with pytest.raises(ModelImportError, match="input_shapes apply to ONNX files"):
        load_model(bb.get(), {"x": (4, 8)})


def test_a_relax_module_without_main_or_with_a_dynamic_input():
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 8), "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(x)
    with pytest.raises(ModelImportError, match="input 'x' of 'main' has the dynamic shape"):
        load_model(bb.get())
    with pytest.raises(ModelImportError, match="must have a Relax function 'main'"):
        load_model(tvm.IRModule({}))


def test_random_inputs_depend_on_the_seed_only(small_cnn_onnx):
    model = load_model(small_cnn_onnx, {"x": "1,3,16,16"})
    a, b = model.random_inputs(3), model.random_inputs(3)
    assert np.array_equal(a[0], b[0]) and a[0].dtype == np.float32


def test_a_plugin_converts_an_operator_tvms_frontend_lacks(tmp_path, monkeypatch):
    import probtune.plugins
    from probtune import hookimpl
    from probtune.plugins import load_registry

    class Acme:
        @hookimpl
        def probtune_register_onnx_converters(self, register):
            register("Frobnicate", lambda bb, inputs, attrs, opset: relax.op.multiply(inputs[0], relax.const(2.0)))

    monkeypatch.setattr(probtune.plugins, "_registry", load_registry(extra_plugins=[Acme()]))
    path = _write(
        tmp_path, [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Frobnicate", ["r"], ["y"], domain="acme")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
    )
    model = load_model(path)
    vm = relax.VirtualMachine(tvm.compile(model.mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    x = np.array([[-1.0, 2.0], [3.0, -4.0]], np.float32)
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), np.maximum(x, 0) * 2)


def _recurrent_model(tmp_path, op, gates, steps=6, hidden=8, features=5, peepholes=False, linear_before_reset=1,
                     direction="forward"):
    rng = np.random.default_rng(0)
    d = 2 if direction == "bidirectional" else 1
    shapes = {"W": (d, gates * hidden, features), "R": (d, gates * hidden, hidden), "B": (d, 2 * gates * hidden),
              "h0": (d, 2, hidden), **({"c0": (d, 2, hidden), "P": (d, 3 * hidden)} if peepholes else {})}
    weights = [onnx.numpy_helper.from_array((rng.standard_normal(shape) * 0.5).astype(np.float32), name)
               for name, shape in shapes.items()]
    finals = ["y_h", "y_c"] if op == "LSTM" else ["y_h"]
    node = helper.make_node(op, ["x", "W", "R", "B", "", "h0", *(["c0", "P"] if peepholes else [])], ["y", *finals],
                            hidden_size=hidden, direction=direction,
                            **({"linear_before_reset": linear_before_reset} if op == "GRU" else {}))
    return _write(tmp_path, [node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 2, features])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [steps, d, 2, hidden]),
                   *(helper.make_tensor_value_info(name, TensorProto.FLOAT, [d, 2, hidden]) for name in finals)],
                  initializers=weights)


def _fused_calls(path):
    from probtune.model.tasks import fuse
    from probtune.targets import resolve_target

    main = fuse(load_model(path), resolve_target("host"))["main"]
    values = [binding.value for block in main.body.blocks for binding in block.bindings]
    return [call for call in values if isinstance(call, relax.Call) and call.op.name == "relax.call_tir"]


_CELLS = [("LSTM", 4, False, "forward"), ("LSTM", 4, True, "bidirectional"), ("GRU", 3, False, "forward"),
          ("GRU", 3, False, "bidirectional"), ("RNN", 1, False, "reverse"), ("RNN", 1, False, "bidirectional")]
"""Each cell and direction over 7 steps (runs of 4 and 3); the runs' count does not depend on the cell, so 1 step
(one run) and 9 (three runs of 3) are checked on the cheapest cell, in both directions that reorder steps."""


@pytest.mark.parametrize("op, gates, peepholes, direction, steps",
                         [(*cell, 7) for cell in _CELLS] + [(*cell, steps) for cell in _CELLS[4:] for steps in (1, 9)])
def test_a_run_of_recurrent_steps_is_one_call(tmp_path, op, gates, peepholes, direction, steps):
    """An unrolled step costs the VM's cost per call: a run of up to STEPS_PER_KERNEL steps is one call, each
    step's recurrent product and the gates that read their columns of it (a GRU with ``linear_before_reset``, as
    PyTorch exports it), with no slice or split of its own, both directions of a bidirectional layer in the same
    call; and it still computes what onnxruntime does (Y and the final states; peepholes too, runs of unequal
    length too)."""
    from probtune.model import tune_model
    from probtune.model.recurrent_cells import STEPS_PER_KERNEL

    path = _recurrent_model(tmp_path, op, gates, steps=steps, peepholes=peepholes, direction=direction)
    directions = 2 if direction == "bidirectional" else 1
    runs = [call for call in _fused_calls(path) if "_steps" in call.args[0].name_hint]
    assert len(runs) == -(-steps // STEPS_PER_KERNEL)
    # and a product of the input projections per direction, their split into runs, Y's concatenation of the runs,
    # the final states taken from the last run and, for a backward direction, the flip that puts its states in order
    finals = 2 if op == "LSTM" else 1
    assert len(_fused_calls(path)) <= len(runs) + directions + 2 + finals + (direction != "forward")
    compiled = tune_model(path, trials=0, database=tmp_path / "t.db").compile()
    assert compiled.check.reference == "onnxruntime"


@pytest.mark.parametrize("op, gates, linear_before_reset", [("LSTM", 4, 1), ("GRU", 3, 1), ("GRU", 3, 0), ("RNN", 1, 1)])
def test_a_recurrent_layers_weights_are_prepared_at_compile_time(tmp_path, op, gates, linear_before_reset):
    """What the converters compute from the weights alone (slices, concatenations, transposes) is folded into
    constants, not computed at every inference."""
    calls = _fused_calls(_recurrent_model(tmp_path, op, gates, linear_before_reset=linear_before_reset))
    assert all(any(not isinstance(arg, tvm.ir.expr.Constant) for arg in call.args[1].fields) for call in calls)


@pytest.mark.parametrize("linear_before_reset, direction", [(1, "forward"), (1, "bidirectional"), (0, "bidirectional")])
def test_a_gru_is_converted_as_onnxruntime_computes_it(tmp_path, linear_before_reset, direction):
    """TVM 0.27's frontend has no GRU (nor LSTM): probtune converts them, unrolled over the sequence."""
    from probtune.model import tune_model

    rng = np.random.default_rng(0)
    directions, hidden, features = (2 if direction == "bidirectional" else 1), 5, 3
    weights = [onnx.numpy_helper.from_array((rng.standard_normal(shape) * 0.5).astype(np.float32), name)
               for name, shape in (("W", (directions, 3 * hidden, features)), ("R", (directions, 3 * hidden, hidden)),
                                   ("B", (directions, 6 * hidden)), ("h0", (directions, 2, hidden)))]
    node = helper.make_node("GRU", ["x", "W", "R", "B", "", "h0"], ["y", "h"], hidden_size=hidden, direction=direction,
                            linear_before_reset=linear_before_reset)
    path = _write(tmp_path, [node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2, features])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, directions, 2, hidden]),
                   helper.make_tensor_value_info("h", TensorProto.FLOAT, [directions, 2, hidden])], initializers=weights)
    compiled = tune_model(path, trials=0, database=tmp_path / "t.db").compile()
    assert compiled.check.reference == "onnxruntime"


@pytest.mark.parametrize("op, gates, linear_before_reset", [("LSTM", 4, 1), ("GRU", 3, 1), ("GRU", 3, 0), ("RNN", 1, 1)])
def test_a_batch_first_bidirectional_layer_reads_its_initial_state_as_batch_first(tmp_path, op, gates, linear_before_reset):
    """With ``layout=1`` the initial state is (batch, directions, hidden) too. onnxruntime refuses such layers, so
    the reference is ONNX's own evaluator."""
    from onnx.reference import ReferenceEvaluator

    from probtune.model import tune_model

    rng = np.random.default_rng(0)
    hidden, features, batch, steps = 5, 3, 3, 4
    shapes = {"W": (2, gates * hidden, features), "R": (2, gates * hidden, hidden), "B": (2, 2 * gates * hidden),
              "h0": (batch, 2, hidden)}
    weights = [onnx.numpy_helper.from_array((rng.standard_normal(shape) * 0.5).astype(np.float32), name)
               for name, shape in shapes.items()]
    node = helper.make_node(op, ["x", "W", "R", "B", "", "h0"], ["y", "y_h"], hidden_size=hidden, layout=1,
                            direction="bidirectional",
                            **({"linear_before_reset": linear_before_reset} if op == "GRU" else {}))
    path = _write(tmp_path, [node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, steps, features])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, steps, 2, hidden]),
                   helper.make_tensor_value_info("y_h", TensorProto.FLOAT, [batch, 2, hidden])], initializers=weights)
    x = rng.standard_normal((batch, steps, features)).astype(np.float32)
    compiled = tune_model(path, trials=0, database=tmp_path / "t.db").compile(check=False)
    for got, expected in zip(compiled(x), ReferenceEvaluator(str(path)).run(None, {"x": x}), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_token_ids_out_of_their_table_are_refused_by_name_before_the_call(tmp_path):
    """An embedding lookup (Gather of a 10-row table by an int64 input): the import records the table's rows for
    that input, random inputs stay inside them, and the compiled model refuses an id outside [-10, 9] with an error
    naming the input, instead of reading outside the table (onnxruntime refuses it too)."""
    from probtune.model import tune_model

    table = numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "table")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
             helper.make_node("Relu", ["rows"], ["y"])]
    graph = helper.make_graph(nodes, "embedding", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4])], [table])
    path = tmp_path / "embedding.onnx"
    onnx.save(make_model(graph), path)
    model = load_model(path)
    assert [spec.table_rows for spec in model.inputs] == [10]
    compiled = tune_model(model, "host", trials=0, database=tmp_path / "t.db").compile()
    (out,) = compiled(np.array([[9, -1, 0]]))
    np.testing.assert_array_equal(out[0, :2], [[36, 37, 38, 39]] * 2)
    with pytest.raises(ValueError, match=r"input 'ids' indexes a table of 10 rows: .*\[-10, 9\], got 10 at \(0, 1\)"):
        compiled(np.array([[0, 10, 1]]))
