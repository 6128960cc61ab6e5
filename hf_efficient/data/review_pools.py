"""IMDB's 25,000 reviews cut once into train / validation / test pools (stratified by label, seed 42, 60 /
10 / 30%), with their token counts: a document built from the reviews of one pool never shares a review with
another split's (the long-document question-answering set, :mod:`hf_efficient.data.long_qa`, and the lab's
long-document classification set)."""

from __future__ import annotations

from datasets import Dataset, DatasetDict
from transformers import PreTrainedTokenizerBase

from .packaged_bert import packaged_tokenizer
from .text import load_movie_reviews

SPLITS = ("train", "validation", "test")
POOL_FRACTIONS = {"train": 0.6, "validation": 0.1, "test": 0.3}
POOL_SEED = 42  # the pools stay fixed; a set's own seed changes only which documents it draws


def review_pools(reviews: Dataset, seed: int = POOL_SEED) -> DatasetDict:
    """The reviews cut into train / validation / test pools (``POOL_FRACTIONS``, stratified by label), each
    with an ``id`` column: the review's row in ``reviews``."""
    reviews = reviews.add_column("id", list(range(len(reviews))))
    test_fraction = POOL_FRACTIONS["test"]
    first = reviews.train_test_split(test_size=test_fraction, seed=seed, stratify_by_column="label")
    validation_fraction = POOL_FRACTIONS["validation"] / (1 - test_fraction)
    second = first["train"].train_test_split(
        test_size=validation_fraction, seed=seed, stratify_by_column="label"
    )
    return DatasetDict(train=second["train"], validation=second["test"], test=first["test"])


def counted_pools(
    reviews: Dataset | None = None, tokenizer: PreTrainedTokenizerBase | None = None
) -> DatasetDict:
    """:func:`review_pools` of ``reviews`` (default: the 25,000 IMDB reviews) with their token counts
    (``tokenizer``, default :func:`packaged_tokenizer`)."""
    reviews = reviews if reviews is not None else load_movie_reviews("imdb")
    return review_pools(count_tokens(reviews, tokenizer or packaged_tokenizer()))


def count_tokens(reviews: Dataset, tokenizer: PreTrainedTokenizerBase) -> Dataset:
    """``reviews`` with a ``tokens`` column: each text's token count without special tokens."""

    def counts(batch: dict) -> dict:
        # verbose=False: counting is not feeding a model, so no warning about texts over 512 tokens
        options = {"add_special_tokens": False, "return_attention_mask": False, "verbose": False}
        return {"tokens": [len(row) for row in tokenizer(batch["text"], **options)["input_ids"]]}

    return reviews.map(counts, batched=True, desc="Counting tokens")
