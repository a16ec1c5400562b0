"""A compiled model as a flat plan: its PrimFunc calls in order over memory TVM's planner laid out.

A machine that runs a model without TVM (a GPU that only exchanges files
with this one) needs what TVM's VM would do for a static-shape model: which
buffers to allocate, which tensor lies where in them, and which function to
call on which tensors, in order. TVM's own Relax lowering runs up to its
memory planning (``StaticPlanBlockMemory``); the plan reads the ``main``
function it leaves. A reshape is a view of its input's memory, as in TVM's VM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.ir.expr import Constant

__all__ = ["ModelPlan", "PlanCall", "PlanTensor", "UnsupportedPlan", "plan_model"]


class UnsupportedPlan(ValueError):
    """The lowered model does something a plan cannot say (a dynamic shape, a call into the runtime)."""


@dataclass(frozen=True)
class PlanTensor:
    """A tensor at ``offset`` bytes into ``storage`` (a storage's, an input's or a constant's own name)."""

    storage: str
    offset: int
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def to_json(self) -> dict[str, Any]:
        return {"storage": self.storage, "offset": self.offset, "shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class PlanCall:
    """One call of a PrimFunc: ``args`` name tensors of the plan, in the function's parameter order."""

    function: str
    args: tuple[str, ...]


@dataclass
class ModelPlan:
    """Storages (name -> bytes), tensors by name, constants (name -> array), the calls in order, inputs and outputs.

    Inputs and constants are storages of their own, named as the tensor;
    ``functions`` holds each called PrimFunc as the ``main`` of a module.
    """

    storages: dict[str, int] = field(default_factory=dict)
    tensors: dict[str, PlanTensor] = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    calls: list[PlanCall] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    functions: dict[str, tvm.IRModule] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Everything but the constants' values and the functions: what a runner needs to lay out memory and call."""
        return {
            "storages": dict(self.storages),
            "tensors": {name: tensor.to_json() for name, tensor in self.tensors.items()},
            "constants": sorted(self.constants),
            "calls": [{"function": call.function, "args": list(call.args)} for call in self.calls],
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
        }


_LOWER = (
    relax.transform.RewriteDataflowReshape(),
    relax.transform.ToNonDataflow(),
    relax.transform.RemovePurityChecking(),
    relax.transform.CallTIRRewrite(),
    relax.transform.StaticPlanBlockMemory(),
)


def plan_model(mod: tvm.IRModule, target: dict[str, Any]) -> ModelPlan:
    """The plan of ``mod``'s ``main``: every called PrimFunc already scheduled, all shapes static.

    Raises :class:`UnsupportedPlan` naming the binding a plan cannot say.
    """
    with tvm.target.Target(target):
        lowered = tvm.transform.Sequential(list(_LOWER))(mod)
    main = lowered["main"]
    builder = _PlanBuilder(lowered)
    for param in main.params:
        builder.add_input(param)
    if not isinstance(main.body, relax.SeqExpr):
        raise UnsupportedPlan("the model's main function is not a sequence of bindings")
    for block in main.body.blocks:
        for binding in block.bindings:
            builder.bind(binding)
    builder.set_outputs(main.body.body)
    return builder.plan


_ALLOC_STORAGE = "relax.memory.alloc_storage"
_ALLOC_TENSOR = "relax.memory.alloc_tensor"
_BUILTIN_ALLOC = "relax.builtin.alloc_tensor"
_RESHAPE = "relax.reshape"


class _PlanBuilder:
    """Reads ``main``'s bindings one by one into a :class:`ModelPlan`."""

    def __init__(self, mod: tvm.IRModule) -> None:
        self.mod = mod
        self.plan = ModelPlan()
        self.names: dict[Any, str] = {}  # Relax variable -> the plan's tensor or storage name
        self.tuples: dict[Any, list[str]] = {}

    def add_input(self, param: relax.Var) -> None:
        shape, dtype = _static_type(param)
        name = self._fresh(str(param.name))
        self.plan.storages[name] = PlanTensor(name, 0, shape, dtype).nbytes
        self.plan.tensors[name] = PlanTensor(name, 0, shape, dtype)
        self.plan.inputs.append(name)
        self.names[param] = name

    def bind(self, binding: relax.Binding) -> None:
        var, value = binding.var, binding.value
        if isinstance(value, relax.Var):
            self._alias(var, value)
        elif isinstance(value, relax.Tuple):
            self.tuples[var] = [self._tensor(field) for field in value.fields]
        elif isinstance(value, relax.TupleGetItem):
            self.names[var] = self.tuples[value.tuple_value][value.index]
        elif isinstance(value, Constant):
            self.names[var] = self._constant(value)
        elif isinstance(value, relax.Call):
            self._call(var, value)
        else:
            raise UnsupportedPlan(f"binding {var.name} = {type(value).__name__} has no place in a plan")

    def set_outputs(self, body: relax.Expr) -> None:
        fields = body.fields if isinstance(body, relax.Tuple) else [body]
        for item in fields:
            self.plan.outputs.extend(self.tuples[item] if item in self.tuples else [self._tensor(item)])

    def _call(self, var: relax.Var, call: relax.Call) -> None:
        op = call.op
        if isinstance(op, tvm.ir.GlobalVar):
            func = self.mod[op]
            if not isinstance(func, tirx.PrimFunc):
                raise UnsupportedPlan(f"{op.name_hint} is a Relax function: a plan calls PrimFuncs only")
            self.plan.functions.setdefault(op.name_hint, tvm.IRModule({"main": func.with_attr("global_symbol", "main")}))
            self.plan.calls.append(PlanCall(op.name_hint, tuple(self._tensor(arg) for arg in call.args)))
            return
        name = op.name if isinstance(op, tvm.ir.Op) else str(op)
        if name == _ALLOC_STORAGE:
            size, dtype = _ints(call.args[0])[0], str(call.args[3].value)
            storage = self._fresh(str(var.name))
            self.plan.storages[storage] = size
            self.names[var] = storage
        elif name == _ALLOC_TENSOR:
            shape, dtype = tuple(_ints(call.args[2])), str(call.args[3].value)
            self._place(var, PlanTensor(self.names[call.args[0]], _int(call.args[1]), shape, dtype))
        elif name == _BUILTIN_ALLOC:
            shape, dtype = tuple(_ints(call.args[0])), str(call.args[1].value)
            storage = self._fresh(str(var.name))
            tensor = PlanTensor(storage, 0, shape, dtype)
            self.plan.storages[storage] = tensor.nbytes
            self._place(var, tensor)
        elif name == _RESHAPE:
            source = self.plan.tensors[self._tensor(call.args[0])]
            shape, _ = _static_type(var)
            self._place(var, PlanTensor(source.storage, source.offset, shape, source.dtype))
        else:
            raise UnsupportedPlan(f"binding {var.name} calls {name}, which a plan cannot say")

    def _tensor(self, expr: relax.Expr) -> str:
        if isinstance(expr, Constant):
            return self._constant(expr)
        if isinstance(expr, relax.Var) and expr in self.names:
            return self.names[expr]
        raise UnsupportedPlan(f"argument {expr} is neither a tensor of the plan nor a constant")

    def _constant(self, const: Constant) -> str:
        array = const.value.numpy()
        name = self._fresh(f"constant{len(self.plan.constants)}")
        self.plan.constants[name] = array
        self.plan.storages[name] = array.nbytes
        self.plan.tensors[name] = PlanTensor(name, 0, tuple(array.shape), str(array.dtype))
        return name

    def _alias(self, var: relax.Var, value: relax.Var) -> None:
        if value in self.tuples:
            self.tuples[var] = self.tuples[value]
        else:
            self.names[var] = self._tensor(value)

    def _place(self, var: relax.Var, tensor: PlanTensor) -> None:
        name = self._fresh(str(var.name))
        self.plan.tensors[name] = tensor
        self.names[var] = name

    def _fresh(self, hint: str) -> str:
        name, number = hint, 1
        while name in self.plan.tensors or name in self.plan.storages:
            name, number = f"{hint}_{number}", number + 1
        return name


def _static_type(var: relax.Var) -> tuple[tuple[int, ...], str]:
    sinfo = var.ty
    if not isinstance(sinfo, relax.TensorType) or sinfo.shape is None:
        raise UnsupportedPlan(f"{var.name} is not a tensor of known shape")
    return tuple(_ints(sinfo.shape)), str(sinfo.dtype)


def _ints(shape: Any) -> list[int]:
    values = shape.values if isinstance(shape, relax.ShapeExpr) else shape
    if not all(isinstance(value, tirx.IntImm) for value in values):
        raise UnsupportedPlan(f"shape {shape} is not static")
    return [int(value) for value in values]


def _int(value: Any) -> int:
    if isinstance(value, tirx.IntImm):
        return int(value.value)
    raise UnsupportedPlan(f"offset {value} is not a constant")
