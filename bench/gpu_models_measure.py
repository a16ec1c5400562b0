"""The GPU half of ``bench/gpu_models.py``: run a round's model bundles, PyTorch on the same models, then its task bundles.

``python3 gpu_models_measure.py ROUND --out DIR [--torch-modes eager,graph] [--task-budget S]``
runs each model bundle's script (check and timing), times PyTorch on the
same architectures and batches (``bench/torch_baselines.py``), then measures
the task bundles (each bundle's ``run_bundle.py``, as ``gpu_measure.py`` does)
until ``--task-budget`` seconds have passed, and packs every results file and
log into ``DIR/ROUND.tar.gz`` after each step. It needs numpy, CuPy and
PyTorch, not TVM or probtune.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODEL_TIMEOUT = 120  # seconds for one model bundle's script
TORCH_TIMEOUT = 400  # seconds for all the PyTorch baselines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("round")
    parser.add_argument("--out", required=True)
    parser.add_argument("--torch-modes", default="eager,graph")
    parser.add_argument("--task-budget", type=float, default=240.0, help="seconds for the task bundles at most")
    args = parser.parse_args()
    root, out = Path(args.round), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    models = sorted(p.parent for p in root.glob("models/*/manifest.json"))
    for folder in models:
        _run([sys.executable, str(folder / "run_model_bundle.py")], folder / "run.log", MODEL_TIMEOUT)
        _pack(root, out)
    names = [json.loads((folder / "manifest.json").read_text())["model"] for folder in models]
    if names and args.torch_modes:
        _run([sys.executable, str(HERE / "torch_baselines.py"), "--models", ",".join(names), "--modes", args.torch_modes,
              "--out", str(root / "torch.json")], root / "torch.log", TORCH_TIMEOUT)
        _pack(root, out)
    sys.path.insert(0, str(HERE))
    from gpu_measure import _measure  # the task bundles are measured as cuda_gpu.py's are

    deadline = time.perf_counter() + args.task_budget
    for bundle in sorted(p.parent for p in root.glob("tasks/*/manifest.json")):
        if time.perf_counter() > deadline:
            print(f"{bundle.name}: left unmeasured (the task budget is spent)", flush=True)
            continue
        _measure(bundle)
        _pack(root, out)
    return 0


def _run(command: list[str], log: Path, timeout: float) -> None:
    started = time.perf_counter()
    with log.open("a") as stream:
        try:
            code: object = subprocess.run(command, stdout=stream, stderr=subprocess.STDOUT, timeout=timeout,
                                          check=False).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    print(f"{log.parent.name}/{log.name}: exit {code} in {time.perf_counter() - started:.0f} s", flush=True)
    print(log.read_text()[-1500:], flush=True)


def _pack(root: Path, out: Path) -> None:
    """Every results file and log of the round, as paths under the round's parent."""
    names = ["results.json", "results.jsonl", "run.log", "torch.json", "torch.log"]
    with tarfile.open(out / f"{root.name}.tar.gz", "w:gz") as packed:
        for path in sorted(root.rglob("*")):
            if path.name in names:
                packed.add(path, arcname=str(path.relative_to(root.parent)))


if __name__ == "__main__":
    sys.exit(main())
