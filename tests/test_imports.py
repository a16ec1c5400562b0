"""probtune's modules import each other without cycles, counting imports for type checkers and inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

import probtune

PACKAGE = Path(probtune.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Each module of the package, and the package's modules it imports anywhere in its source."""
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    targets.add(submodule if submodule in modules else node.module)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def _cycle_from(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    """A path of imports from ``start`` back to it, if there is one."""
    stack, seen = [(start, [start])], set()
    while stack:
        module, path = stack.pop()
        for target in sorted(graph[module]):
            if target == start:
                return [*path, start]
            if target not in seen:
                seen.add(target)
                stack.append((target, [*path, target]))
    return None


def test_no_module_of_probtune_imports_itself_through_others():
    graph = _import_graph()
    assert "probtune.measure.results" in graph and graph["probtune.interfaces"]  # the graph is really read
    cycles = [cycle for module in sorted(graph) if (cycle := _cycle_from(module, graph))]
    assert not cycles, f"import cycle: {' -> '.join(cycles[0])}"
