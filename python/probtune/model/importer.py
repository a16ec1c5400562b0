"""Import a model: an ONNX file (through TVM's Relax ONNX frontend) or a Relax IRModule, with static input shapes.

Real exported models often compute shapes at run time (Shape -> Gather ->
Concat -> Reshape), which the frontend cannot import. With the input shapes
fixed, onnxslim folds those computations to constants first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax

from probtune.errors import ModelImportError, last_line, warn_caller
from probtune.model.index_bounds import index_bounds
from probtune.plugins import get_registry
from probtune.workloads.workload import parse_shape

__all__ = ["InputSpec", "Model", "load_model"]


@dataclass(frozen=True)
class InputSpec:
    """One model input: its name, static shape and dtype; for integers that index a table (token ids), its rows."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    table_rows: int | None = None

    def random(self, rng: np.random.Generator) -> np.ndarray:
        """An input array: floats ~ U(-1, 1), integers in [0, 4] (small indices, within the table they index)."""
        if np.issubdtype(np.dtype(self.dtype), np.floating):
            return rng.uniform(-1.0, 1.0, size=self.shape).astype(self.dtype)
        return rng.integers(0, min(5, self.table_rows or 5), size=self.shape).astype(self.dtype)


@dataclass(frozen=True, eq=False)
class Model:
    """A model ready to tune: a Relax module with its weights bound as constants, and its inputs.

    ``onnx_model`` is the ONNX model it came from (None for a Relax module):
    onnxruntime runs it as the reference for the compiled model's outputs.
    """

    name: str
    mod: tvm.IRModule
    inputs: tuple[InputSpec, ...]
    onnx_model: Any = None

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [spec.random(rng) for spec in self.inputs]


ShapeArg = Mapping[str, Sequence[int] | str]


def load_model(
    source: str | os.PathLike[str] | tvm.IRModule, input_shapes: ShapeArg | None = None, *, name: str | None = None
) -> Model:
    """Import ``source``: the path of an ONNX file, or a Relax ``IRModule`` (taken as it is).

    ``input_shapes`` gives the shape of an input by name; it is needed for
    each input whose shape the file leaves open, and overrides a fixed one
    of the same rank.
    """
    if isinstance(source, tvm.IRModule):
        if input_shapes:
            raise ModelImportError("input_shapes apply to ONNX files; a Relax module's inputs have their own shapes")
        return Model(name or "relax_module", source, _with_index_bounds(source, _relax_inputs(source)))
    path = Path(source)
    if not path.is_file():
        raise ModelImportError(f"{path}: no such file (expected an ONNX model file)")
    onnx_model = _read_onnx(path)
    inputs = _onnx_inputs(onnx_model, path, dict(input_shapes or {}))
    mod = _import_onnx(onnx_model, inputs, path)
    return Model(name or path.stem, mod, _with_index_bounds(mod, inputs), onnx_model)


def _with_index_bounds(mod: tvm.IRModule, inputs: tuple[InputSpec, ...]) -> tuple[InputSpec, ...]:
    """``inputs`` (``main``'s parameters, in order) with the rows of the table each indexes, where it indexes one."""
    bounds = index_bounds(mod)
    return tuple(dataclasses.replace(spec, table_rows=bounds[i]) if i in bounds else spec for i, spec in enumerate(inputs))


def _read_onnx(path: Path) -> Any:
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(path))
    except (DecodeError, ValueError, RuntimeError, UnicodeDecodeError) as exc:
        raise ModelImportError(f"{path}: not an ONNX model ({type(exc).__name__}: {exc})") from None
    if not model.graph.node:
        raise ModelImportError(f"{path}: not an ONNX model, or one with an empty graph")
    return model


