"""The lab's training programs answer a user error (an unknown flag, a bad value, a missing file) as the
scripts do (tests/scripts/test_error_convention.py): one ``error: ...`` line on stderr, exit status 2, no
traceback."""

from __future__ import annotations

import pytest

from benchmarks.tasks import train_listops, train_mqar
from tests.scripts.helpers import check_user_error, training_script_errors

CASES = training_script_errors([])


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("program", [train_listops, train_mqar], ids=lambda module: module.__name__)
def test_a_user_error_is_one_line_and_status_2(program, case, tmp_path, capsys):
    assert "run_script(main)" in open(program.__file__).read()
    check_user_error(program.main, *CASES[case], tmp_path, capsys)
