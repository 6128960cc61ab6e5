"""A Python command line run in the calling process, as ``python`` runs it: ``python script.py args``,
``python -m module args`` or ``python -c code args``, with ``sys.argv`` as Python sets it, the script or
module run as ``__main__`` (its ``if __name__ == "__main__":`` block included) and its ``SystemExit`` turned
into an exit status.

What the tests of the documented commands run them with (no interpreter start, no second import of torch),
and what the lab's ``--in_process`` options run a training command with. Not a fresh interpreter: modules
stay imported between commands, so a command that forgets an import of its own passes here (the README's
quick start also runs in a fresh interpreter for that reason).
"""

from __future__ import annotations

import builtins
import os
import runpy
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from unittest import mock

# A command is a Python command line when its program is one of these (a path to one, e.g. .venv/bin/python).
PYTHON_NAMES = ("python", "python3", Path(sys.executable).name)


def is_python(program: str) -> bool:
    """Whether ``program`` (a command's first word) names a Python interpreter."""
    return Path(program).name in PYTHON_NAMES


def exit_status(code) -> int:
    """The status an interpreter exits with after ``SystemExit(code)`` (a message: 1, printed)."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def run_python_command(args: Sequence[str]) -> int:
    """Run ``python *args`` in this process; returns its exit status. ``args``: ``["-m", module, ...]``,
    ``["-c", code, ...]`` or ``[script, ...]`` (interpreter options are refused: they change the interpreter).
    An exception the command raises propagates (its traceback is the test's)."""
    first, rest = args[0], list(args[1:])
    if first.startswith("-") and first not in ("-m", "-c"):
        raise ValueError(f"python {first}: interpreter options cannot apply to this process")
    try:
        if first == "-m":
            # as python -m: argv[0] becomes the module's path; the module may already be imported (by an
            # earlier command), which runpy warns about and which does not change what runs
            with mock.patch.object(sys, "argv", [rest[0], *rest[1:]]), warnings.catch_warnings():
                warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
                runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
        elif first == "-c":
            with mock.patch.object(sys, "argv", ["-c", *rest[1:]]):
                exec(compile(rest[0], "<string>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
        else:
            with mock.patch.object(sys, "argv", [first, *rest]):
                runpy.run_path(os.fspath(first), run_name="__main__")
    except SystemExit as exit_:
        return exit_status(exit_.code)
    return 0
