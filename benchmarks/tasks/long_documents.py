"""Long-document classification from real text (IMDB reviews), where reading only a window provably loses.

Two variants, each a ``DatasetDict`` (train / validation / test) of ``text`` and ``label`` (``neg`` / ``pos``)
with the metadata the ceilings need (``review_labels``, ``review_char_spans``, ``review_token_spans``,
``tokens``):

* ``imdb``: IMDB reviews as they are (median 231 tokens, 90th percentile 616, max 3,125 with the MiniLM
  tokenizer), sampled from the split's pool. Truncation loses only on the long tail.
* ``majority3``: a document is three reviews joined by ``" [SEP] "``, its label the majority sentiment of the
  three. The three labels are drawn independently and uniformly, so no review says anything about another's.
  The middle review has at least ``long_review_tokens`` (512) tokens, so no window of 512 tokens (510 of text
  between ``[CLS]`` and ``[SEP]``) touches the first and the third: a reader limited to one such window knows
  at most two of the three sentiments. With two it is right when they agree and flips a coin otherwise, with
  one it is right when that one is the majority: 75% on average, however well it reads each review.

Reviews are used in one split only: IMDB's 25,000 are first cut into train / validation / test pools
(stratified by label, seed 42, 60 / 10 / 30%; ``POOL_FRACTIONS``), and a split's documents draw reviews
without replacement from its pool. The pools of long reviews bound how many distinct ``majority3`` documents
exist (``data_settings.json``'s ``pools`` gives them per label); more raises an error saying so. Documents
hold at most ``max_document_tokens`` tokens (4,096 with ``[CLS]`` and ``[SEP]``): an outer review that would
overflow is passed over.

The separator is ``[SEP]``, not a blank line: BERT's tokenizer reads ``[SEP]`` in text as its one special
token (BERT saw it between segments in pretraining), so the model sees where a review ends, and each
separator is exactly one token, which keeps the review boundaries in tokens exact. A blank line is
whitespace, which BERT's tokenizer drops: the model would see one run of text.

The ceilings (:func:`window_ceiling`): an oracle that knows the true label of every review its window
touches (one token is enough) and answers the majority as well as those labels allow; exact per document
(1 when the known labels settle the majority, 0.5 for a tie it must guess, else 1 or 0 as its best guess is
right), averaged over a split. ``head``: the window a truncating model reads (the first ``max_length - 2``
tokens). ``best``: the window touching the most reviews, chosen from the layout alone (the earliest of
those); a window picked by looking at the labels would not be one window's reading.

Writes the splits as JSON lines for ``scripts/finetune_glue.py`` (``--train_file``, ``--validation_file``,
``--test_file``; ``--text_column_names text``), and ``data_settings.json`` (sizes, pools, ceilings)::

    python -m benchmarks.tasks.long_documents write --variant majority3 --out runs/long_documents/majority3
"""

from __future__ import annotations

import argparse
import json
import math
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from datasets import Dataset, DatasetDict
from transformers import PreTrainedTokenizerBase

from hf_efficient.data.packaged_bert import packaged_tokenizer
from hf_efficient.data.review_pools import POOL_FRACTIONS, POOL_SEED, SPLITS, counted_pools
from hf_efficient.data.text import load_movie_reviews
from hf_efficient.errors import InputError

VARIANTS = ("imdb", "majority3")
LABEL_NAMES = ("neg", "pos")
DEFAULT_SIZES = {"train": 1000, "validation": 200, "test": 500}
MAX_DOCUMENT_TOKENS = 4096
LONG_REVIEW_TOKENS = 512
SEPARATOR = " [SEP] "
REVIEWS_PER_DOCUMENT = 3
SPECIAL_TOKENS = 2  # [CLS] and the final [SEP] that the classifier's tokenizer adds
CEILING_LENGTHS = (128, 512, 2048, 4096)


