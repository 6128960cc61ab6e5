"""benchmarks.studies.listops: the table and plot of ListOps runs, on two runs saved as
benchmarks/tasks/train_listops.py saves them (a model with its tokenizer and listops_results.json per
output_dir; untrained tiny models here: the summary only reads what they answer)."""

import json
from dataclasses import asdict
from pathlib import Path

import pytest
from transformers import pipeline

import hf_efficient
from benchmarks.studies import listops
from benchmarks.tasks.listops import (
    LABEL_NAMES,
    VOCAB,
    ListOpsSpec,
    build_listops_tokenizer,
    describe_listops,
    generate_listops,
    outer_operator_agreement,
    outer_operator_baseline,
    outer_operator_guesses,
)
from hf_efficient import EfficientBertConfig, EfficientBertForSequenceClassification

SPEC, SIZES, POSITIONS = ListOpsSpec(20, 60), {"train": 32, "validation": 8, "test": 16}, 61


def save_run(output_dir: Path, attention_type: str, attention_config: dict, padded_to: int | None) -> None:
    """A run's output_dir: a tiny EfficientBert classifier, its tokenizer and its listops_results.json."""
    id2label = dict(enumerate(LABEL_NAMES))
    config = EfficientBertConfig(
        vocab_size=len(VOCAB),
        pad_token_id=VOCAB.index("[PAD]"),
        num_labels=len(LABEL_NAMES),
        id2label=id2label,
        label2id={label: i for i, label in id2label.items()},
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=POSITIONS,
        attention_type=attention_type,
        attention_config=attention_config,
    )
    EfficientBertForSequenceClassification(config).save_pretrained(output_dir)
    build_listops_tokenizer(POSITIONS).save_pretrained(output_dir)
    data = generate_listops(SPEC, SIZES)
    result = {
        "attention_type": attention_type,
        "attention_config": attention_config,
        "test_accuracy": 0.25,
        "eval_accuracy": 0.125,
        "test_majority_fraction": describe_listops(data["test"])["majority_fraction"],
        "test_outer_operator_baseline": outer_operator_baseline(data["train"], data["test"]),
        "train_runtime": 1.5,
        "steps": 2,
        "seconds_per_step": 0.75,
        "padded_to": padded_to,
        "data": {**{f"num_{k}": v for k, v in SIZES.items()}, **asdict(SPEC), "seed": 0},
        "eval_curve": [[1, 0.0], [2, 0.125]],
        "output_dir": str(output_dir),
    }
    (output_dir / listops.RESULTS_FILE).write_text(json.dumps(result))


def test_summary_table_plot_and_outer_operator_agreement(tmp_path, capsys):
    save_run(tmp_path / "full", "full", {}, None)
    save_run(tmp_path / "linformer", "linformer", {"projected_length": 8}, POSITIONS)  # fixed length: padded
    summary = listops.main(["--results", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "| full |" in printed and "36.37 (Transformer)" in printed and "outer operator" in printed
    assert [r["attention_type"] for r in summary] == ["full", "linformer"]
    table = (tmp_path / "listops_summary.md").read_text()
    assert "| linformer |" in table and "35.70 (Linformer)" in table
    assert len(json.loads((tmp_path / "listops_summary.json").read_text())) == 2
    assert (tmp_path / "listops_curves.png").stat().st_size > 0 and "listops_curves.png" in table
    # Each saved model's test answers against the outer-operator guesses, checked one expression at a time
    # through the pipeline (no batch padding) on the same regenerated data.
    data = generate_listops(SPEC, SIZES)
    guesses, sources = outer_operator_guesses(data["train"]), list(data["test"]["source"])
    for result in summary:
        padding = {"padding": "max_length", "max_length": POSITIONS} if result["padded_to"] else {}
        classify = pipeline("text-classification", model=str(tmp_path / result["attention_type"]))
        answers = [int(classify(source, **padding)[0]["label"]) for source in sources]
        expected = outer_operator_agreement(answers, sources, guesses)
        assert result["test_outer_operator_agreement"] == pytest.approx(expected)
    assert "answers as outer operator" in table


def test_summary_without_runs_says_what_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="benchmarks/tasks/train_listops.py"):
        listops.main(["--results", str(tmp_path)])


def test_lra_column_names_registered_types():
    """LRA's figure of a type is its core's lra_listops; a type LRA did not run, or no registered type,
    shows '-'."""
    assert hf_efficient.get_attention_class("reformer_lsh").lra_listops == ("Reformer", 37.27)
    assert listops.lra_reference("full") == "36.37 (Transformer)"
    assert listops.lra_reference("graph_sparse") == listops.lra_reference("not_a_type") == "-"


def test_runs_of_different_settings_name_theirs(tmp_path):
    """Runs on different data or models: each row names its setting (its floors are its own data's), where
    one shared "Data:" line would describe only the first run."""
    save_run(tmp_path / "short", "full", {}, None)
    save_run(tmp_path / "deep", "full", {}, None)
    path = tmp_path / "deep" / listops.RESULTS_FILE
    result = json.loads(path.read_text())
    result["data"]["max_depth"], result["model"] = 3, {"num_hidden_layers": 4, "hidden_size": 128}
    path.write_text(json.dumps(result))
    listops.main(["--results", str(tmp_path)])
    table = (tmp_path / "listops_summary.md").read_text()
    assert "| attention | setting |" in table
    assert "| full | 20-60 tokens, depth 3; 4 x 128, 2 steps |" in table
    assert f"| full | 20-60 tokens, depth {SPEC.max_depth}; model size not saved, 2 steps |" in table
    assert "its own test data" in table
