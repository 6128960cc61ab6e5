"""Run a benchmark's command line the way its docs say: ``python -m benchmarks.<name>`` from the repository
root, in a fresh process."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_module(name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m benchmarks.<name> args``; raises if it fails (its stderr in the exception)."""
    cmd = [sys.executable, "-m", f"benchmarks.{name}", *args]
    return subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True, timeout=timeout)
