"""An ONNX model whose products read their operands rounded to a narrow type, as a model compiled in it reads them.

A model compiled in fp16 or bf16 rounds its weights and the activations its
convolutions and matrix products read; onnxruntime running the float32 model
with those operands rounded (cast to the narrow type and back) shows how far
that rounding alone moves the outputs. Some models on random inputs move
further than a fixed tolerance allows (MobileNetV2's small logits), and every
fp16 or bf16 deployment of them moves as far.
"""

from __future__ import annotations

from typing import Any

__all__ = ["rounded_operands"]

_PRODUCTS = ("Conv", "ConvTranspose", "MatMul", "Gemm")


def rounded_operands(onnx_model: Any, precision: str) -> Any:
    """A copy of ``onnx_model`` whose float32 products read their first two inputs rounded to ``precision``'s type
    (``fp16`` or ``bf16``); None where the model's types cannot be inferred."""
    import onnx
    from onnx import TensorProto, helper

    narrow = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}[precision]
    try:
        inferred = onnx.shape_inference.infer_shapes(onnx_model)
    except Exception:  # noqa: BLE001 - onnx's inference refuses some exported graphs (or ones over 2 GB)
        return None
    graph = inferred.graph
    floats = {v.name for v in [*graph.input, *graph.value_info, *graph.output]
              if v.type.tensor_type.elem_type == TensorProto.FLOAT}
    floats |= {init.name for init in graph.initializer if init.data_type == TensorProto.FLOAT}
    rounded = onnx.ModelProto()
    rounded.CopyFrom(onnx_model)
    nodes = []
    for index, node in enumerate(rounded.graph.node):
        if node.op_type in _PRODUCTS and node.domain in ("", "ai.onnx"):
            for slot, name in list(enumerate(node.input))[:2]:
                if name in floats:
                    cast, back = f"{name}/rounded{index}_{slot}", f"{name}/widened{index}_{slot}"
                    nodes += [helper.make_node("Cast", [name], [cast], to=narrow),
                              helper.make_node("Cast", [cast], [back], to=TensorProto.FLOAT)]
                    node.input[slot] = back
        nodes.append(node)
    del rounded.graph.node[:]
    rounded.graph.node.extend(nodes)
    return rounded