def check_arguments(variant: str, sizes: dict[str, int], max_document_tokens: int, long_tokens: int) -> None:
    """Raise ``ValueError`` naming the argument, its value and the fix."""
    if variant not in VARIANTS:
        raise InputError(f"variant={variant!r} is not a long-document variant; choose one of {VARIANTS}.")
    unknown = set(sizes) - set(SPLITS)
    if unknown:
        raise InputError(f"sizes has unknown splits {sorted(unknown)}; its keys are {SPLITS}.")
    for split, size in sizes.items():
        if not isinstance(size, int) or size < 1:
            raise InputError(f"sizes[{split!r}]={size!r}: give a positive number of documents.")
    if long_tokens < 1:
        raise InputError(f"long_review_tokens={long_tokens}: give a positive token count (512 by default).")
    shortest = long_tokens + SPECIAL_TOKENS + 2 * (REVIEWS_PER_DOCUMENT - 1)  # + 2 separators, 2 outer tokens
    if variant == "majority3" and max_document_tokens < shortest:
        raise InputError(
            f"max_document_tokens={max_document_tokens} cannot hold a middle review of long_review_tokens="
            f"{long_tokens} and two more: use max_document_tokens >= {shortest}."
        )


def build_long_documents(
    variant: str = "majority3",
    sizes: dict[str, int] | None = None,
    seed: int = 0,
    tokenizer: PreTrainedTokenizerBase | None = None,
    reviews: Dataset | None = None,
    max_document_tokens: int = MAX_DOCUMENT_TOKENS,
    long_review_tokens: int = LONG_REVIEW_TOKENS,
    separator: str = SEPARATOR,
    pools: DatasetDict | None = None,
) -> DatasetDict:
    """The documents of ``variant`` (module docstring), the same for the same arguments.

    Args:
        sizes: documents per split (default ``DEFAULT_SIZES``; a split left out gets its default).
        seed: which documents are drawn (the pools do not depend on it).
        tokenizer: counts tokens (default: all-MiniLM-L6-v2's, :func:`packaged_tokenizer`).
        reviews: ``text`` / ``label`` rows (default: the 25,000 IMDB reviews, offline).
        max_document_tokens: the most tokens of a document, ``[CLS]`` and ``[SEP]`` included.
        long_review_tokens: the fewest tokens of a ``majority3`` middle review.
        separator: between reviews; it must be one token (``[SEP]`` for BERT's tokenizer).
        pools: :func:`counted_pools` already made (then ``reviews`` is not read).

    Raises:
        ValueError: a bad argument, or a pool too small for the sizes asked (the message gives the most).
    """
    sizes = {**DEFAULT_SIZES, **(sizes or {})}
    check_arguments(variant, sizes, max_document_tokens, long_review_tokens)
    tokenizer = tokenizer or packaged_tokenizer()
    separator_tokens = len(tokenizer(separator, add_special_tokens=False)["input_ids"])
    if variant == "majority3" and separator_tokens != 1:
        raise InputError(
            f"separator={separator!r} is {separator_tokens} tokens for this tokenizer; the review boundaries "
            "need a one-token separator (BERT's ' [SEP] ')."
        )
    pools = pools if pools is not None else counted_pools(reviews, tokenizer)
    splits = {}
    for index, split in enumerate(SPLITS):
        rng = np.random.default_rng([seed, index])  # one stream per split: a size changes only its split
        pool = pools[split]
        if variant == "imdb":
            rows = single_reviews(pool, sizes[split], rng, max_document_tokens, split)
        else:
            rows = majority_documents(pool, sizes[split], rng, max_document_tokens, long_review_tokens, split)
        columns = {name: list(pool[name]) for name in ("text", "label", "tokens", "id")}  # lists: fast rows
        splits[split] = Dataset.from_list([document(columns, row, separator) for row in rows])
    return DatasetDict(splits)


