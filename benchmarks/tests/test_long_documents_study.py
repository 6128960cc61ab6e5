"""benchmarks.studies.long_documents: the table, plot and 3-std verdict from seeds results written by hand
(both ways, and undecidable), and the run driver end to end on a tiny checkpoint (resumable)."""

from __future__ import annotations

import functools
import json
import shutil
import sys

import numpy as np
import pytest
import torch

from benchmarks import seeds
from benchmarks.studies import long_document_probe, long_documents
from hf_efficient.data.packaged_bert import packaged_tokenizer
from tests.script_loader import load_script
from tests.tiny_models import save_tiny_bert

SPANS = [[0, 100], [101, 701], [702, 800]]  # the middle review is 600 tokens
DOCUMENTS = [  # at 512 the head sees reviews 0 and 1: right, coin flip, right -> ceiling 5/6
    {"review_labels": [1, 1, 0], "review_token_spans": SPANS, "tokens": 802},
    {"review_labels": [1, 0, 1], "review_token_spans": SPANS, "tokens": 802},
    {"review_labels": [0, 0, 1], "review_token_spans": SPANS, "tokens": 802},
]


def write_setting(
    root, label: str, length: int, accuracies: list[float], test_file, cwd=None, checkpoint=None
) -> None:
    """A setting's seeds.json as benchmarks.seeds writes it, for a run that reached these accuracies (its
    commands run in ``cwd``, on ``checkpoint``, by default ``ckpt/<label>``)."""
    runs = {
        seed: {"eval_accuracy": accuracy, "train_samples_per_second": 4.0, "eval_samples_per_second": 10.0}
        for seed, accuracy in enumerate(accuracies)
    }
    command = [
        "python",
        "scripts/finetune_glue.py",
        "--model_name_or_path",
        str(checkpoint or f"ckpt/{label}"),
    ]
    command += ["--max_seq_length", str(length), "--validation_file", str(test_file), "--seed", "{seed}"]
    result = {
        "label": label,
        "command": command,
        "runs": runs,
        "failed": [],
        "aggregate": seeds.aggregate(runs),
    }
    if cwd is not None:
        result["cwd"] = str(cwd)
    (root / f"{label}-{length}").mkdir(parents=True)
    (root / f"{label}-{length}" / "seeds.json").write_text(json.dumps(result))


@pytest.fixture
def results(tmp_path):
    test_file = tmp_path / "data" / "test.jsonl"
    test_file.parent.mkdir()
    test_file.write_text("".join(json.dumps(row) + "\n" for row in DOCUMENTS))
    write_setting(tmp_path, "exact", 128, [0.60, 0.62, 0.64], test_file)
    write_setting(tmp_path, "exact", 512, [0.70, 0.71, 0.72], test_file)
    return tmp_path, test_file


def test_summary_table_plot_and_a_verdict_that_beats(results):
    root, test_file = results
    write_setting(root, "longformer", 2048, [0.80, 0.81, 0.82], test_file)
    rows = long_documents.main(["summarize", "--results", str(root)])
    assert [(r["model"], r["max_length"]) for r in rows] == [
        ("exact", 128),
        ("exact", 512),
        ("longformer", 2048),
    ]
    summary = (root / "long_documents.md").read_text()
    # 512: 70-72% (std 1 point), ceiling 5/6 for the head and the best window, all 3 documents longer
    assert "| `exact` | 512 | 71.00 ± 1.00 | 3 | 83.33 | 83.33 | 100.00 | 0.250 | 0.100 |" in summary
    assert "| `longformer` | 2048 | 81.00 ± 1.00 | 3 | 100.00 | 100.00 | 0.00 |" in summary
    assert "longformer at 2048, beats exact at 512" in summary and "+10.00 points against 3 x 1.00" in summary
    assert (root / "accuracy_vs_length.png").stat().st_size > 0
    assert json.loads((root / "long_documents.json").read_text())["verdict"]["beats"] is True


def test_zoo_cards_get_the_rows_of_the_table(results):
    """``--write_to_builds``: a checkpoint that is a zoo build's final/ gets its rows and the exact references
    as an extra_results file, which the builder's ``card`` renders with the table's numbers."""
    root, test_file = results
    build = root / "zoo" / "minilm-l6-longformer-4096"
    (build / "final").mkdir(parents=True)
    (build / "recipe.json").write_text("{}")
    write_setting(root, "longformer", 2048, [0.80, 0.81, 0.82], test_file, checkpoint=build / "final")
    write_setting(root, "plain", 2048, [0.5, 0.5], test_file)  # not a zoo build: nothing written for it
    long_documents.main(["summarize", "--results", str(root), "--write_to_builds"])
    written = sorted(root.rglob("extra_results/*.json"))
    assert written == [build / "extra_results" / "long_documents_finetune.json"]
    extra = json.loads(written[0].read_text())
    shown = [(row["model"], row["max length"], row["test accuracy (%)"]) for row in extra["rows"]]
    assert shown == [("`exact`", "128", "62.00 ± 2.00"), ("`exact`", "512", "71.00 ± 1.00")] + [
        ("`longformer`", "2048", "81.00 ± 1.00")
    ]
    card_section = load_script("build_checkpoint").extra_results(build)
    assert "### Long documents (finetune)" in card_section
    assert "| `longformer` | 2048 | 81.00 ± 1.00 | 3 |" in card_section
    assert "| `longformer` | 2048 | 81.00 ± 1.00 | 3 |" in (root / "long_documents.md").read_text()


