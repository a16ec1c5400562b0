"""The kernel tunes for any target a plugin registers: here an accelerator it has never heard of, with its own builder,
runner and design space, and no CPU or GPU facts anywhere."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import tvm

import probtune
import probtune.plugins
from probtune import InstructionKind, TargetSpec, hookimpl
from probtune.database.database import Database
from probtune.measure import BuildResult, MeasureReference, RunResult
from probtune.plugins import load_registry

KERNEL = Path(probtune.__file__).parent
CPU_WORDS = re.compile(r"avx|x86|cpuinfo|neon|stack_buffer|vector_registers", re.IGNORECASE)
GPU_WORDS = re.compile(r"cuda|cupy|cubin|wmma|nvrtc|threadidx", re.IGNORECASE)  # probtune-cuda's, not the kernel's


def _stream(sch, inputs, attrs) -> None:
    sch.annotate(inputs[0], "accel.stream", attrs["depth"])


STREAM = InstructionKind("accel_stream", _stream)
"""An instruction of the accelerator's own: its DMA streams a loop's data ``depth`` iterations ahead."""


class TileEveryLoop:
    """The accelerator's whole design space: each loop of a block split in two by a sampled perfect tile.

    The outer loop of the first is streamed, through the plugin's own instruction.
    """

    name = "accel-tile"

    def apply(self, sch, block, ctx) -> None:
        for index, loop in enumerate(sch.get_loops(block)):
            if (sch.loop_extent(loop) or 1) > 1:
                outer, _ = sch.split(loop, sch.sample_perfect_tile(loop, 2))
                if index == 0:
                    sch.apply(STREAM.name, [outer], {"depth": 2})


class SourceBuilder:
    """The accelerator's toolchain: its "binary" is the program's TVMScript, which its runner reads."""

    name = "accel-builder"

    def __init__(self, timeout: float) -> None:
        self.targets: list[str] = []

    def build(
        self, programs: Sequence[tvm.IRModule | str], target: TargetSpec, workdir: str | os.PathLike[str]
    ) -> Iterator[tuple[int, BuildResult]]:
        self.targets.append(target.name)
        for index, program in enumerate(programs):
            mod = tvm.ir.load_json(program) if isinstance(program, str) else program
            path = Path(workdir) / f"accel-{index}.py"
            path.write_text(mod.script())
            yield index, BuildResult(str(path), None, 0.0)

    def close(self) -> None:
        pass


class ModelRunner:
    """The accelerator's timer: a latency from the program text alone, the same on every call."""

    name = "accel-runner"

    def __init__(self, timeout: float) -> None:
        pass

    def run(
        self,
        reference: MeasureReference,
        artifacts: Sequence[str | BuildResult | None],
        target: TargetSpec,
        *,
        stop_above: float | None = None,
    ) -> Iterator[tuple[int, RunResult]]:
        assert Path(reference.path).is_file()  # the kernel saved the reference for it
        for index, item in enumerate(artifacts):
            path = item.artifact if isinstance(item, BuildResult) else item
            if path is None:
                yield index, RunResult("build_error", (), "not built", 0.0)
                continue
            digest = hashlib.sha256(Path(path).read_bytes()).digest()
            yield index, RunResult("ok", (1e-4 * (1 + digest[0]),), None, 0.0)

    def device_name(self, target: TargetSpec) -> str:
        return "accel-board-7"

    def close(self) -> None:
        pass


class AcceleratorPlugin:
    __name__ = "accel"

    @hookimpl
    def probtune_register_targets(self, register):
        register(TargetSpec(
            name="accel", description="an accelerator the kernel knows nothing about",
            tvm_target={"kind": "ext_dev"}, modules=("accel-tile",), mutators={"tile_size": 1.0},
            builder="accel-builder", runner="accel-runner", attrs={"lanes": 128},
        ))

    @hookimpl
    def probtune_register_instructions(self, register):
        register(STREAM)

    @hookimpl
    def probtune_register_space_modules(self, register):
        register(TileEveryLoop())

    @hookimpl
    def probtune_register_builders(self, register):
        register("accel-builder", SourceBuilder)

    @hookimpl
    def probtune_register_runners(self, register):
        register("accel-runner", ModelRunner)


@pytest.fixture
def accelerator(monkeypatch):
    monkeypatch.setattr(probtune.plugins, "_registry", load_registry(extra_plugins=[AcceleratorPlugin()]))


def test_a_target_registered_by_a_plugin_tunes_through_its_own_builder_and_runner(accelerator, tmp_path):
    db = tmp_path / "accel.db"
    result = probtune.tune("matmul", target="accel", trials=24, shape=(32, 32, 32), database=db, seed=0, confirm=0)
    assert result.measured == 24 and result.statuses == {"ok": 24}
    assert result.measured_on == "accel@accel-board-7"  # the target, and the device the runner names
    assert result.best is not None and result.best.target == result.measured_on
    with Database(db) as database:
        [workload] = database.workloads()
        records = database.records(workload.id)
    assert len(records) == 24 and {(r.status, r.target) for r in records} == {("ok", result.measured_on)}
    assert len({r.decision_hash for r in records}) == 24  # every trial a new program of the accelerator's space
    assert result.best_latency == min(r.mean_latency for r in records)
    best = result.schedule().script()
    assert "T.ceildiv" not in best  # perfect tiles: the best program replays
    assert '"accel.stream": 2' in best  # with the plugin's own instruction


def _kernel_lines(words: re.Pattern[str]) -> list[str]:
    """The lines of the kernel's sources (and stubs) where one of ``words`` occurs."""
    return [
        f"{path.relative_to(KERNEL)}:{number}: {line.strip()}"
        for path in sorted(KERNEL.rglob("*.py*"))
        if path.suffix in (".py", ".pyi")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if words.search(line)
    ]


def test_the_kernel_holds_no_cpu_facts():
    assert _kernel_lines(CPU_WORDS) == []


def test_the_kernel_names_no_gpu_toolchain_launcher_or_feature():
    """A CUDA launcher, GPU feature columns and CUDA wheels belong to probtune-cuda (bundle runtime, feature extractor)."""
    assert _kernel_lines(GPU_WORDS) == []