def single_reviews(pool: Dataset, size: int, rng, max_document_tokens: int, split: str) -> list[list[int]]:
    """``size`` reviews of the pool (rows), each a one-review document that fits ``max_document_tokens``."""
    fitting = [i for i, n in enumerate(pool["tokens"]) if n + SPECIAL_TOKENS <= max_document_tokens]
    if size > len(fitting):
        raise InputError(
            f"sizes[{split!r}]={size}: the {split} pool has {len(fitting)} reviews; ask for fewer."
        )
    return [[int(i)] for i in rng.permutation(fitting)[:size]]


def majority_documents(
    pool: Dataset, size: int, rng, max_document_tokens: int, long_tokens: int, split: str
) -> list[list[int]]:
    """``size`` documents of three pool rows each: labels drawn uniformly, the middle one long, every review
    used once, each document within ``max_document_tokens``."""
    tokens, labels = np.array(pool["tokens"]), np.array(pool["label"])
    document_labels = rng.integers(0, 2, size=(size, REVIEWS_PER_DOCUMENT))  # independent, uniform
    room = max_document_tokens - SPECIAL_TOKENS - (REVIEWS_PER_DOCUMENT - 1) - 2  # 2 outer tokens at least
    is_long = (tokens >= long_tokens) & (tokens <= room)
    middles = {}
    for label in (0, 1):
        candidates = rng.permutation(np.flatnonzero(is_long & (labels == label)))
        needed = int((document_labels[:, 1] == label).sum())
        if needed > len(candidates):
            most = int(np.flatnonzero(is_long).size)
            raise InputError(
                f"sizes[{split!r}]={size}: its documents need {needed} long {LABEL_NAMES[label]} reviews "
                f"(>= {long_tokens} tokens) and the {split} pool has {len(candidates)} ({most} long reviews "
                f"in all): ask for at most about {most} documents."
            )
        middles[label] = deque(int(i) for i in candidates[:needed])
    used = {i for queue in middles.values() for i in queue}
    outer = {
        label: deque(int(i) for i in rng.permutation(np.flatnonzero(labels == label)) if int(i) not in used)
        for label in (0, 1)
    }
    documents = []
    for first_label, middle_label, last_label in document_labels:
        middle = middles[middle_label].popleft()
        budget = max_document_tokens - SPECIAL_TOKENS - (REVIEWS_PER_DOCUMENT - 1) - int(tokens[middle])
        shortest_last = min((int(tokens[row]) for row in outer[last_label]), default=budget)
        first = take_fitting(outer[first_label], tokens, budget - shortest_last, split)  # room for the last
        last = take_fitting(outer[last_label], tokens, budget - int(tokens[first]), split)
        documents.append([first, middle, last])
    return documents


def take_fitting(queue: deque, tokens: np.ndarray, budget: int, split: str) -> int:
    """The first review of ``queue`` with at most ``budget`` tokens (those passed over go to the back)."""
    for _ in range(len(queue)):
        row = queue.popleft()
        if tokens[row] <= budget:
            return row
        queue.append(row)
    raise InputError(
        f"The {split} pool ran out of outer reviews: ask for fewer documents in sizes[{split!r}]."
    )


def document(pool: dict[str, list], rows: Sequence[int], separator: str) -> dict:
    """One document's row from the pool's columns: the reviews joined by ``separator``, the majority label
    and the metadata."""
    texts = [pool["text"][row] for row in rows]
    review_labels = [int(pool["label"][row]) for row in rows]
    char_spans, token_spans, char, token = [], [], 0, 0
    for i, (text, row) in enumerate(zip(texts, rows, strict=True)):
        if i:  # the separator: len(separator) characters, one token
            char, token = char + len(separator), token + 1
        length = int(pool["tokens"][row])
        char_spans.append([char, char + len(text)])
        token_spans.append([token, token + length])  # positions after [CLS], end excluded
        char, token = char + len(text), token + length
    majority = int(2 * sum(review_labels) > len(review_labels))
    return {
        "text": separator.join(texts),
        "label": LABEL_NAMES[majority],
        "review_labels": review_labels,
        "review_ids": [int(pool["id"][row]) for row in rows],
        "review_char_spans": char_spans,
        "review_token_spans": token_spans,
        "tokens": token + SPECIAL_TOKENS,
    }