def _onnx_inputs(model: Any, path: Path, given: dict[str, Sequence[int] | str]) -> tuple[InputSpec, ...]:
    """The graph inputs that are not weights, with their shapes fixed from the file and ``given``."""
    from onnx import helper

    weights = {init.name for init in model.graph.initializer}
    graph_inputs = [value for value in model.graph.input if value.name not in weights]
    names = [value.name for value in graph_inputs]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ModelImportError(f"{path}: input_shapes names {unknown}, but the model's inputs are {names}")
    specs = []
    for value in graph_inputs:
        tensor = _tensor_type(value, path)
        dims = [dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0 else None for dim in tensor.shape.dim]
        dtype = str(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        specs.append(InputSpec(value.name, _fixed_shape(path, value.name, dims, given.get(value.name)), dtype))
    return tuple(specs)


def _tensor_type(value: Any, path: Path) -> Any:
    """An input's tensor type: its own, or an optional's element (present in every call); refused for a sequence."""
    kind = value.type.WhichOneof("value")
    if kind == "tensor_type":
        return value.type.tensor_type
    if kind == "optional_type" and value.type.optional_type.elem_type.WhichOneof("value") == "tensor_type":
        return value.type.optional_type.elem_type.tensor_type
    raise ModelImportError(
        f"{path}: input {value.name!r} is a {kind.replace('_type', '') if kind else 'value of no type'}, not a tensor; "
        "probtune takes tensor inputs: export the model with tensors in its place"
    )


def _fixed_shape(path: Path, name: str, dims: list[int | None], given: Sequence[int] | str | None) -> tuple[int, ...]:
    if given is None:
        if None in dims:
            shown = ",".join("?" if d is None else str(d) for d in dims)
            raise ModelImportError(
                f"{path}: input {name!r} has a dynamic shape ({shown}); give it, e.g. "
                f"input_shapes={{{name!r}: (...)}} or --input-shape {name}=1,..."
            )
        return tuple(int(d) for d in dims)  # type: ignore[arg-type]
    shape = parse_shape(given)
    if len(shape) != len(dims):
        raise ModelImportError(
            f"{path}: input {name!r} has rank {len(dims)} in the model, but the given shape {shape} has rank {len(shape)}"
        )
    clash = [(d, s) for d, s in zip(dims, shape) if d is not None and d != s]
    if clash:
        raise ModelImportError(f"{path}: input {name!r} is fixed at {dims} in the model; the given shape {shape} differs")
    return shape


def _import_onnx(model: Any, inputs: tuple[InputSpec, ...], path: Path) -> tvm.IRModule:
    from tvm.relax.frontend.onnx import from_onnx

    _check_operators(model, path)
    folded = _fold_shapes(model, inputs, path)
    shapes = {spec.name: list(spec.shape) for spec in inputs}
    dtypes = {spec.name: spec.dtype for spec in inputs}
    printed = io.StringIO()  # the frontend prints the operator it failed on (with every input) before raising
    try:
        with _plugin_converters(), contextlib.redirect_stdout(printed):
            mod = from_onnx(folded, shape_dict=shapes, dtype_dict=dtypes, keep_params_in_input=False)
    except ModelImportError as exc:  # a plugin's converter refused a node's form
        raise ModelImportError(f"{path}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the frontend raises many kinds; each is reported with its node
        failed = re.search(r"Error converting operator (\w+)", printed.getvalue())
        where = f" (converting a {failed.group(1)} node)" if failed else ""
        raise ModelImportError(
            f"{path}: TVM's ONNX frontend cannot import this model{where}: {_described(exc)}. "
            "Export it again with static shapes (or a newer opset), or import it with TVM yourself and pass the "
            "Relax module to probtune"
        ) from None
    print(printed.getvalue(), end="")
    return _with_every_input(mod, inputs)


def _converters() -> dict[str, Any]:
    """TVM's frontend converters, with the plugins' (``probtune_register_onnx_converters``) for what it lacks."""
    from tvm.relax.frontend.onnx import onnx_frontend

    converters = dict(onnx_frontend._get_convert_map())
    for op_type, convert in get_registry().onnx_converters.items():
        converters.setdefault(op_type, _Converter(convert))
    return converters


@contextlib.contextmanager
def _plugin_converters() -> Iterator[None]:
    """The frontend's converter table widened by :func:`_converters` while a model imports."""
    from tvm.relax.frontend.onnx import onnx_frontend

    original = onnx_frontend._get_convert_map
    widened = _converters()
    onnx_frontend._get_convert_map = lambda: widened
    try:
        yield
    finally:
        onnx_frontend._get_convert_map = original


class _Converter:
    """A plugin's converter function in the form TVM's frontend calls (its converter classes' ``get_converter``)."""

    def __init__(self, convert: Any) -> None:
        self.convert = convert

    def get_converter(self, opset: int) -> Any:
        return lambda bb, inputs, attrs, params: self.convert(bb, inputs, attrs, opset)


def _with_every_input(mod: tvm.IRModule, inputs: tuple[InputSpec, ...]) -> tvm.IRModule:
    """``mod`` whose ``main`` takes every input of the model, in order, used or not (the frontend drops unused ones,
    but a caller passes what the model declares)."""
    main = mod["main"]
    if len(main.params) == len(inputs):
        return mod
    used = list(main.params)
    params = []
    for spec in inputs:  # the frontend keeps the used inputs in order, under its own spelling of their names
        if used and _frontend_spelling(spec.name, str(used[0].name)):
            params.append(used.pop(0))
        else:
            params.append(relax.Var(spec.name, relax.TensorType(spec.shape, spec.dtype)))
    if used:
        raise ModelImportError(f"the imported model's inputs {[str(p.name) for p in main.params]} do not match the "
                               f"file's {[spec.name for spec in inputs]}")
    updated = relax.Function(params, main.body, main.ret_ty, main.is_pure, main.attrs, main.span)
    mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    mod[mod.get_global_var("main")] = updated
    return mod


def _frontend_spelling(name: str, imported: str) -> bool:
    """Whether TVM's ONNX frontend may have named input ``name`` ``imported``: dots made underscores, a name that
    does not start with a letter prefixed with ``input_``, and a ``_N`` suffix where the name was taken."""
    base = name.replace(".", "_")
    if not (base[:1].isalpha() or base[:1] == "_"):
        base = f"input_{base}"
    return imported == name or re.fullmatch(re.escape(base) + r"(_\d+)?", imported) is not None


def _check_operators(model: Any, path: Path) -> None:
    """An operator no converter takes (TVM's or a plugin's) is named, with its node, before anything else runs."""
    supported = _converters()
    for index, node in enumerate(model.graph.node):
        if node.op_type not in supported:
            where = f"node {node.name!r}" if node.name else f"node {index}"
            domain = f" (domain {node.domain!r})" if node.domain else ""
            raise ModelImportError(
                f"{path}: operator {node.op_type}{domain} at {where} is not supported by TVM's ONNX frontend; "
                "replace it in the model (e.g. export with another opset or without custom operators), or import "
                "the model with TVM yourself and pass the Relax module to probtune"
            )


def _fold_shapes(model: Any, inputs: tuple[InputSpec, ...], path: Path) -> Any:
    """The model with its input shapes fixed and the shape computations that follow folded (onnxslim)."""
    import onnxslim

    shapes = [f"{spec.name}:{','.join(map(str, spec.shape))}" for spec in inputs]
    try:
        return onnxslim.slim(model, input_shapes=shapes, no_shape_infer=False)
    except Exception as exc:  # noqa: BLE001 - a model onnxslim cannot fold is imported as it is
        warn_caller(f"{path}: shape computations were not folded (onnxslim: {_described(exc)}); importing as it is")
        return model


def _relax_inputs(mod: tvm.IRModule) -> tuple[InputSpec, ...]:
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()] or not isinstance(mod["main"], relax.Function):
        raise ModelImportError("a Relax module must have a Relax function 'main', the model's entry point")
    specs = []
    for param in mod["main"].params:
        name, info = str(param.name), param.ty
        if not isinstance(info, relax.TensorType) or not isinstance(info.shape, relax.ShapeExpr):
            raise ModelImportError(f"input {name!r} of 'main' is not a tensor of known shape")
        dims = list(info.shape.values)
        if not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
            raise ModelImportError(f"input {name!r} of 'main' has the dynamic shape {info.shape}; probtune tunes static shapes")
        specs.append(InputSpec(name, tuple(int(d) for d in dims), str(info.dtype)))
    return tuple(specs)


def _described(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {last_line(exc)}"
