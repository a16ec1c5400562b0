"""The plugin kernel: entry points, a third-party distribution, broken plugins, allow/block lists."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from probtune.plugins import load_registry

THIRD_PARTY = {
    "probtune-hello": (
        "hello",
        """
        from probtune import TargetSpec, hookimpl

        class Noop:
            name = "hello-noop"
            def apply(self, sch, block, ctx):
                pass

        @hookimpl
        def probtune_register_space_modules(register):
            register(Noop())

        @hookimpl
        def probtune_register_targets(register):
            register(TargetSpec(name="hello-cpu", description="a third party's target",
                                tvm_target={"kind": "llvm"}, modules=("hello-noop",)))
        """,
    ),
    "probtune-broken": ("broken", "raise RuntimeError('this plugin is broken on purpose')\n"),
}


def _write_distribution(root: Path, dist: str, entry: str, source: str) -> Path:
    package = dist.replace("-", "_")
    project = root / dist
    (project / package).mkdir(parents=True)
    (project / package / "__init__.py").write_text(textwrap.dedent(source))
    (project / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [build-system]
            requires = ["setuptools>=68"]
            build-backend = "setuptools.build_meta"
            [project]
            name = "{dist}"
            version = "1.2.3"
            [project.entry-points.probtune]
            {entry} = "{package}"
            [tool.setuptools]
            packages = ["{package}"]
            """
        )
    )
    return project


@pytest.fixture(scope="module")
def third_party_site(tmp_path_factory) -> Path:
    """A directory with the third-party distributions pip-installed into it (the venv stays untouched)."""
    root = tmp_path_factory.mktemp("plugins")
    site = root / "site"
    projects = [_write_distribution(root, dist, entry, src) for dist, (entry, src) in THIRD_PARTY.items()]
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(site), *map(str, projects)],
        check=True,
    )
    return site


def _probtune(site: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(site), **env}
    for name in ("PROBTUNE_LOAD_PLUGINS", "PROBTUNE_BLOCK_PLUGINS"):
        if name not in env:
            environment.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "probtune.cli", *args], capture_output=True, text=True, env=environment, timeout=120
    )


def test_builtin_plugins_register_through_entry_points():
    registry = load_registry()
    assert registry.plugins["cpu"].distribution == "probtune-cpu"
    assert registry.plugins["x86"].distribution == "probtune-x86"
    assert {"multi-level-tiling", "parallel-vectorize"} <= set(registry.space_modules)
    assert {"x86-avx512", "x86-avx2", "llvm", "host"} <= set(registry.targets)
    assert "matmul" in registry.workloads and "local" in registry.runners and "local" in registry.builders


def test_third_party_plugin_is_picked_up_and_broken_one_named(third_party_site):
    done = _probtune(third_party_site, "plugins")
    assert done.returncode == 0, done.stderr
    assert "hello  (probtune-hello 1.2.3)" in done.stdout
    assert "space_modules: hello-noop" in done.stdout and "targets: hello-cpu" in done.stdout
    # the broken plugin is named, with its error, and everything else still loads
    assert "'broken'" in done.stderr and "broken on purpose" in done.stderr
    assert "FAILED" in done.stdout
    assert "cpu  (probtune-cpu" in done.stdout and "x86  (probtune-x86" in done.stdout

    targets = _probtune(third_party_site, "targets")
    assert "hello-cpu" in targets.stdout and "x86-avx2" in targets.stdout


def test_block_list_skips_a_plugin(third_party_site):
    done = _probtune(third_party_site, "plugins", PROBTUNE_BLOCK_PLUGINS="broken,hello")
    assert done.returncode == 0
    assert "broken" not in done.stderr and "hello" not in done.stdout
    assert "cpu  (probtune-cpu" in done.stdout


def test_allow_list_loads_only_named_plugins(third_party_site):
    done = _probtune(third_party_site, "plugins", PROBTUNE_LOAD_PLUGINS="hello")
    assert "hello  (probtune-hello" in done.stdout
    assert "probtune-cpu" not in done.stdout and "broken" not in done.stderr
    none = _probtune(third_party_site, "plugins", PROBTUNE_LOAD_PLUGINS="")
    assert "probtune-x86" not in none.stdout and "probtune.builtin" in none.stdout


