"""Every variable of a model's Relax functions under a name of its own, before the model is fused into tasks.

Relax tells variables apart by identity, not name, and the graph rewrites
emit new ones under names an imported model may already use. A fused
function's parameters, and so its task's buffers, are named after the
variables it reads; two buffers of one name give two shared-memory copies of
one name, which the GPU space cannot tell apart. A later variable of a name
already taken is renamed ``name_1``, ``name_2``, ...
"""

from __future__ import annotations

import tvm
from tvm import relax

__all__ = ["unique_variable_names"]


@relax.expr_functor.mutator
class _UniqueNames(relax.PyExprMutator):  # type: ignore[misc]
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.taken: set[str] = set()
        self.changed = 0

    def unique(self, name: str) -> str:
        candidate, number = name, 0
        while candidate in self.taken:
            number += 1
            candidate = f"{name}_{number}"
        self.taken.add(candidate)
        return candidate

    def visit_function_(self, func: relax.Function) -> relax.Expr:
        self.taken = {str(param.name) for param in func.params}
        return super().visit_function_(func)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = self.visit_expr(binding.value)
        old = binding.var
        name = self.unique(str(old.name))
        if name == str(old.name):
            new = old
        else:
            self.changed += 1
            kind = relax.DataflowVar if isinstance(old, relax.DataflowVar) else relax.Var
            new = kind(name, old.ty)
            self.set_var_remap(old, new)
        self.builder_.emit_normalized(relax.VarBinding(new, value))


def unique_variable_names(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each Relax function's variables named apart (``mod`` itself where they already are)."""
    mutator = _UniqueNames(mod)
    functions = dict(mod.functions)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            functions[gv] = mutator.visit_expr(func)
    return tvm.IRModule(functions, attrs=mod.attrs) if mutator.changed else mod
