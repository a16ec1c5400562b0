"""The zoo table across runs: the latest result of each model from bench/zoo.py's result files, one table and one plot.

    python bench/zoo_summary.py [FILE ...] [--plot bench/results/zoo_summary.png]

Without files, every ``bench/results/zoo_tuned_1000*.json`` in the order git added them (a file git does not
know comes last, by modification time; files added in one commit by name); a later file's correct result for a
model replaces an earlier one. Each row names the file it came from, since files span code versions and
machines. The plot shows each model's ratio (the median over timing rounds of onnxruntime's time over probtune's
in the same round) with the range of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import numpy as np
from common import geomean

RESULTS = Path(__file__).parent / "results"
DEFAULT_GLOB = "zoo_tuned_1000*.json"


def added_order(files: list[Path]) -> list[Path]:
    """``files`` in the order git added them to history; files git does not know last, oldest first."""
    def key(path: Path) -> tuple[int, float]:
        log = subprocess.run(["git", "log", "--diff-filter=A", "--format=%ct", "--", path.name],
                             cwd=path.parent, capture_output=True, text=True, check=False).stdout.split()
        return (int(log[-1]), 0.0) if log else (1 << 62, path.stat().st_mtime)

    return sorted(files, key=key)


def latest_results(files: list[Path]) -> dict[str, dict]:
    """Each model's result from the last file that has a correct one, tagged with that file's name and machine;
    a model no file finished keeps its last failure."""
    latest: dict[str, dict] = {}
    for path in files:
        run = json.loads(path.read_text())
        for result in run.get("models", []):
            finished = result.get("stage") == "done"
            if finished or latest.get(result["model"], {}).get("stage") != "done":
                latest[result["model"]] = {**result, "file": path.name, "machine": run.get("machine", "-")}
    return latest


def round_ratios(result: dict) -> list[float]:
    """onnxruntime's time over probtune's in each timing round (empty without timings)."""
    rounds = result.get("latency_ms_per_round", {})
    if "onnxruntime" not in rounds or "probtune" not in rounds:
        return []
    return list(np.asarray(rounds["onnxruntime"]) / np.asarray(rounds["probtune"]))


def table(latest: dict[str, dict]) -> str:
    """Markdown: one row per model, slowest ratio first, then the counts and the summary over the models timed."""
    rows = sorted(latest.values(), key=lambda r: r.get("speedup_vs_onnxruntime") or 0.0)
    lines = ["| model | family | outcome | tasks | transposes (own layouts) | x onnxruntime (median) | rounds' range "
             "| x faster of its thread counts | machine | file |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        outcome = "correct" if r["stage"] == "done" else f"{r['stage']}: {r.get('error', {}).get('type', '')}"
        ratios = round_ratios(r)
        spread = f"{min(ratios):.3f}-{max(ratios):.3f}" if ratios else "-"
        speed, fastest = (r.get(key) for key in ("speedup_vs_onnxruntime", "speedup_vs_fastest_onnxruntime"))
        moved = f"{r['transposes']['calls']} ({r['transposes_own_layouts']['calls']})" if "transposes" in r else "-"
        lines.append(f"| {r['model']} | {r.get('family', '-')} | {outcome} | {r.get('tasks', '-')} | {moved} | "
                     f"{'-' if speed is None else f'{speed:.3f}'} | {spread} | "
                     f"{'-' if fastest is None else f'{fastest:.3f}'} | {r['machine']} | {r['file']} |")
    correct = sum(r["stage"] == "done" for r in rows)
    lines += ["", f"{correct} of {len(rows)} models correct"]
    speeds = [r["speedup_vs_onnxruntime"] for r in rows if r.get("speedup_vs_onnxruntime")]
    lines.append(summary("against onnxruntime on two threads", speeds))
    # Runs that timed onnxruntime on one thread as well: the faster of its two settings, else the two-thread ratio.
    lines.append(summary("against the faster of onnxruntime's thread counts where both were timed", [
        r.get("speedup_vs_fastest_onnxruntime") or r["speedup_vs_onnxruntime"] for r in rows
        if r.get("speedup_vs_onnxruntime")]))
    return "\n".join(lines)


def summary(against: str, speeds: list[float]) -> str:
    """One line over the timed models' ratios."""
    return (f"{against}: {len(speeds)} timed, onnxruntime/probtune geomean {geomean(speeds) or 0:.3f}, "
            f"min {min(speeds, default=0):.3f}, {sum(s < 1.0 for s in speeds)} below 1.0, "
            f"{sum(s < 0.9 for s in speeds)} below 0.9")


def plot(latest: dict[str, dict], path: Path) -> None:
    """Horizontal bars of each timed model's ratio, with whiskers over its rounds' range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted((r for r in latest.values() if r.get("speedup_vs_onnxruntime")),
                  key=lambda r: r["speedup_vs_onnxruntime"])
    medians = [r["speedup_vs_onnxruntime"] for r in rows]
    ranges = [round_ratios(r) or [m] for r, m in zip(rows, medians, strict=True)]
    whiskers = [[m - min(x) for m, x in zip(medians, ranges, strict=True)],
                [max(x) - m for m, x in zip(medians, ranges, strict=True)]]
    fig, ax = plt.subplots(figsize=(7, 0.22 * len(rows) + 1.2))
    ax.barh(range(len(rows)), medians, xerr=whiskers, color="tab:blue", ecolor="gray", capsize=2)
    for x, style in ((1.0, "-"), (0.9, ":"), (geomean(medians) or 1.0, "--")):
        ax.axvline(x, color="black", linewidth=0.8, linestyle=style)
    ax.set_yticks(range(len(rows)), [r["model"] for r in rows], fontsize=7)
    ax.set_xlabel("onnxruntime time / probtune time (higher: probtune faster); dashed: geomean")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path, help=f"bench/zoo.py result files (default: results/{DEFAULT_GLOB})")
    parser.add_argument("--plot", type=Path, help="write the plot here (PNG)")
    args = parser.parse_args()
    files = args.files or added_order(sorted(RESULTS.glob(DEFAULT_GLOB)))
    latest = latest_results(files)
    print(table(latest))
    if args.plot:
        plot(latest, args.plot)


if __name__ == "__main__":
    main()