def test_a_verdict_within_three_spreads_does_not_beat(results):
    root, test_file = results
    write_setting(root, "longformer", 4096, [0.70, 0.74, 0.78], test_file)  # +3 points, std 4
    long_documents.main(["summarize", "--results", str(root)])
    decision = json.loads((root / "long_documents.json").read_text())["verdict"]
    assert decision["beats"] is False and "does not beat" in decision["text"]


def test_a_verdict_needs_two_seeds_and_a_long_setting(results):
    root, test_file = results
    assert long_documents.verdict(long_documents.collect(root))["beats"] is None  # nothing >= 2048
    write_setting(root, "longformer", 2048, [0.9], test_file)
    decision = long_documents.verdict(long_documents.collect(root))
    assert decision["beats"] is None and "fewer than 2 seeds" in decision["text"]


def test_relative_paths_are_read_from_where_the_runs_ran(tmp_path, monkeypatch):
    """A run given `--validation_file runs/.../test.jsonl` (as the docs' commands are) is summarized from
    any folder: the path is resolved against the cwd the seeds runner recorded, not the summarizer's."""
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in DOCUMENTS))
    write_setting(tmp_path / "runs", "exact", 512, [0.70, 0.72], "data/test.jsonl", cwd=project)
    monkeypatch.chdir(tmp_path)  # not the project: data/test.jsonl does not exist here
    (row,) = long_documents.collect(tmp_path / "runs")
    assert row["test_documents"] == 3 and row["ceiling_head"] == pytest.approx(5 / 6)


def test_a_bad_checkpoint_flag_is_named(tmp_path):
    with pytest.raises(SystemExit, match="--checkpoint 'runs/model': give NAME=PATH"):
        long_documents.main(
            ["run", "--out", str(tmp_path), "--exact_model", "x", "--checkpoint", "runs/model"]
            + ["--max_reviews", "400", "--train_size", "4", "--validation_size", "2", "--test_size", "2"]
        )


@pytest.mark.slow  # the seeds runner starts scripts/finetune_glue.py in a fresh interpreter per setting
def test_run_then_summarize_end_to_end(tmp_path, capsys):
    """The documented commands at tiny sizes: a 1-layer BERT as the exact model (32 tokens) and as a "long"
    checkpoint (64 tokens), one step per seed; a second run finds every seed done. The summary and the
    verdict from hand-written seeds results are the in-process tests above."""
    checkpoint = tmp_path / "tiny"
    tokenizer = packaged_tokenizer()
    save_tiny_bert(checkpoint, tokenizer)
    out = tmp_path / "study"
    run = ["run", "--variant", "majority3", "--out", str(out), "--seeds", "0", "--max_steps", "1"]
    run += ["--max_reviews", "400", "--train_size", "4", "--validation_size", "2", "--test_size", "4"]
    run += ["--exact_model", str(checkpoint), "--exact_lengths", "32", "--checkpoint", f"tiny={checkpoint}"]
    run += ["--long_lengths", "64", "--batch_size", "2"]
    results = long_documents.main(run)
    assert [r["label"] for r in results] == ["exact", "tiny"] and all(r["runs"] for r in results)
    assert (out / "exact-32" / "seed_0" / "all_results.json").exists()
    long_documents.main(run)
    assert capsys.readouterr().out.count("not run again") == 2
    rows = long_documents.main(["summarize", "--results", str(out), "--reference_length", "32"])
    assert [(r["model"], r["max_length"]) for r in rows] == [("exact", 32), ("tiny", 64)]
    assert rows[0]["ceiling_head"] <= 1.0 and rows[0]["longer_than_length"] == 1.0
    assert rows[1]["train_s_per_example"] > 0 and {row["protocol"] for row in rows} == {"finetune"}
    assert sys.executable in rows[0]["command"]


