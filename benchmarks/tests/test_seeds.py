"""benchmarks.seeds: a command run per seed, its metrics aggregated (checked by hand), resumable."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks import seeds

# A stand-in training script, in sh (a Python one would cost an interpreter start-up per seed): writes metrics
# that depend on the seed ($1) into the output folder ($2), and counts its own runs there.
FAKE_RUN = (
    'runs=$(cat "$out/runs.txt" 2>/dev/null || echo 0); echo $((runs + 1)) > "$out/runs.txt"; '
    '[ "$seed" = 13 ] && exit 3; '
    'accuracy=$(awk "BEGIN { print 0.5 + $seed / 10 }"); loss=$(awk "BEGIN { print 2.0 - $seed / 4 }"); '
    """printf '{"eval_accuracy": %s, "eval_loss": %s, "epoch": 1.0, "note": "text is ignored"}' """
    '"$accuracy" "$loss" > "$out/all_results.json"'
)
COMMAND = ["--", "sh", "-c", "seed=$1 out=$2; " + FAKE_RUN, "sh", "{seed}", "{output_dir}"]


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
        seeds.main(["--seeds", "0", "--out", str(tmp_path), "--", "sh", "-c", "true", "{seed}"])


def test_an_interrupted_seed_continues_from_its_checkpoint(tmp_path):
    (tmp_path / "seed_2" / "checkpoint-500").mkdir(parents=True)  # killed after a checkpoint, no results
    log_args = 'seed=$1 out=$2; shift 2; printf %s "$*" > "$out/args.txt"; '  # the arguments after the two
    command = ["--", "sh", "-c", log_args + FAKE_RUN, "sh", "{seed}", "{output_dir}"]
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


def test_in_process_runs_each_seeds_python_command_here(tmp_path, monkeypatch):
    """--in_process: the seed's Python command runs in this process (no subprocess at all), with its argv,
    its output in the seed's log; a command of another program is refused."""
    script = tmp_path / "train.py"
    script.write_text(
        "import json, sys\nseed, out = sys.argv[1:]\nprint('training seed', seed)\n"
        "open(f'{out}/all_results.json', 'w').write(json.dumps({'eval_accuracy': 0.5 + int(seed) / 10}))\n"
    )
    monkeypatch.setattr(seeds.subprocess, "run", lambda *a, **k: pytest.fail("a subprocess was started"))
    command = ["--", ".venv/bin/python", str(script), "{seed}", "{output_dir}"]
    results = seeds.main(["--seeds", "0", "2", "--out", str(tmp_path / "runs"), "--in_process", *command])
    assert results["aggregate"]["eval_accuracy"]["mean"] == pytest.approx(0.6)
    assert (tmp_path / "runs" / "seed_2" / "log.txt").read_text() == "training seed 2\n"
    with pytest.raises(SystemExit, match="--in_process runs Python commands only, not sh"):
        seeds.main(["--seeds", "0", "--out", str(tmp_path / "sh"), "--in_process", *COMMAND])
