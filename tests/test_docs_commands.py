"""tests/docs_commands.py: a documented command line run in this process as bash and python would run it:
variables and command substitution, environment prefixes, Python programs only, the exit status, and the two
rules of the docs tests (``--in_process`` wherever a parser offers it, no interpreter of our stack)."""

from __future__ import annotations

import os

import pytest

from .docs_commands import CommandFailed, Shell

PRINT_ARGV = 'python -c "import sys; print(sys.argv[1:])"'


def test_variables_substitutions_and_environment_prefixes():
    shell = Shell()
    assert shell.run("MODEL=$(.venv/bin/python -c \"print('runs/model')\")") == ""
    shell.run("DATA=runs/data")
    printed = shell.run(f"{PRINT_ARGV} $MODEL ${{DATA}}/train.csv '{{\"k\": 1}}'")
    assert printed == "['runs/model', 'runs/data/train.csv', '{\"k\": 1}']\n"
    threads = "import os; print(os.environ['OMP_NUM_THREADS'])"
    assert shell.run(f'OMP_NUM_THREADS=3 python -c "{threads}"') == "3\n"
    assert os.environ.get("OMP_NUM_THREADS") != "3"  # the prefix is the command's only
    with pytest.raises(KeyError, match=r"\$NOPE is not set"):
        shell.run(f"{PRINT_ARGV} $NOPE")


def test_only_python_runs_here_and_a_failure_shows_its_output():
    with pytest.raises(ValueError, match="mark this block run-by"):
        Shell().run(".venv/bin/accelerate launch scripts/finetune_glue.py")
    with pytest.raises(CommandFailed, match=r"exit status 2; its output ends:\nbad flag"):
        Shell().run("python -c \"import sys; print('bad flag'); sys.exit(2)\"")


def test_parsers_offering_in_process_get_it_and_no_interpreter_of_our_stack_starts():
    parse = "import argparse; p = argparse.ArgumentParser(); p.add_argument('--{}', action='store_true')"
    assert Shell().run(f'python -c "{parse.format("in_process")}; print(p.parse_args([]).in_process)"') == (
        "True\n"
    )
    assert Shell().run(f'python -c "{parse.format("other")}; print(vars(p.parse_args([])))"') == (
        "{'other': False}\n"
    )
    start = "import subprocess, sys; subprocess.run([sys.executable, '-m', 'benchmarks.attention'])"
    with pytest.raises(AssertionError, match="started an interpreter .* run it in-process"):
        Shell().run(f'python -c "{start}"')
