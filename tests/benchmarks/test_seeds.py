"""benchmarks.seeds: a command run per seed, its metrics aggregated (checked by hand), resumable."""

from __future__ import annotations

import json
import os
import sys

import pytest

from benchmarks import seeds

# A stand-in training script: writes metrics that depend on the seed, and counts its own runs.
FAKE_RUN = (
    "import json, pathlib, sys; seed, out = int(sys.argv[1]), pathlib.Path(sys.argv[2]); "
    "runs = out / 'runs.txt'; runs.write_text(str(int(runs.read_text()) + 1 if runs.exists() else 1)); "
    "sys.exit(3) if seed == 13 else None; "
    "(out / 'all_results.json').write_text(json.dumps({'eval_accuracy': 0.5 + seed / 10, "
    "'eval_loss': 2.0 - seed / 4, 'epoch': 1.0, 'note': 'text is ignored'}))"
)
COMMAND = ["--", sys.executable, "-c", FAKE_RUN, "{seed}", "{output_dir}"]


def test_three_seeds_aggregated_by_hand(tmp_path):
    results = seeds.main(["--seeds", "0", "1", "2", "--out", str(tmp_path), *COMMAND])
    accuracy = results["aggregate"]["eval_accuracy"]
    # 0.5, 0.6, 0.7: mean 0.6, sample std sqrt(((-0.1)^2 + 0 + 0.1^2) / 2) = 0.1
    assert accuracy["mean"] == pytest.approx(0.6) and accuracy["std"] == pytest.approx(0.1)
    assert (accuracy["min"], accuracy["max"], accuracy["n"]) == (pytest.approx(0.5), pytest.approx(0.7), 3)
    loss = results["aggregate"]["eval_loss"]  # 2.0, 1.75, 1.5
    assert loss["mean"] == pytest.approx(1.75) and loss["std"] == pytest.approx(0.25)
    assert "note" not in results["aggregate"]
    saved = json.loads((tmp_path / "seeds.json").read_text())
    assert saved["aggregate"]["eval_accuracy"]["mean"] == pytest.approx(0.6)
    assert saved["cwd"] == os.getcwd()  # where the command's relative paths point
    table = (tmp_path / "seeds.md").read_text()
    assert "| eval_accuracy | 0.6 ± 0.1 | 0.5 | 0.7 | 3 |" in table and "{seed}" in table
    assert seeds.mean_and_spread(accuracy, scale=100) == "60.00 ± 10.00 (3 seeds)"


def test_resumes_only_what_is_missing_and_refuses_another_command(tmp_path):
    seeds.main(["--seeds", "0", "1", "2", "--out", str(tmp_path), *COMMAND])
    (tmp_path / "seed_1" / "all_results.json").unlink()  # as if killed before it finished
    seeds.main(["--seeds", "0", "1", "2", "--out", str(tmp_path), *COMMAND])
    runs = {s: int((tmp_path / f"seed_{s}" / "runs.txt").read_text()) for s in (0, 1, 2)}
    assert runs == {0: 1, 1: 2, 2: 1}
    with pytest.raises(SystemExit, match="another command"):
        seeds.main(["--seeds", "0", "--out", str(tmp_path), "--", sys.executable, "-c", "pass", "{seed}"])


def test_an_interrupted_seed_continues_from_its_checkpoint(tmp_path):
    (tmp_path / "seed_2" / "checkpoint-500").mkdir(parents=True)  # killed after a checkpoint, no results
    log_args = "import sys, pathlib; pathlib.Path(sys.argv[2], 'args.txt').write_text(' '.join(sys.argv[3:]))"
    command = ["--", sys.executable, "-c", log_args + "; " + FAKE_RUN, "{seed}", "{output_dir}"]
    seeds.main(["--seeds", "1", "2", "--out", str(tmp_path), *command])
    assert (tmp_path / "seed_2" / "args.txt").read_text() == "--resume_from_checkpoint last"
    assert (tmp_path / "seed_1" / "args.txt").read_text() == ""  # a fresh seed starts from scratch


def test_a_failed_seed_is_left_out_and_reported(tmp_path):
    with pytest.raises(SystemExit) as stop:
        seeds.main(["--seeds", "1", "13", "--out", str(tmp_path), *COMMAND])
    assert stop.value.code == 1
    saved = json.loads((tmp_path / "seeds.json").read_text())
    assert saved["failed"] == [13] and saved["aggregate"]["eval_accuracy"]["n"] == 1
    assert "Failed (left out): seeds [13]" in (tmp_path / "seeds.md").read_text()


def test_the_command_must_take_the_seed():
    with pytest.raises(SystemExit):
        seeds.parse_args(["--seeds", "0", "--out", "x", "--", "python", "train.py"])


def test_help_needs_no_command(capsys):
    """``python -m benchmarks.seeds --help`` prints the options (it used to stop at the missing '--')."""
    with pytest.raises(SystemExit) as stop:
        seeds.parse_args(["--help"])
    assert stop.value.code == 0 and "--resume_args" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        seeds.parse_args(["--seeds", "0", "--out", "x"])  # no command: still refused
    assert stop.value.code == 2 and "give the training command after '--'" in capsys.readouterr().err
