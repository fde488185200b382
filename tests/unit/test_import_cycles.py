"""No import circles in our packages, function-level imports included: a circle hidden inside a function still
ties the modules together (and breaks as soon as someone moves the import up)."""

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports anywhere in its body (`from . import x` is x when x is a
    module, else the package itself)."""
    files = {module_name(root, p): p for p in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        here = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = (".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
                        if node.level else node.module or "")
                for alias in node.names:
                    deps.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base)
        graph[mod] = {d for d in deps if d in files and d != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in graph:
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("root,package", [("operator", "finetune_operator"), ("trainer_image", "finetune_trainer")])
def test_no_import_circles(root, package):
    graph = imports(ROOT / root, package)
    assert len(graph) > 20  # the packages were read
    assert cycles(graph) == []


def test_a_circle_through_a_function_level_import_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
