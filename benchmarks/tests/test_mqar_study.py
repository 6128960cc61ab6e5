"""benchmarks.studies.mqar: the table and plot of fake MQAR results laid out as the grid runner leaves them
(seeds folders per setting), and the grid runner's commands, folders and skipping of finished settings
(benchmarks.seeds replaced by a recorder: no training here; the script itself is tested in
benchmarks/tests/test_train_mqar.py)."""

import json
import sys
from pathlib import Path

import pytest

from benchmarks.studies import mqar


def fake_run(
    root: Path,
    attention_type: str,
    width: int,
    length: int,
    seed: int,
    accuracy: float,
    causal=False,
    learning_rate=None,
    validation=None,
):
    folder = mqar.setting_folder(root, attention_type, width, length, causal, learning_rate) / f"seed_{seed}"
    folder.mkdir(parents=True)
    result = {
        "attention_type": attention_type,
        "formulation": "causal" if causal else "bidirectional",
        "test_accuracy": accuracy,
        "eval_accuracy": validation,
        "hidden_size": width,
        "seq_len": length,
        "num_kv_pairs": length // 16,
        "seconds_per_step": 0.1,
        "training": {"seed": seed, "learning_rate": learning_rate or 1e-3},
        "output_dir": str(folder),
    }
    (folder / mqar.RESULTS_FILE).write_text(json.dumps(result))


def test_summary_table_means_over_seeds_and_plot(tmp_path, capsys):
    for seed, accuracy in enumerate([0.99, 1.0, 0.98]):
        fake_run(tmp_path, "full", 64, 64, seed, accuracy)
    fake_run(tmp_path, "full", 64, 128, 0, 0.97)
    fake_run(tmp_path, "linear", 64, 64, 0, 0.25)
    fake_run(tmp_path, "linear", 64, 64, 0, 0.125, causal=True)
    out = tmp_path / "summary"
    settings = mqar.main(["summarize", "--results", str(tmp_path), "--out", str(out)])

    assert len(settings) == 4
    full = next(s for s in settings if s["attention_type"] == "full" and s["seq_len"] == 64)
    assert full["accuracy_mean"] == pytest.approx(0.99) and full["accuracy_std"] == pytest.approx(0.01)
    assert full["seeds"] == [0, 1, 2]
    table = (out / "mqar_summary.md").read_text()
    assert "| full | bidirectional | 99.0 ± 1.0 (3) | 97.0 |" in table
    assert "| linear | bidirectional | 25.0 | - |" in table
    assert "| linear | causal | 12.5 | - |" in table
    assert "n=64 (4 pairs), d=64" in table and "Figure 2" in table
    assert (out / "mqar_accuracy.png").stat().st_size > 5000
    assert json.loads((out / "mqar_summary.json").read_text()) == settings
    assert "99.0 ± 1.0 (3)" in capsys.readouterr().out


def test_a_learning_rate_sweep_keeps_the_best_rate_on_validation(tmp_path):
    """Zoology's protocol: per setting, the rate with the best mean validation accuracy, whatever its test
    accuracy; a run without an lr_ folder (the config's 1e-3) is one member of the sweep."""
    fake_run(tmp_path, "full", 128, 64, 0, 0.25, causal=True, validation=0.26)  # default rate, 1e-3
    for seed, validation in enumerate([0.97, 0.99]):
        fake_run(tmp_path, "full", 128, 64, seed, 0.95, True, learning_rate=3e-4, validation=validation)
    fake_run(tmp_path, "full", 128, 64, 0, 0.999, causal=True, learning_rate=3e-3, validation=0.5)
    fake_run(tmp_path, "linear", 128, 64, 0, 0.2, causal=True, validation=0.2)
    (full, linear) = mqar.main(["summarize", "--results", str(tmp_path)])
    assert full["learning_rate"] == 3e-4 and full["accuracy_mean"] == pytest.approx(0.95)
    assert full["seeds"] == [0, 1]
    assert [(r["learning_rate"], r["validation_mean"]) for r in full["learning_rates"]] == [
        (3e-4, pytest.approx(0.98)),
        (1e-3, pytest.approx(0.26)),
        (3e-3, pytest.approx(0.5)),
    ]
    table = (tmp_path / "mqar_summary.md").read_text()
    assert "| full | causal | 95.0 ± 0.0 (2) @ 0.0003 |" in table
    assert "| linear | causal | 20.0 |" in table  # one rate: no "@"
    assert "| lr 0.0003 | lr 0.001 | lr 0.003 |" in table  # every rate of the sweep, for the swept setting
    assert "| full | causal | n=64, d=128 | 95.0 (98.0) | 25.0 (26.0) | 99.9 (50.0) |" in table


