"""Packaging: the wheel, built offline from the sources, holds the files the package reads by path (the model
card templates, the ``evaluate`` metric modules), and an install of it finds them, away from the repository;
the editable install (``make install``) builds without setuptools' warnings."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .docs_blocks import page_blocks
from .processes import ROOT, child_env, run_python

# What the package reads by path at run time (package data in pyproject.toml), as paths inside the wheel.
DATA_FILES = (
    "hf_efficient/training/model_cards/efficient_bert_template.md",
    "hf_efficient/training/model_cards/efficient_vit_template.md",
    "hf_efficient/training/model_cards/efficient_graph_template.md",
    "hf_efficient/training/metric_modules/accuracy.py",
)

FROM_THE_WHEEL = """
import sys
from pathlib import Path

import evaluate

import hf_efficient
from hf_efficient import EfficientBertConfig, EfficientBertForMaskedLM
from hf_efficient.training import build_model_card, metric_path
from hf_efficient.training.model_card import TEMPLATE_PATHS

installed = Path(sys.argv[1]).resolve()
assert Path(hf_efficient.__file__).resolve().is_relative_to(installed), hf_efficient.__file__
assert all(path.resolve().is_relative_to(installed) for path in TEMPLATE_PATHS.values()), TEMPLATE_PATHS
config = EfficientBertConfig(
    vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
    attention_type="longformer", attention_config={"attention_window": 4},
)
model = EfficientBertForMaskedLM(config)
card = str(build_model_card(model, summary="A wheel test.", data_description="No data."))
assert "A wheel test." in card and "Beltagy et al. 2020" in card and "pipeline_tag: fill-mask" in card, card
accuracy = evaluate.load(metric_path("accuracy"))
assert accuracy.compute(predictions=[1, 0], references=[1, 1]) == {"accuracy": 0.5}
"""


def build(command: list[str], cwd) -> subprocess.CompletedProcess:
    """Run a build ``command`` offline in ``cwd``; fail with its output if it fails."""
    result = subprocess.run(command, cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture
def source(tmp_path):
    """A copy of what the package is built from, so that builds leave nothing in the repository."""
    copy = tmp_path / "source"
    copy.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, copy / name)
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "hf_efficient", copy / "hf_efficient", ignore=ignore)
    return copy


@pytest.mark.slow  # builds a wheel, then a fresh interpreter
def test_the_wheel_ships_and_finds_the_card_templates_and_metric_modules(source, tmp_path):
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    build([*command, "--wheel-dir", str(tmp_path / "dist"), str(source)], cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("hf_efficient-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert [name for name in DATA_FILES if name not in archive.namelist()] == []
        archive.extractall(tmp_path / "installed")
    # The unpacked wheel first on the path, run from elsewhere: the repository's copy is not what loads.
    installed = tmp_path / "installed"
    run_python(FROM_THE_WHEEL, installed, env={"PYTHONPATH": str(installed)}, cwd=tmp_path)


EDITABLE_BUILD = "import sys; from setuptools import build_meta; build_meta.build_editable(sys.argv[1])"


@pytest.mark.slow  # a fresh interpreter runs the build backend
def test_the_editable_build_prints_no_setuptools_warning(source, tmp_path):
    """What ``pip install -e .`` (``make install``) runs, the build backend's ``build_editable``: with the
    package's folder declared as the root of the import path (``package-dir``), setuptools installs a plain
    ``.pth`` file, not its import finder with the "Editable installation" warning (pip shows it as a
    BuildBackendWarning) about folders of the working directory that may shadow the package."""
    result = build([sys.executable, "-c", EDITABLE_BUILD, str(tmp_path / "editable")], cwd=source)
    assert "Editable installation" not in result.stderr and "Warning" not in result.stderr, result.stderr
    (wheel,) = (tmp_path / "editable").glob("hf_efficient-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (pth,) = [name for name in archive.namelist() if name.endswith(".pth")]
        assert archive.read(pth).decode().strip() == str(source)  # the package's folder on the path


def _name(requirement: str) -> str:
    return canonicalize_name(Requirement(requirement).name)


def _applies(requirement: str) -> bool:
    """A requirement that applies here without an extra (not Windows-only, not ``extra == ...``)."""
    marker = Requirement(requirement).marker
    return marker is None or marker.evaluate({"extra": ""})


def test_the_readme_install_line_installs_what_the_quick_start_imports():
    """The README's install line without make (torch, then the package with the extras it names) provides
    every module its python blocks import, directly or through a dependency of what it installs."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    readme = (ROOT / "README.md").read_text()
    extras = re.search(r'`pip install -e "\.\[([\w,]+)\]"`', readme)
    assert extras, 'README.md has no `pip install -e ".[...]"` line'
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    wanted, todo = {"torch"}, list(project["dependencies"])
    for extra in extras.group(1).split(","):
        todo += optional[extra]
    while todo:  # the line's requirements and theirs, as installed here
        name = _name(todo.pop())
        if name == "hf-efficient":
            continue
        if name not in wanted:
            wanted.add(name)
            todo += [r for r in importlib.metadata.requires(name) or [] if _applies(r)]
    modules = set()
    for block in page_blocks(ROOT / "README.md"):
        if block.language == "python":
            for node in ast.walk(ast.parse(block.code)):
                if isinstance(node, ast.Import):
                    modules |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    modules.add(node.module.split(".")[0])
    providers = importlib.metadata.packages_distributions()
    modules -= {*sys.stdlib_module_names, "hf_efficient"}
    missing = {m: providers.get(m) for m in modules if not {_name(d) for d in providers.get(m, [])} & wanted}
    assert missing == {}, f"{extras.group(0)} does not install these imports of README.md's python blocks"
