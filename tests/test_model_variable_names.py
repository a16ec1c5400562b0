"""A model's Relax variables named apart before fusion (probtune.model.variable_names)."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from probtune.model.variable_names import unique_variable_names


def _module(names: tuple[str, str]) -> tvm.IRModule:
    """``main(x) = relu(x) + exp(x)``, its two intermediate variables named ``names`` (built binding by binding: a
    block builder would name them apart itself, as it does not for the variables a rewrite keeps)."""
    ty = relax.TensorType((2, 3), "float32")
    x, first, second, out = relax.Var("x", ty), relax.DataflowVar(names[0], ty), relax.DataflowVar(names[1], ty), relax.Var("out", ty)
    bindings = [relax.VarBinding(first, relax.op.nn.relu(x)), relax.VarBinding(second, relax.op.exp(x)),
                relax.VarBinding(out, relax.op.add(first, second))]
    main = relax.Function([x], relax.SeqExpr([relax.DataflowBlock(bindings)], out), ty)
    return relax.transform.Normalize()(tvm.IRModule({"main": main.with_attr("global_symbol", "main")}))


def _names(mod: tvm.IRModule) -> list[str]:
    return [str(b.var.name) for block in mod["main"].body.blocks for b in block.bindings]


def _run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_a_name_taken_twice_is_given_a_suffix_and_the_function_computes_the_same():
    mod = _module(("lv6", "lv6"))
    renamed = unique_variable_names(mod)
    names = _names(renamed)
    assert names[:2] == ["lv6", "lv6_1"] and len(set(names)) == len(names)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype("float32")
    np.testing.assert_allclose(_run(renamed, x), _run(mod, x))


def test_a_module_whose_names_are_apart_is_returned_as_it_is():
    mod = _module(("a", "b"))
    assert unique_variable_names(mod) is mod
