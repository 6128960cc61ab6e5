"""The packing study (benchmarks/studies/packing.py) at its smoke size: grouping, packing and packing for
grouping's tokens trained through the seeds runner on the same texts, each scored on the same held-out texts
in both forms."""

import json

from benchmarks.studies import packing


def test_packing_study_smoke(tmp_path):
    """In process: a tiny model from scratch, 2 steps per setting (more for packing_equal_tokens), one seed;
    the equal-token setting run on its own keeps the rows of the settings run before it."""
    options = ["--preset", "smoke", "--seeds", "0", "--in_process", "--out", str(tmp_path)]
    packing.main([*options, "--settings", "grouping", "packing"])
    results = packing.main([*options, "--settings", "packing_equal_tokens"])
    settings = {name: {int(s): run for s, run in runs.items()} for name, runs in results["settings"].items()}
    assert set(settings) == set(packing.SETTINGS) and all(set(runs) == {0} for runs in settings.values())
    for runs in settings.values():
        run = runs[0]
        assert all(run[name] > 0 for name in ("loss_texts", "loss_blocks", "eval_loss"))
        assert run["tokens_per_example_blocks"] == 64  # full blocks; texts and their pieces are shorter
        assert 0 < run["tokens_per_example_texts"] <= 64
    assert settings["grouping"][0]["tokens_per_example"] == 64
    assert settings["grouping"][0]["steps"] == settings["packing"][0]["steps"] == 2
    assert settings["packing_equal_tokens"][0]["steps"] > 2  # a packed example: fewer tokens than a block
    # the same held-out examples and masks for every model: only the weights differ
    assert "--packing" in json.loads((tmp_path / "packing" / "command.json").read_text())
    assert "--packing" not in json.loads((tmp_path / "grouping" / "command.json").read_text())
    summary = (tmp_path / "summary.md").read_text()
    assert "| grouping | 1 |" in summary and "| packing | 1 |" in summary
    assert json.loads((tmp_path / "results.json").read_text())["preset"] == "smoke"
