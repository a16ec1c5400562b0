"""The precision a model is compiled in: as its file has it, or float32 converted to float16 by TVM's mixed-precision pass.

``fp16`` casts the weights and activations of convolutions and matrix
products to float16 with float32 sums (``ToMixedPrecision`` with float32
accumulation), and leaves in float32 what that pass keeps there (softmax and
normalization statistics); the model's inputs and outputs keep their types.
Its outputs are checked with the tolerance of ``TOLERANCES``.
"""

from __future__ import annotations

import tvm
from tvm import relax

from probtune.defaults import PRECISIONS
from probtune.errors import TuningConfigError

__all__ = ["PRECISIONS", "TOLERANCES", "convert_precision"]

TOLERANCES = {"fp32": (1e-3, 1e-3), "fp16": (1e-2, 1e-2)}
"""(rtol, atol as a share of the output's RMS) per precision: float16 keeps 11 bits, so a product of hundreds of
terms rounded at each layer drifts by about 1e-3 relative per layer, 1e-2 over a deep model."""


def convert_precision(mod: tvm.IRModule, precision: str) -> tvm.IRModule:
    """``mod`` in ``precision`` (one of ``PRECISIONS``); TuningConfigError for another."""
    if precision not in PRECISIONS:
        raise TuningConfigError(f"unknown precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return mod
    return relax.transform.ToMixedPrecision(out_dtype="float32")(mod)
