"""Graph rewrites applied to a model before fusion: in order, counted on the fused module, errors that name them."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from probtune.errors import ModelImportError, PluginError
from probtune.model import extract_tasks, fuse
from probtune.model.importer import InputSpec, Model
from probtune.model.rewrites import rewrite_counts


def relu_model() -> Model:
    """``relu(x + 1)`` on a (4, 8) input."""
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit_output(relax.op.nn.relu(relax.op.add(x, relax.const(np.float32(1.0)))))
        builder.emit_func_output(y)
    return Model("relu", builder.get(), (InputSpec("x", (4, 8), "float32"),))


@relax.expr_functor.mutator
class _ReluAsMaximum(relax.PyExprMutator):  # type: ignore[misc]
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.count = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) != "relax.nn.relu":
            return call
        self.count += 1
        return relax.op.maximum(call.args[0], relax.const(np.float32(0.0)))


class ReluAsMaximum:
    """A rewrite as a plugin would write one: ``relu(x)`` as ``maximum(x, 0)``."""

    name = "relu-as-maximum"

    def __init__(self) -> None:
        self.seen: list[str] = []

    def rewrite(self, mod: tvm.IRModule, target) -> tuple[tvm.IRModule, int]:
        self.seen.append(target.name)
        mutator = _ReluAsMaximum(mod)
        return tvm.IRModule({mod.get_global_var("main"): mutator.visit_expr(mod["main"])}), mutator.count


def test_a_rewrite_changes_the_tasks_and_is_counted(host):
    rewrite = ReluAsMaximum()
    fused = fuse(relu_model(), host, rewrites=[rewrite, "winograd-conv2d"])  # objects and registered names
    assert rewrite.seen == [host.name]
    assert rewrite_counts(fused) == {"relu-as-maximum": 1, "winograd-conv2d": 0}
    assert [task.name for task in extract_tasks(fused)] == ["fused_add_maximum"]
    assert [task.name for task in extract_tasks(fuse(relu_model(), host, rewrites=()))] == ["fused_add_relu"]


def test_an_unknown_rewrite_is_named_with_those_registered(host):
    with pytest.raises(PluginError, match=r"unknown graph rewrite 'no-such-rewrite'; registered: .*winograd-conv2d"):
        fuse(relu_model(), host, rewrites=["no-such-rewrite"])


def test_a_rewrite_that_fails_is_named(host):
    class Broken:
        name = "broken"

        def rewrite(self, mod, target):
            raise RuntimeError("cannot")

    with pytest.raises(ModelImportError, match="graph rewrite 'broken' failed on the model: RuntimeError: cannot") as info:
        fuse(relu_model(), host, rewrites=[Broken()])
    assert "--graph-rewrites" in str(info.value)
