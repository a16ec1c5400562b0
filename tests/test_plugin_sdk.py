"""The plugin SDK: ``probtune.plugin`` is the one kernel module the built-in plugins import."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import probtune.plugin as sdk

PLUGIN_SOURCES = sorted((Path(__file__).parent.parent / "plugins").glob("*/src/**/*.py"))


def _imports(path: Path) -> list[str]:
    """The absolute modules ``path`` imports, wherever the import statement is."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


def _kernel_imports(path: Path) -> list[str]:
    """The kernel modules ``path`` imports (``probtune`` and its submodules; plugins' own packages are not the kernel)."""
    return [name for name in _imports(path) if name == "probtune" or name.startswith("probtune.")]


def test_the_built_in_plugins_import_nothing_of_the_kernel_but_the_sdk():
    assert len(PLUGIN_SOURCES) > 20
    elsewhere = {str(path): modules for path in PLUGIN_SOURCES if (modules := set(_kernel_imports(path)) - {"probtune.plugin"})}
    assert elsewhere == {}


def test_the_import_check_sees_every_form_of_import(tmp_path):
    source = tmp_path / "module.py"
    source.write_text("import probtune.schedule.analysis\nfrom probtune import hookimpl\nfrom probtune_cpu import codegen\n"
                      "def f():\n    from probtune.schedule.schedule import Schedule\n")
    assert _kernel_imports(source) == ["probtune.schedule.analysis", "probtune", "probtune.schedule.schedule"]


@pytest.mark.parametrize("name", sdk.__all__)
def test_each_name_is_the_kernels_own_object(name):
    module = importlib.import_module(sdk._SOURCE_OF[name])
    assert getattr(sdk, name) is getattr(module, name)


def test_the_sdk_lists_what_it_exports():
    assert sorted(sdk.__all__) == sorted(sdk._SOURCE_OF) and len(set(sdk.__all__)) == len(sdk.__all__)
    assert "Schedule" in dir(sdk)


def test_the_gpu_plugin_depends_on_the_kernel_only():
    sources = [path for path in PLUGIN_SOURCES if "probtune-cuda" in path.parts]
    assert sources and not [name for path in sources for name in _imports(path) if name.startswith("probtune_cpu")]
