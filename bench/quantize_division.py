"""A requantizing residual add on this CPU: what its division by the output scale costs, and what the exact
alternative (the reciprocal corrected by Markstein's FMA step) would cost instead.

The program is what a QDQ model's residual add runs per element: two uint8
tensors dequantized, added, divided by the output's scale, rounded,
offset and saturated to uint8. probtune divides (``rewrite-invariant-division``
leaves a quotient that a store rounds a division: the reciprocal's product
rounds one step off at half-way cases). Four forms of one schedule, 16 lanes,
rows in parallel, timed in turns:

- ``division``: as probtune compiles it;
- ``markstein``: ``q = a * r``, then ``q + fma(-q, b, a) * r``, with a select keeping
  ``q`` where the step is NaN: the division's bits wherever the quotient is normal;
- ``reciprocal``: ``a * r`` alone (not exact: for reference);
- ``no_division``: the sum rounded without dividing (the floor).

Every form's output is compared with the division's.

    .venv/bin/python bench/quantize_division.py --rounds 7
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import tvm
from common import SETTLE_SECONDS, cpu_model
from isolated import median_ratio
from tvm import s_tir, te, tirx

from probtune.targets import resolve_target

FORMS = ("division", "markstein", "reciprocal", "no_division")
ZERO_POINTS, SCALES = (3, 5, 7), (0.0213, 0.0371, 0.0457)


def _quotient(form: str, a: tirx.Expr, b: tirx.Expr) -> tirx.Expr:
    one = tirx.const(1.0, "float32")
    if form == "division":
        return a / b
    if form == "reciprocal":
        return a * (one / b)
    if form == "no_division":
        return a
    q = a * (one / b)
    step = tirx.call_llvm_pure_intrin("float32", "llvm.fma", tirx.call_llvm_pure_intrin(
        "float32", "llvm.fma", -q, b, a), one / b, q)
    return tirx.Select(tirx.abs(q) < tirx.const(float("inf"), "float32"), step, q)


def build(form: str, rows: int, channels: int, target: tvm.target.Target) -> tvm.runtime.Module:
    """The requantizing add over ``rows`` x ``channels`` uint8 elements, in ``form``."""
    x = te.placeholder((rows, channels), "uint8", name="x")
    y = te.placeholder((rows, channels), "uint8", name="y")
    scale = te.placeholder((3,), "float32", name="scale")

    def add(i: tirx.Var, j: tirx.Var) -> tirx.Expr:
        dequantized = [(t[i, j].astype("int32") - zero).astype("float32") * scale[n]
                       for n, (t, zero) in enumerate(((x, ZERO_POINTS[0]), (y, ZERO_POINTS[1])))]
        rounded = tirx.round(_quotient(form, dequantized[0] + dequantized[1], scale[2])) + float(ZERO_POINTS[2])
        return tirx.max(tirx.min(rounded, tirx.const(255.0, "float32")), tirx.const(0.0, "float32")).astype("uint8")

    sch = s_tir.Schedule(te.create_prim_func([x, y, scale, te.compute((rows, channels), add, name="out")]))
    i, j = sch.get_loops(sch.get_sblock("out"))
    sch.parallel(i)
    sch.vectorize(sch.split(j, [None, 16])[1])
    return tvm.compile(sch.mod, target=target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=56 * 56, help="output pixels (ResNet-50's first stage: 3136)")
    parser.add_argument("--channels", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200, help="calls per timed round")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "quantize_division.json")
    args = parser.parse_args()
    target = tvm.target.Target(resolve_target("host").tvm_target)
    rng = np.random.default_rng(0)
    inputs = [tvm.runtime.tensor(rng.integers(0, 256, (args.rows, args.channels)).astype("uint8")) for _ in range(2)]
    inputs.append(tvm.runtime.tensor(np.array(SCALES, "float32")))
    timed, outputs = {}, {}
    for form in FORMS:
        module = build(form, args.rows, args.channels, target)
        out = tvm.runtime.tensor(np.zeros((args.rows, args.channels), "uint8"))
        module["main"](*inputs, out)
        outputs[form] = out.numpy()
        timed[form] = module.mod.time_evaluator("main", tvm.cpu(), number=args.calls, repeat=1), out
    rounds: dict[str, list[float]] = {form: [] for form in FORMS}
    for r in range(args.rounds):
        for form in FORMS[r % len(FORMS):] + FORMS[:r % len(FORMS)]:
            time.sleep(SETTLE_SECONDS)
            evaluator, out = timed[form]
            rounds[form].append(float(evaluator(*inputs, out).mean))
    result = {
        "machine": cpu_model(), "rows": args.rows, "channels": args.channels, "rounds": args.rounds,
        "microseconds": {form: round(float(np.median(v)) * 1e6, 2) for form, v in rounds.items()},
        "microseconds_per_round": {form: [round(t * 1e6, 2) for t in v] for form, v in rounds.items()},
        "vs_division": {form: round(median_ratio(rounds["division"], rounds[form]), 3) for form in FORMS},
        "ratio_range_vs_division": {form: [round(min(d / t for d, t in zip(rounds["division"], rounds[form])), 3),
                                           round(max(d / t for d, t in zip(rounds["division"], rounds[form])), 3)]
                                    for form in FORMS},
        "elements_unlike_division": {form: int((outputs[form] != outputs["division"]).sum()) for form in FORMS},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