@pytest.mark.slow  # two settings x two seeds, twice
def test_probe_protocol_end_to_end_caches_features_for_every_seed(tmp_path, capsys):
    """``--protocol probe``: the encoder runs once per setting and split (features cached), each seed fits its
    own probe on its own draw of the training documents, and the summary reads the probe like a fine-tune.
    The seeds run in this process (``--in_process``: six fresh interpreters were 30 of this test's 34
    CPU-seconds); the runner's fresh-interpreter path is the fine-tune test's above. The probe's features and
    cache are also checked in process (the tests below)."""
    checkpoint = tmp_path / "tiny"
    save_tiny_bert(checkpoint, packaged_tokenizer())
    out = tmp_path / "study"
    run = ["run", "--protocol", "probe", "--variant", "majority3", "--out", str(out), "--seeds", "0", "1"]
    run += ["--max_reviews", "400", "--train_size", "12", "--validation_size", "2", "--test_size", "6"]
    run += ["--exact_model", str(checkpoint), "--exact_lengths", "32", "--checkpoint", f"tiny={checkpoint}"]
    run += ["--long_lengths", "64", "--in_process"]
    results = long_documents.main(run)
    assert [r["label"] for r in results] == ["exact", "tiny"] and all(len(r["runs"]) == 2 for r in results)
    features = sorted((out / "features").rglob("*.npz"))
    assert [p.relative_to(out / "features").as_posix() for p in features] == [
        "exact-32/test.npz", "exact-32/train.npz", "tiny-64/test.npz", "tiny-64/train.npz",
    ]  # fmt: skip
    written = {path: path.stat().st_mtime_ns for path in features}
    for setting in ("exact-32", "tiny-64"):
        shutil.rmtree(out / setting / "seed_1")  # the seed runs again, from the cached features
    long_documents.main(run)
    assert capsys.readouterr().out.count("not run again") == 2
    assert {path: path.stat().st_mtime_ns for path in features} == written
    metrics = json.loads((out / "exact-32" / "seed_1" / "all_results.json").read_text())
    assert metrics["train_documents"] == round(0.8 * 12) and metrics["eval_documents"] == 6
    assert "Warning" not in (out / "exact-32" / "seed_1" / "log.txt").read_text()  # a clean log
    rows = long_documents.main(["summarize", "--results", str(out), "--reference_length", "32"])
    settings = [(r["model"], r["max_length"], r["accuracy"]["n"]) for r in rows]
    assert settings == [("exact", 32, 2), ("tiny", 64, 2)]
    assert rows[1]["eval_s_per_example"] > 0 and {row["protocol"] for row in rows} == {"probe"}
    summary = (out / "long_documents.md").read_text()
    assert "Probe rows (frozen encoder" in summary and "Trainer's runtime" not in summary


def test_probe_features_do_not_depend_on_batching(tmp_path):
    """Documents of different lengths padded into one batch (longest first) get the features each has alone:
    the mean runs over its own tokens only, and every row lands back at its document."""
    checkpoint = tmp_path / "tiny"
    save_tiny_bert(checkpoint, packaged_tokenizer())
    texts = ["a short one", "a longer document than the first, with more words in it", "mid length text"]
    features = functools.partial(long_document_probe.mean_pooled_features, str(checkpoint), texts, 32)
    alone, _ = features(batch_size=1, desc="alone")
    batched, _ = features(batch_size=3, desc="batched")
    np.testing.assert_allclose(batched, alone, atol=1e-5)
    assert not np.allclose(alone[0], alone[1])


def test_probe_needs_two_documents_of_each_label():
    features, labels = np.zeros((5, 4)), np.array(["neg", "pos", "pos", "pos", "pos"])
    with pytest.raises(ValueError, match="at least 2 of each label.*fewest: 1.*--train_size"):
        long_document_probe.fit_probe(features, labels, seed=0)


def test_probe_cache_is_not_reused_for_another_encoder(tmp_path, capsys):
    """Features cached from one checkpoint are computed again, not reused, when the same ``--features_dir``
    is given another checkpoint (or length): a rebuilt checkpoint must not be scored on stale features."""
    tokenizer = packaged_tokenizer()
    texts = [f"review number {i} {'good' if i % 2 else 'bad'} film" for i in range(10)]
    data = tmp_path / "docs.jsonl"
    rows = [json.dumps({"text": text, "label": ["neg", "pos"][i % 2]}) for i, text in enumerate(texts)]
    data.write_text("\n".join(rows) + "\n")
    features = tmp_path / "features"
    for name in ("first", "second"):
        torch.manual_seed(len(name))  # two encoders with different weights
        save_tiny_bert(tmp_path / name, tokenizer)
    common = ["--train_file", str(data), "--validation_file", str(data), "--features_dir", str(features)]
    common += ["--max_seq_length", "16", "--seed", "0", "--output_dir", str(tmp_path / "out")]
    long_document_probe.main(["--model_name_or_path", str(tmp_path / "first"), *common])
    first = np.load(features / "train.npz")["features"]
    capsys.readouterr()
    long_document_probe.main(["--model_name_or_path", str(tmp_path / "first"), *common])
    assert "computing them again" not in capsys.readouterr().out  # same encoder: read from the cache
    long_document_probe.main(["--model_name_or_path", str(tmp_path / "second"), *common])
    assert "holds features of another encoder" in capsys.readouterr().out
    assert not np.allclose(np.load(features / "train.npz")["features"], first)
