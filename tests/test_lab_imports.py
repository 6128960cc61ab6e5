"""The lab (benchmarks/: studies, research tasks, benchmarks, their results) depends on hf_efficient, never
the other way round: no module of the package, of scripts/ or of the library's tests imports it, at the top
or inside a function (imports only a type checker follows, under ``if TYPE_CHECKING:``, included: they would
still tie the package to the lab)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAB = "benchmarks"
WITHOUT_THE_LAB = ("hf_efficient", "scripts", "tests")


def imported_modules(path: Path) -> set[str]:
    """The absolute module names ``path`` imports (``import a.b``, ``from a.b import c``); relative imports
    stay inside their own package."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
    return names


def lab_imports(folders=WITHOUT_THE_LAB) -> dict[str, list[str]]:
    """{file: the lab modules it imports} for every Python file under ``folders`` that imports one."""
    found = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            lab = sorted(name for name in imported_modules(path) if name.split(".")[0] == LAB)
            if lab:
                found[str(path.relative_to(ROOT))] = lab
    return found


def test_the_library_imports_nothing_from_the_lab():
    assert lab_imports() == {}, "move what both need into hf_efficient, or the importing code into the lab"


def test_the_check_sees_imports_at_the_top_and_inside_functions(tmp_path, monkeypatch):
    """The walk finds both kinds, so an empty result above means something."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "x.py").write_text(
        "import benchmarks.report\n\ndef f():\n    from benchmarks.seeds import main\n"
        "from . import benchmarks_helper\nimport hf_efficient\n"
    )
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert lab_imports(("scripts",)) == {"scripts/x.py": ["benchmarks.report", "benchmarks.seeds"]}