def test_plugin_that_raises_while_registering_is_reported(monkeypatch):
    from probtune import hookimpl

    class Faulty:
        __name__ = "faulty"

        @hookimpl
        def probtune_register_targets(self, register):
            raise ValueError("no targets today")

    monkeypatch.setenv("PROBTUNE_LOAD_PLUGINS", "x86,cpu")
    with pytest.warns(UserWarning, match="'faulty' failed to run probtune_register_targets.*no targets today"):
        registry = load_registry(extra_plugins=[Faulty()])
    assert "host" in registry.targets
    assert "no targets today" in registry.plugins["faulty"].error


def test_conflicting_registration_is_reported(monkeypatch):
    from probtune import TargetSpec, hookimpl

    class Clash:
        __name__ = "clash"

        @hookimpl
        def probtune_register_targets(self, register):
            register(TargetSpec("host", "dup", {"kind": "llvm"}, ()))

    monkeypatch.setenv("PROBTUNE_LOAD_PLUGINS", "x86,cpu")
    with pytest.warns(UserWarning, match="'clash'.*already registered by plugin 'x86'"):
        load_registry(extra_plugins=[Clash()])


def test_a_plugin_adds_instruction_kinds_but_not_over_the_language_s(monkeypatch):
    from probtune import hookimpl
    from probtune.schedule.schedule import PRIMITIVES, InstructionKind

    def noop(sch, inputs, attrs):
        return None

    class Kinds:
        __name__ = "kinds"

        @hookimpl
        def probtune_register_instructions(self, register):
            register(InstructionKind("noop", noop))

    class Shadow:
        __name__ = "shadow"

        @hookimpl
        def probtune_register_instructions(self, register):
            register(InstructionKind("split", noop))

    class Sampler:
        __name__ = "sampler"

        @hookimpl
        def probtune_register_instructions(self, register):
            register(InstructionKind("sample_categorical", noop))

    monkeypatch.setenv("PROBTUNE_LOAD_PLUGINS", "")
    with pytest.warns(UserWarning) as caught:
        registry = load_registry(extra_plugins=[Kinds(), Shadow(), Sampler()])
    messages = [str(w.message) for w in caught]
    assert any("'shadow'" in m and "instruction 'split' is already registered by plugin 'probtune.builtin'" in m
               for m in messages)
    assert any("'sampler'" in m and "'sample_categorical' is a name the kernel keeps" in m for m in messages)
    assert registry.instructions["noop"].name == "noop" and registry.instructions["split"] is PRIMITIVES["split"]
    assert registry.plugins["kinds"].registered == {"instructions": ["noop"]}
    assert set(registry.plugins["probtune.builtin"].registered["instructions"]) == set(PRIMITIVES)


def test_a_bundle_runtime_and_a_feature_extractor_register_by_name_but_not_as_the_kernels_tvm(monkeypatch):
    from probtune import hookimpl

    class Runtime:
        def __init__(self, name):
            self.name, self.kinds, self.source = name, ("code",), __file__

    class Extractor:
        name, columns = "size", ("elements",)

        def extract(self, func):
            return [1.0]

    class Both:
        __name__ = "both"

        @hookimpl
        def probtune_register_bundle_runtimes(self, register):
            register(Runtime("mine"))

        @hookimpl
        def probtune_register_feature_extractors(self, register):
            register(Extractor())

    class Usurper:
        __name__ = "usurper"

        @hookimpl
        def probtune_register_bundle_runtimes(self, register):
            register(Runtime("tvm"))

    monkeypatch.setenv("PROBTUNE_LOAD_PLUGINS", "")
    with pytest.warns(UserWarning, match="'usurper'.*bundle_runtime 'tvm' is a name the kernel keeps"):
        registry = load_registry(extra_plugins=[Both(), Usurper()])
    assert set(registry.bundle_runtimes) == {"mine"} and set(registry.feature_extractors) == {"size"}
    assert registry.plugins["both"].registered == {"bundle_runtimes": ["mine"], "feature_extractors": ["size"]}