def test_merge_with_keeps_the_earlier_summarys_settings_the_runs_lack(tmp_path):
    """A grid extended on another machine: the earlier summary's settings stay, unchanged (their seeds and
    spread too), beside the new runs; where both have a setting, the runs' numbers win."""
    earlier_runs, new_runs = tmp_path / "earlier", tmp_path / "new"
    for seed, accuracy in enumerate([0.9, 1.0]):
        fake_run(earlier_runs, "full", 64, 64, seed, accuracy, causal=True)
    fake_run(earlier_runs, "linear", 64, 64, 0, 0.5, causal=True)
    mqar.main(["summarize", "--results", str(earlier_runs)])
    fake_run(new_runs, "linear", 64, 64, 0, 0.25, causal=True)  # reruns a setting of the earlier summary
    fake_run(new_runs, "full", 128, 128, 0, 0.75, causal=True)
    out = tmp_path / "merged"
    settings = mqar.main(
        [
            "summarize",
            "--results",
            str(new_runs),
            "--out",
            str(out),
            "--merge_with",
            str(earlier_runs / "mqar_summary.json"),
        ]
    )
    by_setting = {(s["attention_type"], s["seq_len"], s["hidden_size"]): s for s in settings}
    assert sorted(by_setting) == [("full", 64, 64), ("full", 128, 128), ("linear", 64, 64)]
    assert by_setting[("full", 64, 64)]["seeds"] == [0, 1]
    assert by_setting[("full", 64, 64)]["accuracy_std"] == pytest.approx(0.0707, abs=1e-4)
    assert by_setting[("linear", 64, 64)]["accuracy_mean"] == 0.25  # the runs win
    table = (out / "mqar_summary.md").read_text()
    assert "| full | causal | 95.0 ± 7.1 (2) | 75.0 |" in table


def test_merge_with_refuses_a_file_that_is_no_summary(tmp_path):
    fake_run(tmp_path, "full", 64, 64, 0, 0.9)
    with pytest.raises(FileNotFoundError, match="--merge_with .*no such file"):
        mqar.main(["summarize", "--results", str(tmp_path), "--merge_with", str(tmp_path / "missing.json")])
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"accuracy": 0.9}))
    with pytest.raises(ValueError, match="--merge_with .*wrong.json: not an MQAR summary"):
        mqar.main(["summarize", "--results", str(tmp_path), "--merge_with", str(wrong)])


def test_summarize_without_results_says_what_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="benchmarks.studies.mqar run"):
        mqar.main(["summarize", "--results", str(tmp_path)])


def test_grid_runs_every_setting_through_the_seeds_runner(tmp_path, monkeypatch):
    calls = []

    def fake_seeds_main(argv):
        calls.append(argv)
        out = Path(argv[argv.index("--out") + 1])
        command = argv[argv.index("--") + 1 :]
        attention_type = command[command.index("--attention_type") + 1]
        width, length = (
            int(command[command.index("--hidden_size") + 1]),
            int(command[command.index("--seq_len") + 1]),
        )
        if attention_type == "linear" and length == 128:
            raise SystemExit(1)  # a failed seed: the grid goes on and reports it
        rate = float(command[command.index("--learning_rate") + 1]) if "--learning_rate" in command else None
        if not (out / "seed_0").exists():  # out: <root>/<formulation>/<type>/d_n[/lr_]
            fake_run(
                out.parents[2 if rate is None else 3],
                attention_type,
                width,
                length,
                0,
                0.5,
                learning_rate=rate,
            )

    monkeypatch.setattr("benchmarks.seeds.main", fake_seeds_main)
    argv = [
        "run",
        "--types",
        "full",
        "linear",
        "--widths",
        "32",
        "--lengths",
        "64",
        "128",
        "--seeds",
        "0",
        "1",
    ]
    with pytest.raises(SystemExit, match="1"):
        mqar.main([*argv, "--out", str(tmp_path), "--", "--max_steps", "5"])
    assert len(calls) == 4
    first = calls[0]
    assert first[: first.index("--label")] == [
        *("--seeds", "0", "1", "--out", str(tmp_path / "bidirectional" / "full" / "d32_n64")),
        *("--results_file", "mqar_results.json"),
    ]
    command = first[first.index("--") + 1 :]
    assert command[:3] == [sys.executable, "-m", "benchmarks.tasks.train_mqar"]
    assert command[-2:] == ["--max_steps", "5"] and "{seed}" in command and "{output_dir}" in command
    assert "--learning_rate" not in command  # no sweep: the config's rate
    assert (tmp_path / "mqar_summary.md").exists()  # summarized at the end, the failed setting left out

    calls.clear()
    sweep = ["--types", "full", "--widths", "32", "--lengths", "64", "--learning_rates", "3e-4", "3e-3"]
    mqar.main(["run", *sweep, "--out", str(tmp_path / "sweep")])
    folders = [call[call.index("--out") + 1] for call in calls]
    assert folders == [
        str(tmp_path / "sweep" / "bidirectional" / "full" / "d32_n64" / f"lr_{lr}")
        for lr in ("0.0003", "0.003")
    ]
    rates = [call[call.index("--learning_rate") + 1] for call in calls]
    assert rates == ["0.0003", "0.003"]
    assert all("--in_process" not in call for call in calls)

    calls.clear()  # --in_process reaches the seeds runner, before the command
    mqar.main(
        ["run", "--types", "full", "--widths", "32", "--lengths", "64", "--out", str(tmp_path / "here")]
    )
    mqar.main(
        [
            "run",
            "--types",
            "full",
            "--widths",
            "32",
            "--lengths",
            "64",
            "--in_process",
            "--out",
            str(tmp_path / "here"),
        ]
    )
    assert ["--in_process" in call[: call.index("--")] for call in calls] == [False, True]


def test_causal_grid_refuses_types_without_a_causal_form(tmp_path):
    with pytest.raises(SystemExit, match="reformer_lsh have no causal form"):
        mqar.main(["run", "--types", "full", "reformer_lsh", "--causal", "--out", str(tmp_path)])
