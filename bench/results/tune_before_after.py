"""Tuning wall time and search throughput at two commits, in one run of the machine (issue 43's before/after).

Usage: .venv/bin/python bench/results/tune_before_after.py BEFORE_TREE AFTER_TREE OUT.json
Each tree is a checkout (git worktree) with probtune's compiled core copied in; each run is a fresh
process whose PYTHONPATH puts that tree's kernel and plugins first. Runs alternate before/after/after/before.
"""
import json
import subprocess
import sys
import tempfile

RUN = r"""
import json, sys, tempfile, time, warnings
warnings.simplefilter("ignore")
import probtune
out = {}
with tempfile.TemporaryDirectory() as tmp:
    r = probtune.tune("matmul", shape=(512, 512, 512), trials=128, database=tmp + "/op.db", seed=0)
    out["matmul_512_128_trials"] = {"seconds": r.seconds, "search_seconds": r.search_seconds,
                                    "measure_seconds": r.measure_seconds, "measured": r.measured,
                                    "best_ms": r.best.mean_latency * 1e3 if r.best else None}
    m = probtune.tune_model("bench/zoo/squeezenet1_1.onnx", trials=96, database=tmp + "/model.db", seed=0)
    out["squeezenet_96_trials"] = {"seconds": m.seconds, "search_seconds": m.search_seconds,
                                   "measure_seconds": m.measure_seconds, "measured": m.trials,
                                   "estimated_ms": m.estimated_latency * 1e3 if m.estimated_latency else None}
print("RESULT" + json.dumps(out))
"""


def run(tree: str) -> dict:
    plugins = ":".join(f"{tree}/plugins/probtune-{name}/src" for name in ("cpu", "x86", "arm", "xgb", "cuda"))
    env = {"PYTHONPATH": f"{tree}/python:{plugins}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True, env=env, cwd="/work/main")
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT")), None)
    if line is None:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(line[len("RESULT"):])


def main() -> None:
    before, after, out = sys.argv[1:4]
    results: dict[str, list] = {"before": [], "after": []}
    for label in ("before", "after", "after", "before"):
        results[label].append(run(before if label == "before" else after))
        print(label, json.dumps(results[label][-1]), flush=True)
    json.dump({"before": before, "after": after, "runs": results}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
