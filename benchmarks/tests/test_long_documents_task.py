"""benchmarks.tasks.long_documents: the documents (majority of three reviews, the middle one long, no review
in two splits, deterministic, within the cap), the one-window ceilings on documents computed by hand, and the
written files as finetune_glue.py reads them."""

from __future__ import annotations

import json

import pytest
from datasets import ClassLabel, Dataset

from benchmarks.tasks import long_documents
from benchmarks.tasks.long_documents import (
    build_long_documents,
    oracle_accuracy,
    window_ceiling,
    window_ceilings,
    window_reviews,
)
from tests.tiny_models import save_tiny_bert

SIZES = {"train": 12, "validation": 4, "test": 8}
LONG, CAP = 20, 80  # a middle review has >= 20 tokens, a document <= 80


@pytest.fixture(scope="module")
def tokenizer():
    return long_documents.packaged_tokenizer()


@pytest.fixture(scope="module")
def reviews() -> Dataset:
    """240 reviews of 2-40 one-token words ('great' x n: pos, 'awful' x n: neg), a number each so that
    every review's text differs; a third of them long (>= 20 tokens)."""
    rows = []
    for i in range(240):
        label, words = i % 2, 2 + (i * 7) % 39
        rows.append({"text": f"{i} " + " ".join(["great" if label else "awful"] * words), "label": label})
    return Dataset.from_list(rows).cast_column("label", ClassLabel(names=["neg", "pos"]))


@pytest.fixture(scope="module")
def majority3(tokenizer, reviews):
    return build_long_documents(
        "majority3", SIZES, seed=3, tokenizer=tokenizer, reviews=reviews,
        max_document_tokens=CAP, long_review_tokens=LONG,
    )  # fmt: skip


def test_majority3_documents_follow_the_design(majority3, tokenizer):
    seen = {}
    for split, documents in majority3.items():
        assert len(documents) == SIZES[split]
        for row in documents:
            labels = row["review_labels"]
            assert row["label"] == ("pos" if sum(labels) >= 2 else "neg")
            ids = tokenizer(row["text"])["input_ids"]
            assert len(ids) == row["tokens"] <= CAP
            first, end = row["review_token_spans"][1]
            assert end - first >= LONG  # the middle review is long
            # each token span holds exactly the tokens of the review at its character span, after [CLS]
            spans = zip(row["review_char_spans"], row["review_token_spans"], labels, strict=True)
            for (start, stop), (first, end), label in spans:
                review = row["text"][start:stop]
                assert ids[1 + first : 1 + end] == tokenizer(review, add_special_tokens=False)["input_ids"]
                assert review.split()[1] == ("great" if label else "awful")
            for review_id in row["review_ids"]:
                assert review_id not in seen, f"review {review_id} in {seen.get(review_id)} and {split}"
                seen[review_id] = split


def test_documents_are_deterministic_per_seed(majority3, tokenizer, reviews):
    again = build_long_documents(
        "majority3", SIZES, seed=3, tokenizer=tokenizer, reviews=reviews,
        max_document_tokens=CAP, long_review_tokens=LONG,
    )  # fmt: skip
    other = build_long_documents(
        "majority3", SIZES, seed=4, tokenizer=tokenizer, reviews=reviews,
        max_document_tokens=CAP, long_review_tokens=LONG,
    )  # fmt: skip
    assert again["test"]["text"] == majority3["test"]["text"]
    assert other["test"]["text"] != majority3["test"]["text"]


def test_imdb_variant_is_one_review_per_document(tokenizer, reviews):
    data = build_long_documents("imdb", SIZES, tokenizer=tokenizer, reviews=reviews)
    row = data["train"][0]
    assert row["review_token_spans"] == [[0, row["tokens"] - 2]]
    assert row["label"] == ("pos" if row["review_labels"] == [1] else "neg")
    assert window_ceiling(data["test"], 8) == 1.0  # one review: any window sees it


def test_bad_arguments_and_too_many_documents_are_named(tokenizer, reviews):
    options = {"tokenizer": tokenizer, "reviews": reviews, "long_review_tokens": LONG}
    with pytest.raises(ValueError, match="variant='pairs'"):
        build_long_documents("pairs", **options)
    with pytest.raises(ValueError, match=r"sizes\['test'\]=0"):
        build_long_documents("majority3", {"test": 0}, **options)
    with pytest.raises(ValueError, match="max_document_tokens=10"):
        build_long_documents("majority3", max_document_tokens=10, **options)
    with pytest.raises(ValueError, match=r"sizes\['train'\]=500: .* long reviews"):
        build_long_documents("majority3", {"train": 500}, max_document_tokens=CAP, **options)
    with pytest.raises(ValueError, match="one-token separator"):
        build_long_documents("majority3", SIZES, separator="\n\n--\n\n", max_document_tokens=CAP, **options)