# ---- ceilings -------------------------------------------------------------------------------------------
def oracle_accuracy(review_labels: Sequence[int], known: Sequence[int]) -> float:
    """Accuracy on one document of the best guess of the majority label from the labels of the reviews
    ``known`` (indices): 1 or 0 when that guess is settled (right or wrong), 0.5 when the unknown reviews
    leave both answers equally likely (a coin flip). The unknown labels are independent and uniform."""
    count, votes_for_pos = len(review_labels), sum(review_labels[i] for i in known)
    unknown, needed = count - len(known), count // 2 + 1
    # P(majority pos) = P(votes_for_pos + Binomial(unknown, 1/2) >= needed)
    ways = sum(math.comb(unknown, k) for k in range(max(needed - votes_for_pos, 0), unknown + 1))
    probability_pos = ways / 2**unknown
    majority = int(2 * sum(review_labels) > count)
    if probability_pos == 0.5:
        return 0.5
    return float(int(probability_pos > 0.5) == majority)


def touched_reviews(token_spans: Sequence[Sequence[int]], start: int, width: int) -> list[int]:
    """Indices of the reviews with a token in the window ``[start, start + width)`` (text positions)."""
    return [i for i, (first, end) in enumerate(token_spans) if first < start + width and end > start]


def window_reviews(token_spans: Sequence[Sequence[int]], max_length: int, window: str) -> list[int]:
    """The reviews a ``max_length``-token input sees: ``head`` (truncation: the first ``max_length - 2``
    text tokens) or ``best`` (the window touching the most reviews, the earliest of those; from the layout
    alone, not the labels)."""
    width = max_length - SPECIAL_TOKENS
    if width < 1:
        raise InputError(f"max_length={max_length} leaves no text between [CLS] and [SEP]; use >= 3.")
    if window == "head":
        return touched_reviews(token_spans, 0, width)
    if window != "best":
        raise InputError(f"window={window!r}: choose 'head' or 'best'.")
    best: list[int] = []
    for i, (_, end_i) in enumerate(token_spans):
        # a window from review i's last token reaches review j when j starts within it
        reach = [j for j in range(i, len(token_spans)) if token_spans[j][0] <= end_i - 1 + width - 1]
        if len(reach) > len(best):
            best = list(range(i, reach[-1] + 1))
    return best


def window_ceilings(
    documents: Dataset | Sequence[dict], max_length: int, window: str = "head"
) -> list[float]:
    """:func:`oracle_accuracy` of each document for the reviews its window sees (:func:`window_reviews`)."""
    return [
        oracle_accuracy(row["review_labels"], window_reviews(row["review_token_spans"], max_length, window))
        for row in documents
    ]


def window_ceiling(documents: Dataset | Sequence[dict], max_length: int, window: str = "head") -> float:
    """The best accuracy any reader of one ``max_length``-token window can expect on ``documents`` (the mean
    of :func:`window_ceilings`)."""
    values = window_ceilings(documents, max_length, window)
    return float(np.mean(values))


def describe(data: DatasetDict, lengths: Sequence[int] = CEILING_LENGTHS) -> dict:
    """Per split: documents, their token counts, the share longer than each length, and both ceilings."""
    summary = {}
    for split, documents in data.items():
        tokens = np.array(documents["tokens"])
        summary[split] = {
            "documents": len(documents),
            "tokens": {"median": float(np.median(tokens)), "max": int(tokens.max())},
            "longer_than": {str(n): float((tokens > n).mean()) for n in lengths},
            "ceiling_head": {str(n): window_ceiling(documents, n, "head") for n in lengths},
            "ceiling_best_window": {str(n): window_ceiling(documents, n, "best") for n in lengths},
        }
    return summary


