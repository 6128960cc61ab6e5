"""A documented command line run in this process, as bash and then python would run it for a user.

The docs' bash blocks hold Python commands (``.venv/bin/python scripts/finetune_glue.py ...``, ``python -m
benchmarks.attention ...``, ``python -c "..."``), environment prefixes (``OMP_NUM_THREADS=1 python ...``)
and shell variables (``MINILM=$(python -c "...")``, then ``$MINILM``). :class:`Shell` reads exactly that:
each command's words as bash splits them, ``$NAME`` / ``${NAME}`` from the variables set earlier in the same
shell, and its program must be a Python interpreter, which runs in this process
(:func:`hf_efficient.in_process.run_python_command`: the script or module as ``__main__``, ``sys.argv`` as
Python sets it). A command a test process cannot run (``accelerate launch``, a shell script, ``make``)
raises, naming the marker that fits: ``run-by`` the test that runs it, or ``skip``.

Two things differ from a fresh interpreter, and the docs tests make up for both. Each command's parsers that
offer ``--in_process`` (the lab's harness-based benchmarks, its seeds runner and the studies over it) get it,
so their points and seeds run here too. And no documented command may start an interpreter that imports
torch or this package (tests/processes.py): what such a command runs would not be what the test measured.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from unittest import mock

from hf_efficient.in_process import is_python, run_python_command

from .processes import starts_our_stack

ASSIGNMENT = re.compile(r"^(?P<name>[A-Za-z_]\w*)=(?P<value>\S*)$")  # NAME=value
# NAME=$(command): the command's output, the final newline cut
SUBSTITUTION = re.compile(r"^(?P<name>[A-Za-z_]\w*)=\$\((?P<command>.+)\)$")
VARIABLE = re.compile(r"\$(?:\{(?P<braced>\w+)\}|(?P<name>\w+))")
IN_PROCESS = "--in_process"


class CommandFailed(AssertionError):
    """A documented command exited with a status other than 0."""


@dataclass
class Shell:
    """One bash shell of a docs block: its variables live from one command to the next."""

    variables: dict[str, str] = field(default_factory=dict)

    def expand(self, text: str) -> str:
        """``text`` with ``$NAME`` and ``${NAME}`` replaced (a variable the shell never set raises)."""

        def value(match: re.Match) -> str:
            name = match.group("braced") or match.group("name")
            if name not in self.variables:
                raise KeyError(f"${name} is not set in this block (the docs' blocks set what they use)")
            return self.variables[name]

        return VARIABLE.sub(value, text)

    def run(self, command: str) -> str:
        """Run one command line; returns what it printed (stdout and stderr). Raises :class:`CommandFailed`
        on a status other than 0."""
        if substitution := SUBSTITUTION.match(command):
            self.variables[substitution.group("name")] = self.run(substitution.group("command")).rstrip("\n")
            return ""
        if assignment := ASSIGNMENT.match(command):
            self.variables[assignment.group("name")] = self.expand(assignment.group("value"))
            return ""
        words = [self.expand(word) for word in shlex.split(command)]
        environment = {}
        while words and ASSIGNMENT.match(words[0]):  # NAME=value before the program: its environment
            name, _, value = words.pop(0).partition("=")
            environment[name] = value
        if not words or not is_python(words[0]):
            raise ValueError(
                f"{command!r}: the docs tests run Python commands in their process; mark this block run-by "
                "(the test that runs it) or skip (why)"
            )
        output = io.StringIO()
        with (
            mock.patch.dict(os.environ, environment),
            contextlib.redirect_stdout(output),
            contextlib.redirect_stderr(output),
            offering_in_process(),
            no_interpreter_of_our_stack(command),
        ):
            status = run_python_command(words[1:])
        if status != 0:
            raise CommandFailed(
                f"{command}\nexit status {status}; its output ends:\n{output.getvalue()[-4000:]}"
            )
        return output.getvalue()


@contextlib.contextmanager
def offering_in_process():
    """Every argument parser that offers ``--in_process`` parses as if the command line gave it."""
    parse_known_args = argparse.ArgumentParser.parse_known_args

    def with_in_process(parser, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        if IN_PROCESS in parser._option_string_actions and IN_PROCESS not in args:
            args.append(IN_PROCESS)
        return parse_known_args(parser, args, namespace)

    with mock.patch.object(argparse.ArgumentParser, "parse_known_args", with_in_process):
        yield


@contextlib.contextmanager
def no_interpreter_of_our_stack(command: str):
    """A documented command that starts a Python interpreter importing torch or this package fails."""
    popen = subprocess.Popen.__init__

    def refuse(self, args, *rest, **kwargs):
        if starts_our_stack(args):
            raise AssertionError(f"{command!r} started an interpreter ({args}): run it in-process")
        popen(self, args, *rest, **kwargs)

    with mock.patch.object(subprocess.Popen, "__init__", refuse):
        yield
