"""hf_efficient.in_process: a Python command line run in this process as ``python`` would run it: the script
or module as ``__main__``, ``sys.argv`` as Python sets it, ``SystemExit`` as the exit status."""

from __future__ import annotations

import sys

import pytest

from hf_efficient.in_process import is_python, run_python_command

REPORT = "import sys\nprint(__name__, sys.argv)\n"


def test_a_script_runs_as_main_with_its_argv(tmp_path, capsys):
    script = tmp_path / "job.py"
    script.write_text(REPORT + "raise SystemExit(3)\n")
    assert run_python_command([str(script), "--flag", "a b"]) == 3
    assert capsys.readouterr().out == f"__main__ {[str(script), '--flag', 'a b']}\n"
    assert sys.argv[0] != str(script)  # put back


def test_a_module_runs_as_main_with_its_path_as_argv0(tmp_path, capsys, monkeypatch):
    (tmp_path / "job_module.py").write_text(REPORT)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert run_python_command(["-m", "job_module", "x"]) == 0
    assert capsys.readouterr().out == f"__main__ {[str(tmp_path / 'job_module.py'), 'x']}\n"


def test_code_with_arguments_and_the_exit_statuses(capsys):
    assert run_python_command(["-c", REPORT, "x"]) == 0
    assert capsys.readouterr().out == "__main__ ['-c', 'x']\n"
    assert run_python_command(["-c", "raise SystemExit('no data')"]) == 1  # a message: status 1, printed
    assert capsys.readouterr().err == "no data\n"
    assert run_python_command(["-c", "raise SystemExit(None)"]) == 0
    with pytest.raises(ZeroDivisionError):  # a fault: its traceback is the caller's to show
        run_python_command(["-c", "1 / 0"])


def test_interpreter_options_are_refused_and_interpreters_recognised():
    with pytest.raises(ValueError, match="python -u: interpreter options"):
        run_python_command(["-u", "job.py"])
    assert is_python(".venv/bin/python") and is_python("python3") and is_python(sys.executable)
    assert not is_python(".venv/bin/accelerate") and not is_python("benchmarks/gpu_check.sh")