def pool_counts(pools: DatasetDict, long_review_tokens: int) -> dict[str, dict]:
    """Per pool: its reviews, and those of at least ``long_review_tokens`` tokens per label (what bounds the
    number of distinct ``majority3`` documents)."""
    counts = {}
    for split, pool in pools.items():
        tokens, labels = np.array(pool["tokens"]), np.array(pool["label"])
        long = {
            name: int(((tokens >= long_review_tokens) & (labels == i)).sum())
            for i, name in enumerate(LABEL_NAMES)
        }
        counts[split] = {"reviews": len(pool), "long_reviews": long}
    return counts


def write_long_documents(out: Path, variant: str = "majority3", **options) -> dict:
    """Write ``<out>/{train,validation,test}.jsonl`` and ``<out>/data_settings.json``; returns the
    settings."""
    pools = counted_pools(options.pop("reviews", None), options.get("tokenizer"))
    data = build_long_documents(variant, pools=pools, **options)
    out.mkdir(parents=True, exist_ok=True)
    for split, documents in data.items():
        documents.to_json(out / f"{split}.jsonl", lines=True)
    settings = {
        "variant": variant,
        "seed": options.get("seed", 0),
        "sizes": {split: len(documents) for split, documents in data.items()},
        "pool_fractions": POOL_FRACTIONS,
        "pool_seed": POOL_SEED,
        "separator": options.get("separator", SEPARATOR),
        "max_document_tokens": options.get("max_document_tokens", MAX_DOCUMENT_TOKENS),
        "long_review_tokens": options.get("long_review_tokens", LONG_REVIEW_TOKENS),
        "pools": pool_counts(pools, options.get("long_review_tokens", LONG_REVIEW_TOKENS)),
        "splits": describe(data),
    }
    (out / "data_settings.json").write_text(json.dumps(settings, indent=1))
    print(json.dumps(settings["splits"]["test"], indent=1))
    print(f"wrote {out}/: train.jsonl, validation.jsonl, test.jsonl, data_settings.json")
    return settings


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that choose the documents (shared with ``benchmarks.studies.long_documents``)."""
    parser.add_argument("--variant", choices=VARIANTS, default="majority3")
    parser.add_argument("--seed", type=int, default=0, help="which documents are drawn")
    for split in SPLITS:
        parser.add_argument(f"--{split}_size", type=int, default=DEFAULT_SIZES[split], help="documents")
    parser.add_argument("--max_reviews", type=int, help="use N IMDB reviews (fixed shuffle; quick checks)")
    parser.add_argument("--max_document_tokens", type=int, default=MAX_DOCUMENT_TOKENS)
    parser.add_argument("--long_review_tokens", type=int, default=LONG_REVIEW_TOKENS)


def data_options(args: argparse.Namespace) -> dict:
    """:func:`build_long_documents`' keyword arguments from :func:`add_data_arguments`' flags."""
    reviews = None
    if args.max_reviews is not None:
        if args.max_reviews < 10:
            raise InputError(f"--max_reviews {args.max_reviews}: use at least 10 (or leave it out: all).")
        imdb = load_movie_reviews("imdb").shuffle(seed=POOL_SEED)  # the file is sorted by label
        reviews = imdb.select(range(min(args.max_reviews, len(imdb))))
    return {
        "sizes": {split: getattr(args, f"{split}_size") for split in SPLITS},
        "seed": args.seed,
        "reviews": reviews,
        "max_document_tokens": args.max_document_tokens,
        "long_review_tokens": args.long_review_tokens,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("write", help="write the splits as JSON lines for finetune_glue.py")
    add_data_arguments(write)
    write.add_argument("--out", type=Path, required=True, help="folder of the .jsonl files")
    args = parser.parse_args(argv)
    return write_long_documents(args.out, args.variant, **data_options(args))


if __name__ == "__main__":
    main()
