"""How much of the CUDA design space survives its checks, and how fast candidates build and lint here (no GPU).

For each workload, random draws of probtune's space for a CUDA target and
of TVM MetaSchedule's own CUDA space (its default rules and postprocessors,
``replay-trace`` style: the design space's trace with its decisions
dropped) are counted as passing the pre-build checks or not; then up to
``--build`` passing programs of each are compiled by the target's compiler
(TVM, then NVRTC to a cubin) and linted (no spills, no local memory,
registers within the block), timed per candidate; those whose CUDA code
multiplies with WMMA or ``mma.sync`` are counted as running on the tensor
cores, and those that copy with ``cp.async`` or stage copies through
registers (software pipelines) are counted too.

Run with ``make bench-cuda`` (or ``.venv/bin/python bench/cuda_space.py``);
the report goes to ``bench/results/cuda_space.json``. Nothing here needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path
from typing import Any

import tvm
import tvm.s_tir.meta_schedule as ms
from common import cpu_model, program_kind
from tvm import s_tir

from probtune import Rng
from probtune.space.space_generator import generate_space
from probtune.targets import resolve_target
from probtune.workloads.catalog import resolve_workload
from probtune_cuda.codegen import NVRTCCompiler

RESULTS = Path(__file__).resolve().parent / "results"
WORKLOADS = (
    "matmul:1024,1024,1024",
    "dense_bias_relu:128,3072,768",
    "conv2d_nhwc:1,64,56,56,64,3,3,1,1",
    "softmax:256,1024",
    "matmul:4096,4096,4096:float16",
    "dense_bias_gelu:128,3072,768:float16",
    "matmul:1000,1000,1000:float16",
    "dense_bias_gelu:100,3072,768:float16",
    "conv2d_nhwc:1,64,56,56,64,3,3,1,1:float16",
    "conv2d_nchw:8,128,28,28,128,3,3,1,1:float16",
)
"""``name:shape[:dtype]``: float32 unless named; the float16 ones are tensor-core work (two matmuls only after
padding to whole 16-wide tiles, the convolutions once rewritten as matmuls)."""


def probtune_draws(work: Any, target: Any, count: int, seed: int) -> tuple[list[tvm.IRModule], float]:
    """Programs of ``count`` fresh draws that pass probtune's checks, and the seconds per draw."""
    space = generate_space(work, target, seed=seed)
    rng, passed = Rng(seed), []
    started = time.perf_counter()
    for _ in range(count):
        candidate = space.sample(rng)
        if candidate is not None:
            passed.append(candidate.mod)
    return passed, (time.perf_counter() - started) / count


def metaschedule_draws(work: Any, target: Any, count: int, seed: int) -> tuple[list[tvm.IRModule], float]:
    """Programs of ``count`` random draws of MetaSchedule's CUDA space that pass its postprocessors."""
    tvm_target = tvm.target.Target(dict(target.tvm_target))
    context = ms.TuneContext(mod=work.mod, target=tvm_target, space_generator="post-order-apply", rand_state=seed)
    traces = [space.trace for space in context.generate_design_space()]
    postprocs = context.space_generator.postprocs
    passed = []
    started = time.perf_counter()
    for index in range(count):
        trace = traces[index % len(traces)]
        sch = s_tir.Schedule(work.mod, seed=seed * 100003 + index + 1)  # TVM takes seeds from 1
        try:
            s_tir.schedule.Trace(trace.insts, {}).apply_to_schedule(sch, remove_postproc=True)
        except Exception:  # noqa: BLE001 - a draw MetaSchedule cannot replay counts as failing
            continue
        if all(postproc.apply(sch) for postproc in postprocs):
            passed.append(sch.mod)
    return passed, (time.perf_counter() - started) / count


def build_and_lint(programs: list[tvm.IRModule], target: Any, limit: int) -> dict[str, Any]:
    """Compile up to ``limit`` programs with the target's compiler; how many pass the lint, and seconds each.

    ``by_kind`` counts, for each kind of program (``mma.sync`` tiles, a
    ``cp.async`` or a register-staged pipeline, or none), how many were
    built and how many of those passed.
    """
    compiler = NVRTCCompiler()
    outcomes: dict[str, int] = {}
    kinds = dict.fromkeys(("tensor_core", "mma_sync", "cp_async", "register_staged"), 0)  # of the programs that lint
    by_kind: dict[str, dict[str, int]] = {}
    started = time.perf_counter()
    built = programs[:limit]
    for program in built:
        script = program.script()
        kind = program_kind(script)
        tally = by_kind.setdefault(kind, {"built": 0, "lint_ok": 0})
        tally["built"] += 1
        try:
            executable = compiler(program, dict(target.tvm_target))
            outcome = "ok"
            tally["lint_ok"] += 1
            source = "".join(m.inspect_source() for m in executable.mod.imports)
            kinds["tensor_core"] += "wmma::mma_sync" in source or "mma.sync.aligned" in source
            kinds["mma_sync"] += "mma.sync.aligned" in source
            kinds["cp_async"] += "cp.async.c" in source
            kinds["register_staged"] += "manifest_shared_memory_local_stage" in script
        except Exception as error:  # noqa: BLE001 - the lint's reason, or TVM's, is the outcome
            outcome = str(error).split(" (")[0].split(";")[0][:80]
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    seconds = (time.perf_counter() - started) / max(len(built), 1)
    return {"built": len(built), "lint_ok": outcomes.get("ok", 0), **kinds, "outcomes": outcomes,
            "by_kind": dict(sorted(by_kind.items())), "seconds_per_build": round(seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="cuda-sm90")
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    parser.add_argument("--draws", type=int, default=100)
    parser.add_argument("--build", type=int, default=8, help="passing programs of each system compiled and linted")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=str(RESULTS / "cuda_space.json"))
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    target = resolve_target(args.target)
    rows = []
    for item in args.workloads:
        name, _, rest = item.partition(":")
        shape, _, dtype = rest.partition(":")
        work = resolve_workload(name, shape or None, dtype or "float32")
        row: dict[str, Any] = {"workload": work.key}
        for system, draw in (("probtune", probtune_draws), ("metaschedule", metaschedule_draws)):
            passed, per_draw = draw(work, target, args.draws, args.seed)
            row[system] = {
                "draws": args.draws,
                "pass_checks": len(passed),
                "ms_per_draw": round(per_draw * 1e3, 1),
                **build_and_lint(passed, target, args.build),
            }
            print(f"{work.key} {system}: {len(passed)}/{args.draws} pass the checks; "
                  f"{row[system]['lint_ok']}/{row[system]['built']} pass the cubin lint, "
                  f"{row[system]['tensor_core']} on tensor cores ({row[system]['mma_sync']} by mma.sync), "
                  f"{row[system]['cp_async']} with cp.async, {row[system]['register_staged']} staged through registers "
                  f"({row[system]['seconds_per_build']} s per build) {row[system]['outcomes']}; "
                  f"by kind: {row[system]['by_kind']}", flush=True)
        rows.append(row)
    report = {"machine": cpu_model(), "target": target.name, "tvm_target": dict(target.tvm_target), "seed": args.seed,
              "workloads": rows}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=1))
    print(f"written: {args.output}")


if __name__ == "__main__":
    main()