def test_oracle_accuracy_by_hand():
    assert oracle_accuracy([1, 1, 0], [0, 1]) == 1.0  # the two known agree: the majority is settled
    assert oracle_accuracy([1, 1, 0], [1, 2]) == 0.5  # they disagree: a coin flip
    assert oracle_accuracy([1, 1, 0], [0]) == 1.0  # one known, and it is the majority
    assert oracle_accuracy([1, 0, 0], [0]) == 0.0  # one known, outvoted by the two unseen
    assert oracle_accuracy([1, 0, 0], [0, 1, 2]) == 1.0
    assert oracle_accuracy([1, 0, 0], []) == 0.5


def test_windows_and_ceilings_by_hand():
    # review 0: text tokens 0-99, [SEP] at 100, review 1: 101-700 (600 tokens), [SEP], review 2: 702-799
    spans = [[0, 100], [101, 701], [702, 800]]
    assert window_reviews(spans, 512, "head") == [0, 1]  # 510 tokens: 0-509
    assert window_reviews(spans, 4096, "head") == [0, 1, 2]
    assert window_reviews([[0, 200], [201, 801], [802, 900]], 128, "head") == [0]
    assert window_reviews([[0, 200], [201, 801], [802, 900]], 128, "best") == [0, 1]
    # the best window starts at review 0's last token (99) and reaches 702 with 604 tokens: max_length 606
    assert window_reviews(spans, 606, "best") == [0, 1, 2]
    assert window_reviews(spans, 605, "best") == [0, 1]
    assert window_reviews(spans, 606, "head") == [0, 1]
    documents = [
        {"review_labels": [1, 1, 0], "review_token_spans": spans},  # sees 1, 1: right
        {"review_labels": [1, 0, 1], "review_token_spans": spans},  # sees 1, 0: coin flip
        {"review_labels": [0, 1, 1], "review_token_spans": [[0, 600], [601, 1200], [1201, 1300]]},  # sees 0
    ]
    assert window_ceilings(documents, 512) == [1.0, 0.5, 0.0]
    assert window_ceiling(documents, 512) == pytest.approx(0.5)
    assert window_ceiling(documents, 4096) == 1.0
    with pytest.raises(ValueError, match="max_length=2"):
        window_reviews(spans, 2, "head")
    with pytest.raises(ValueError, match="window='tail'"):
        window_reviews(spans, 512, "tail")


def test_written_files_train_in_finetune_glue(finetune_glue, tokenizer, tmp_path):
    """The command writes real IMDB documents (the first 400 reviews); a tiny BERT trains 2 steps on them."""
    data = tmp_path / "data"
    settings = long_documents.main(
        ["write", "--variant", "majority3", "--out", str(data), "--max_reviews", "400"]
        + ["--train_size", "8", "--validation_size", "2", "--test_size", "4"]
    )
    assert settings["sizes"] == {"train": 8, "validation": 2, "test": 4}
    assert sum(pool["reviews"] for pool in settings["pools"].values()) == 400  # every review in one pool
    assert sum(settings["pools"]["test"]["long_reviews"].values()) >= 4  # a long middle per test document
    saved = json.loads((data / "data_settings.json").read_text())["splits"]["test"]
    assert saved["longer_than"]["512"] == 1.0 and saved["ceiling_head"]["4096"] == 1.0
    checkpoint = tmp_path / "tiny"
    save_tiny_bert(checkpoint, tokenizer)
    metrics = finetune_glue.main(
        ["--model_name_or_path", str(checkpoint), "--output_dir", str(tmp_path / "run")]
        + ["--train_file", str(data / "train.jsonl"), "--validation_file", str(data / "test.jsonl")]
        + ["--text_column_names", "text", "--max_seq_length", "64", "--do_train", "--do_eval"]
        + ["--max_steps", "2", "--per_device_train_batch_size", "4", "--report_to", "none"]
    )
    # evaluated on every written test document: the accuracy is a whole number of them over their count
    documents = len((data / "test.jsonl").read_text().splitlines())
    correct = metrics["eval_accuracy"] * documents
    assert documents >= 2 and abs(correct - round(correct)) < 1e-6
    results = json.loads((tmp_path / "run" / "all_results.json").read_text())
    assert results["train_samples_per_second"] > 0 and results["eval_samples_per_second"] > 0  # the study's
    labels = json.loads((tmp_path / "run" / "config.json").read_text())["id2label"]
    assert labels == {"0": "neg", "1": "pos"}
