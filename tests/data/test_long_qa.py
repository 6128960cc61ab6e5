"""hf_efficient.data.long_qa: IMDB documents whose answer (the words after a quote of the last review) lies
past token 512, deterministic, SQuAD-format, unanswerable questions on request, and the windows a 512-token
reader needs; written as finetune_qa.py reads them."""

from __future__ import annotations

import json

import pytest
from datasets import Dataset

from hf_efficient.data import load_movie_reviews
from hf_efficient.data.long_qa import build_long_qa, describe, main
from hf_efficient.data.packaged_bert import packaged_tokenizer
from hf_efficient.data.question_answering import load_squad_files
from hf_efficient.errors import InputError

SIZES = {"train": 6, "validation": 3, "test": 3}
OPTIONS = dict(answer_after_tokens=512, max_context_tokens=1000)  # fits a 1,024-token model


@pytest.fixture(scope="module")
def tokenizer():
    return packaged_tokenizer()


@pytest.fixture(scope="module")
def reviews() -> Dataset:
    return load_movie_reviews("imdb").shuffle(seed=0).select(range(300))


@pytest.fixture(scope="module")
def data(tokenizer, reviews):
    return build_long_qa(SIZES, seed=1, tokenizer=tokenizer, reviews=reviews, **OPTIONS)


def test_questions_follow_the_design(data, tokenizer, reviews):
    texts = set(reviews["text"])
    for split, rows in data.items():
        assert len(rows) == SIZES[split]
        for row in rows:
            context, answer = row["context"], row["answers"]["text"][0]
            start = row["answers"]["answer_start"][0]
            assert context[start : start + len(answer)] == answer and len(answer.split()) == 3
            quote = row["question"].removeprefix('Which words follow "').removesuffix('"?')
            assert len(quote.split()) == 6 and context.count(quote) == 1
            assert context[: start - 1].endswith(quote)  # the answer follows the quote, after one space
            last = context.split("\n\n")[-1]
            assert last in texts and start >= len(context) - len(last)  # in the last review
            before = len(tokenizer(context[:start], add_special_tokens=False)["input_ids"])
            assert before == row["answer_token_start"] >= 512  # past a 512-token window
            assert len(tokenizer(context, add_special_tokens=False)["input_ids"]) <= 1000
    assert not set(data["train"]["context"]) & set(data["test"]["context"])


def test_deterministic_and_seeded(data, tokenizer, reviews):
    again = build_long_qa(SIZES, seed=1, tokenizer=tokenizer, reviews=reviews, **OPTIONS)
    assert again["validation"].to_list() == data["validation"].to_list()
    other = build_long_qa(SIZES, seed=2, tokenizer=tokenizer, reviews=reviews, **OPTIONS)
    assert other["validation"]["question"] != data["validation"]["question"]


def test_unanswerable_questions_quote_words_that_are_not_there(tokenizer, reviews):
    data = build_long_qa(
        SIZES, seed=1, tokenizer=tokenizer, reviews=reviews, unanswerable_fraction=1.0, **OPTIONS
    )
    for row in data["train"]:
        quote = row["question"].removeprefix('Which words follow "').removesuffix('"?')
        assert row["answers"] == {"text": [], "answer_start": []} and quote not in row["context"]
        assert row["answer_token_start"] == -1


def test_description_counts_the_windows_of_a_512_token_reader(data, tokenizer):
    summary = describe(data, tokenizer)["train"]
    assert summary["questions"] == 6 and summary["answers_in_first_512_tokens"] == 0
    assert summary["answer_token_start"]["min"] >= 512
    assert (
        2
        <= summary["windows_of_512_tokens_stride_128"]["mean"]
        <= summary["windows_of_512_tokens_stride_128"]["max"]
    )


def test_errors_name_the_argument(tokenizer, reviews):
    with pytest.raises(InputError, match=r"sizes\['train'\]=5000: the train pool of \d+ reviews ran out"):
        build_long_qa({"train": 5000}, tokenizer=tokenizer, reviews=reviews, **OPTIONS)
    with pytest.raises(InputError, match="unanswerable_fraction=2"):
        build_long_qa(SIZES, tokenizer=tokenizer, reviews=reviews, unanswerable_fraction=2)
    with pytest.raises(InputError, match="use max_context_tokens >= 576"):
        build_long_qa(SIZES, tokenizer=tokenizer, reviews=reviews, max_context_tokens=500)


def test_write_command_files_load_as_squad(tmp_path):
    args = ["write", "--out", str(tmp_path), "--max_reviews", "300", "--train_size", "2"]
    args += ["--validation_size", "2", "--test_size", "1", "--max_context_tokens", "1000"]
    settings = main(args)
    loaded = load_squad_files({s: str(tmp_path / f"{s}.jsonl") for s in ("train", "validation", "test")})
    assert {s: len(rows) for s, rows in loaded.items()} == {"train": 2, "validation": 2, "test": 1}
    assert (
        loaded["train"][0]["answers"]["text"]
        and json.loads((tmp_path / "data_settings.json").read_text()) == settings
    )
