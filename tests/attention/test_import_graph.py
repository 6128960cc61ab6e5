"""Imports inside hf_efficient/attention/ run one way: no module imports, at the top or inside a function, a
module that imports it back (directly or through others). Imports only a type checker follows
(``if TYPE_CHECKING:``) are left out: they never run."""

import ast
from pathlib import Path

import hf_efficient.attention

ROOT = Path(hf_efficient.attention.__file__).parent  # hf_efficient/attention
# shared by modules that must not import each other
LEAVES = ("attention._catalog", "attention._kernel_state")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(node: ast.AST):
    """The ImportFrom nodes under ``node`` that run: everything but the bodies of ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            children = child.orelse
        else:
            children = [child]
        for statement in children:
            if isinstance(statement, ast.ImportFrom):
                yield statement
            yield from _runtime_imports(statement)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the package modules it imports (relative imports; ``from . import x`` names module x)."""
    paths = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets = set()
        for node in _runtime_imports(ast.parse(path.read_text())):
            if not node.level:
                continue
            base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base)
        graph[name] = {t for t in targets if t in paths and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` as [a, b, ..., a], or None."""
    done, path = set(), []

    def visit(node):
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        path.append(node)
        for target in sorted(graph[node]):
            if cycle := visit(target):
                return cycle
        path.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        if cycle := visit(node):
            return cycle
    return None


def test_the_finder_sees_a_circle_through_a_function_level_import(tmp_path):
    package = tmp_path / "attention"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import f\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n"
        "def f():\n    from .a import g\n"
    )
    (package / "c.py").write_text("from .b import f\n")
    graph = import_graph(package)
    assert graph["attention.b"] == {"attention.a"}  # the TYPE_CHECKING import is not followed
    assert find_cycle(graph) == ["attention.a", "attention.b", "attention.a"]


def test_no_import_circle_in_attention():
    graph = import_graph()
    assert "attention.kernels.kernelized" in graph and "attention._kernelized" in graph
    assert find_cycle(graph) is None


def test_the_leaves_import_nothing_of_the_package():
    graph = import_graph()
    assert {leaf: graph[leaf] for leaf in LEAVES} == {leaf: set() for leaf in LEAVES}
    assert "attention._kernel_state" in graph["attention.kernels.kernelized"]
    assert "attention._kernel_state" in graph["attention.kernels.kernelized_parallel"]
