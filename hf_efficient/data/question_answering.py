"""Extractive question answering data in SQuAD's format: loading, training and evaluation features, and the
post-processing of a model's start / end logits into answers and SQuAD's scores.

A question is a row ``{"id", "question", "context", "answers": {"text": [...], "answer_start": [...]}}``
(character offsets into the context; no answer text: unanswerable, SQuAD 2.0). Files are JSON lines of such
rows, a JSON file whose ``data`` holds them (the flat form transformers' ``run_qa.py`` reads), or SQuAD's
official nested JSON (``data`` -> ``paragraphs`` -> ``qas``). The columns are found as ``run_qa.py`` finds
them: ``question``, ``context`` and ``answers`` when present, else the first, second and third column; the
``*_column_name`` arguments name others.

A context longer than the window is read in windows that overlap by ``doc_stride`` tokens
(:func:`~hf_efficient.models.text.question_answering.encode_windows`); each window is one *feature*. Training
features carry the answer's first and last token, or ``[CLS]`` (token 0) when the window does not hold the
whole answer or there is none; evaluation features carry their question's id and the characters of each
context token, which :func:`answer_questions` uses to turn the best spans of all of a question's windows
into its answer.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow
from datasets import Dataset, DatasetDict
from transformers import PreTrainedTokenizerBase

from ..errors import InputError
from ..models.text.question_answering import Span, encode_windows, span_candidates
from ..training.arguments import first_examples
from ..training.metrics import load_metric
from .files import check_data_files, load_data_files

SPLIT_FLAGS = {"train": "--train_file", "validation": "--validation_file", "test": "--test_file"}
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class QAColumns:
    """The question, context, answers and id columns of a dataset (run_qa.py's inference, or named)."""

    question: str = "question"
    context: str = "context"
    answers: str = "answers"
    id: str | None = "id"

    @classmethod
    def of(
        cls,
        data: Dataset,
        question: str | None = None,
        context: str | None = None,
        answers: str | None = None,
        id: str | None = None,  # noqa: A002 (the column's role, as run_qa.py's "id")
    ) -> QAColumns:
        """The columns of ``data``: the names given, else ``question`` / ``context`` / ``answers`` when
        present, else the first / second / third column (as run_qa.py); ``answers`` may be absent in data to
        predict only. The id column is ``id`` when there is one; without, the questions are keyed by their
        row number ("0", "1", ...), which is said once (the predictions then name no question of the data).

        Raises:
            InputError: a named or inferred column that is not there.
        """
        names = data.column_names
        chosen = {}
        for position, (role, given) in enumerate(
            (("question", question), ("context", context), ("answers", answers))
        ):
            default = role if role in names else names[position] if position < len(names) else role
            chosen[role] = given or default
        missing = [
            f"{role} column {name!r}"
            for role, name in chosen.items()
            if name not in names and role != "answers"
        ]
        if id is not None and id not in names:
            missing.append(f"id column {id!r}")
        if missing:
            raise InputError(
                f"The data has no {', '.join(missing)}; its columns are {names}. Name them with "
                "--question_column_name / --context_column_name / --answer_column_name / --id_column_name."
            )
        if id is None and "id" not in names:
            logger.info(
                "the questions have no 'id' column (columns %s): their answers are keyed by row number "
                '("0", "1", ...) in the predictions; name the id column with --id_column_name',
                names,
            )
        return cls(**chosen, id=id or ("id" if "id" in names else None))

    def has_answers(self, data: Dataset) -> bool:
        return self.answers in data.column_names


def load_squad_files(files: dict[str, str]) -> DatasetDict:
    """``{split: path}`` of SQuAD-format files (``.jsonl``, ``.json``: flat rows under ``data``, or SQuAD's
    nested JSON) as a ``DatasetDict``.

    Raises:
        InputFileNotFoundError / InputError: a missing or empty file, or one in neither format (naming its
            flag).
    """
    flags = {split: SPLIT_FLAGS.get(split, f"--{split}_file") for split in files}
    check_data_files({flags[split]: path for split, path in files.items()})
    loaded = {}
    for split, path in files.items():
        suffix, where = Path(path).suffix.lower(), f"{flags[split]} {path}"
        if suffix not in (".json", ".jsonl"):
            raise InputError(
                f"{where}: question answering reads SQuAD-format .json or .jsonl files, not "
                f"{suffix or 'files without a suffix'}."
            )
        try:
            if suffix == ".jsonl":
                loaded[split] = load_data_files("json", {split: (flags[split], [path])})[split]
            else:
                loaded[split] = Dataset.from_list(_squad_json_rows(Path(path), flags[split]))
        except (InputError, pyarrow.ArrowException, TypeError) as error:
            # records of other shapes (answers as a scalar in one row, lists in the others) do not make
            # one table: the first record that is not a question says which
            rows = _records(Path(path), flags[split], suffix)
            if rows is None:
                raise
            view = _Records(rows)
            check_question_records(view, QAColumns.of(view), where)
            raise InputError(f"{where} cannot be read: {error}") from error
    return DatasetDict(loaded)


def _records(path: Path, flag: str, suffix: str) -> list[dict] | None:
    """The question records of ``path`` as Python objects, or None where they do not parse."""
    if suffix == ".json":
        return _squad_json_rows(path, flag)
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except ValueError:
        return None


class _Records:
    """Records (dicts) with a ``Dataset``'s column access, for :func:`check_question_records`: a record
    without a column holds None there."""

    def __init__(self, rows: list[dict]):
        self.rows = [row if isinstance(row, dict) else {} for row in rows]
        self.column_names = list(dict.fromkeys(key for row in self.rows for key in row))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, column: str) -> list:
        return [row.get(column) for row in self.rows]


def _squad_json_rows(path: Path, flag: str) -> list[dict]:
    """The flat question rows of a SQuAD JSON file: ``{"data": [rows]}`` (run_qa.py's) or SQuAD's nested
    ``{"data": [{"title", "paragraphs": [{"context", "qas": [...]}]}]}``."""
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise InputError(
            f"{flag} {path} is not valid JSON ({error}); JSON lines go in a .jsonl file."
        ) from None
    rows = content.get("data") if isinstance(content, dict) else None
    if not isinstance(rows, list) or not rows:
        raise InputError(
            f"{flag} {path}: a SQuAD JSON file holds its questions in a non-empty list under 'data' (one row "
            "per question, or SQuAD's titles -> paragraphs -> qas)."
        )
    if not isinstance(rows[0], dict) or "paragraphs" not in rows[0]:
        return rows
    flat = []
    for article in rows:
        for paragraph in article.get("paragraphs") or []:
            for qa in paragraph.get("qas") or []:
                answers = qa.get("answers", [])
                if isinstance(answers, list) and all(isinstance(a, dict) for a in answers):
                    answers = {
                        "text": [a.get("text") for a in answers],
                        "answer_start": [a.get("answer_start") for a in answers],
                    }
                flat.append(
                    {
                        "id": str(qa.get("id", len(flat))),
                        "title": article.get("title", ""),
                        "context": paragraph.get("context"),
                        "question": qa.get("question"),
                        "answers": answers,
                    }
                )
    return flat


ANSWERS_FORMAT = "{'text': [...], 'answer_start': [...]} (SQuAD's format: a list of texts, their offsets)"


def check_question_records(data: Dataset, columns: QAColumns, where: str) -> None:
    """Every record of ``data`` (read from ``where``: ``--train_file q.jsonl``) has a question and a context
    (non-empty text), a unique id when it has an id column, and, when it has answers, SQuAD's answers whose
    texts sit at their offsets in the context (a wrong offset would train the model on the wrong span).

    Raises:
        InputError: the first record that is not so, by its number (from 1: the line of a JSON lines file),
            what it holds and the fix.
    """
    answers = data[columns.answers] if columns.has_answers(data) else [None] * len(data)
    ids = data[columns.id] if columns.id is not None else [None] * len(data)
    seen: dict = {}
    rows = zip(data[columns.question], data[columns.context], answers, ids, strict=True)
    for number, (question, context, answer, key) in enumerate(rows, start=1):
        record = f"{where}, record {number}" + (f" (id {key!r})" if key is not None else "")
        for role, value in (("question", question), ("context", context)):
            if not isinstance(value, str) or not value.strip():
                found = "no such key" if value is None else f"{type(value).__name__} {value!r:.40}"
                raise InputError(
                    f"{record}: {getattr(columns, role)!r} holds no {role} ({found}); every record needs a "
                    f"{role} text (--{role}_column_name names the column)."
                )
        if key is not None and key in seen:
            raise InputError(
                f"{record}: the id {key!r} is also record {seen[key]}'s; each question needs its own id (its "
                "answer is saved and scored under it)."
            )
        seen[key] = number
        if columns.has_answers(data):
            _check_answer(answer, context, record, columns.answers)


def _check_answer(answers, context: str, record: str, column: str) -> None:
    """One record's answers: SQuAD's lists of texts and offsets, each text at its offset in ``context``."""
    texts = answers.get("text") if isinstance(answers, dict) else None
    starts = answers.get("answer_start") if isinstance(answers, dict) else None
    if not (isinstance(texts, list) and isinstance(starts, list) and len(texts) == len(starts)):
        hint = ""
        if isinstance(texts, str) and isinstance(starts, int):  # one answer written without its lists
            hint = f": write {{'text': [{texts!r:.40}], 'answer_start': [{starts}]}}"
        raise InputError(f"{record}: {column!r} must be {ANSWERS_FORMAT}, got {answers!r:.80}{hint}.")
    for text, start in zip(texts, starts, strict=True):
        if not isinstance(text, str) or isinstance(start, bool) or not isinstance(start, int):
            raise InputError(
                f"{record}: {column!r} holds the answer text {text!r:.40} at answer_start {start!r}: a text "
                "and a character offset (an int from 0) are needed."
            )
        if context[start : start + len(text)] != text:
            raise InputError(
                f"{record}: the answer {text!r:.60} is not at answer_start={start} of its context (found "
                f"{context[start : start + len(text)]!r:.60}); answer_start counts characters from 0."
            )


def question_ids(examples: Dataset, id_column: str | None = "id") -> list[str]:
    """The questions' ids (``id_column``), or their row numbers where there is none."""
    if id_column is not None and id_column in examples.column_names:
        return [str(key) for key in examples[id_column]]
    return [str(i) for i in range(len(examples))]


def question_windows(
    examples: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    columns: QAColumns,
    max_length: int,
    doc_stride: int,
    padding: bool | str = False,
    training: bool = False,
    **map_options,
) -> Dataset:
    """One row per window (:func:`encode_windows`) of each question: the model's inputs and

    * ``training``: ``start_positions`` / ``end_positions``, the first answer's first and last token in the
      window, or 0 (``[CLS]``) when the window does not hold all of it or the question has none (SQuAD 2.0);
    * else ``example_id`` (the question's ``id``, or its row) and ``offset_mapping`` (each token's characters
      in the context, None outside it), what :func:`answer_questions` reads.
    """
    ids = question_ids(examples, columns.id)

    def featurize(batch: dict, rows: list[int]) -> dict:
        encoded = encode_windows(
            tokenizer, batch[columns.question], batch[columns.context], max_length, doc_stride, padding
        )
        questions = encoded.pop("overflow_to_sample_mapping")  # the question (in the batch) of each window
        if not training:
            return {**encoded, "example_id": [ids[rows[q]] for q in questions]}
        spans = [
            _token_span(offsets, batch[columns.answers][q])
            for q, offsets in zip(questions, encoded.pop("offset_mapping"), strict=True)
        ]
        return {**encoded, "start_positions": [s for s, _ in spans], "end_positions": [e for _, e in spans]}

    description = f"Windows of the {'training ' if training else ''}questions"
    return examples.map(
        featurize, batched=True, with_indices=True, remove_columns=examples.column_names, desc=description,
        **map_options,
    )  # fmt: skip


def _token_span(offsets: list, answers: dict) -> tuple[int, int]:
    """The first and last context token of the first answer, or (0, 0) when the window lacks part of it."""
    if not answers["text"]:
        return 0, 0
    first = answers["answer_start"][0]
    last = first + len(answers["text"][0])
    tokens = [i for i, offset in enumerate(offsets) if offset is not None]
    if offsets[tokens[0]][0] > first or offsets[tokens[-1]][1] < last:
        return 0, 0
    start = max(i for i in tokens if offsets[i][0] <= first)
    end = min(i for i in tokens if offsets[i][1] >= last)
    return start, end


def answer_questions(
    examples: Dataset,
    features: Dataset,
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    version_2_with_negative: bool = False,
    null_score_diff_threshold: float = 0.0,
    context_column: str = "context",
    id_column: str | None = "id",
) -> tuple[dict[str, str], dict[str, list[dict]], dict[str, float]]:
    """Each question's answer from the logits of its windows (features in any order, several per question).

    The candidates of every window (:func:`span_candidates`: spans of context tokens, at most
    ``max_answer_length`` long, scored start logit + end logit) compete; the best is the answer. With
    ``version_2_with_negative`` the null answer's score is the lowest ``[CLS]`` score (start + end) over the
    question's windows, and the answer is "" when that exceeds the best span's score by more than
    ``null_score_diff_threshold`` (as SQuAD 2.0's official evaluation, and run_qa.py).

    Returns:
        (answers ``{id: text}``, n-best ``{id: [{"answer", "score", "start", "end", "probability"}...]}``,
        null-odds ``{id: null score - best span score}`` (SQuAD 2.0; empty otherwise)).
    """
    by_example = defaultdict(list)
    for index, example_id in enumerate(features["example_id"]):
        by_example[example_id].append(index)
    ids = question_ids(examples, id_column)
    answers, nbest, null_odds = {}, {}, {}
    offsets = features["offset_mapping"]
    for example_id, context in zip(ids, examples[context_column], strict=True):
        candidates, null = {}, float("inf")
        for index in by_example[example_id]:
            null = min(null, float(start_logits[index][0] + end_logits[index][0]))
            for span in span_candidates(
                start_logits[index], end_logits[index], offsets[index], n_best_size, max_answer_length
            ):
                key = (span.start, span.end)
                candidates[key] = max(candidates.get(key, span), span, key=lambda s: s.score)
        ranked = sorted(candidates.values(), key=lambda s: s.score, reverse=True)[:n_best_size]
        if version_2_with_negative:
            ranked = sorted([*ranked, Span(null, 0, 0)], key=lambda s: s.score, reverse=True)
        best = next((s for s in ranked if s.end > s.start), Span(float("-inf"), 0, 0))
        answers[example_id] = context[best.start : best.end]
        if version_2_with_negative:
            null_odds[example_id] = null - best.score
            if null - best.score > null_score_diff_threshold:
                answers[example_id] = ""
        scores = np.array([s.score for s in ranked]) if ranked else np.zeros(1)
        probabilities = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
        nbest[example_id] = [
            {**s.answer(context), "probability": float(p)}
            for s, p in zip(ranked, probabilities, strict=False)
        ]
    return answers, nbest, null_odds


def squad_scores(
    examples: Dataset, answers: dict[str, str], columns: QAColumns, version_2_with_negative: bool
) -> dict[str, float]:
    """SQuAD's exact match and F1 of ``answers`` (``squad`` or, with ``version_2_with_negative``,
    ``squad_v2``: the shipped ``evaluate`` modules)."""
    ids = question_ids(examples, columns.id)
    predictions = [{"id": i, "prediction_text": answers[i]} for i in ids]
    if version_2_with_negative:
        predictions = [{**p, "no_answer_probability": 0.0} for p in predictions]
    references = [
        {"id": i, "answers": {"text": list(a["text"]), "answer_start": list(a["answer_start"])}}
        for i, a in zip(ids, examples[columns.answers], strict=True)
    ]
    metric = load_metric("squad_v2" if version_2_with_negative else "squad")
    return metric.compute(predictions=predictions, references=references)


def write_answers(
    output_dir: str | Path, prefix: str, answers: dict, nbest: dict, null_odds: dict
) -> list[Path]:
    """``<prefix>_predictions.json`` ({id: answer}), ``<prefix>_nbest_predictions.json`` and, for SQuAD 2.0,
    ``<prefix>_null_odds.json`` in ``output_dir`` (run_qa.py's files)."""
    output_dir = Path(output_dir)
    written = []
    for name, content in (("predictions", answers), ("nbest_predictions", nbest), ("null_odds", null_odds)):
        if name == "null_odds" and not content:
            continue
        path = output_dir / f"{prefix}_{name}.json"
        path.write_text(json.dumps(content, indent=1, ensure_ascii=False), encoding="utf-8")
        written.append(path)
    return written


def load_question_answering_data(
    dataset_name: str | None = None,
    dataset_config_name: str | None = None,
    train_file: str | None = None,
    validation_file: str | None = None,
    test_file: str | None = None,
    cache_dir: str | None = None,
) -> DatasetDict:
    """The splits to train, evaluate and predict on: a dataset by name (``datasets.load_dataset``: a hub id
    such as ``rajpurkar/squad``, or a local folder) or SQuAD-format files (:func:`load_squad_files`)."""
    import datasets

    files = {
        s: f for s, f in (("train", train_file), ("validation", validation_file), ("test", test_file)) if f
    }
    if dataset_name is not None:
        raw = datasets.load_dataset(dataset_name, dataset_config_name, cache_dir=cache_dir)
        return DatasetDict({**raw, **load_squad_files(files)}) if files else raw
    if not files:
        raise InputError(
            "Give the questions: --train_file / --validation_file / --test_file (SQuAD-format .json or "
            ".jsonl, e.g. python -m hf_efficient.data.long_qa write --out runs/long_qa), or --dataset_name."
        )
    return load_squad_files(files)


def predict_answers(
    trainer, examples: Dataset, features: Dataset, columns: QAColumns, prefix: str, **post_processing
) -> dict[str, float]:
    """The answers of ``examples`` from the model of ``trainer`` (a ``Trainer``) run on their ``features``
    (:func:`question_windows`): written to ``<output_dir>/<prefix>_predictions.json`` (and the n-best /
    null-odds files, :func:`write_answers`), scored by SQuAD's exact match and F1 where the examples have
    answers, logged and saved as ``<prefix>_results.json``.

    Args:
        post_processing: :func:`answer_questions`' ``n_best_size``, ``max_answer_length``,
            ``version_2_with_negative``, ``null_score_diff_threshold``.
    """
    output = trainer.predict(features, metric_key_prefix=prefix)
    start_logits, end_logits = output.predictions[:2]  # (features, n), padded across batches with -100
    answers, nbest, null_odds = answer_questions(
        examples,
        features,
        start_logits,
        end_logits,
        context_column=columns.context,
        id_column=columns.id,
        **post_processing,
    )
    metrics = {**output.metrics, f"{prefix}_samples": len(examples)}
    if columns.has_answers(examples):
        scores = squad_scores(
            examples, answers, columns, post_processing.get("version_2_with_negative", False)
        )
        metrics.update({f"{prefix}_{name}": value for name, value in scores.items()})
    if trainer.is_world_process_zero():
        write_answers(trainer.args.output_dir, prefix, answers, nbest, null_odds)
    trainer.log_metrics(prefix, metrics)
    trainer.save_metrics(prefix, metrics)
    return metrics


SAMPLE_FLAGS = {"train": "max_train_samples", "validation": "max_eval_samples", "test": "max_predict_samples"}
PHASE_FLAGS = {"train": "--do_train", "validation": "--do_eval", "test": "--do_predict"}


def question_answering_features(
    raw: DatasetDict,
    splits: list[str],
    columns: QAColumns,
    limits: dict[str, int | None] | None = None,
    required: list[str] | None = None,
    sources: dict[str, str] | None = None,
    **windows,
) -> tuple[dict[str, Dataset], Dataset | None, dict[str, Dataset]]:
    """What a run reads: the questions of ``splits`` (train / validation / test, capped by ``limits``, the
    ``--max_*_samples`` per split), every record checked (:func:`check_question_records`), the training
    windows (capped again by the training limit, as run_qa.py caps its features) and the evaluation windows
    of the other splits.

    Args:
        required: the splits whose absence is an error (a phase flag given); the others of ``splits`` (the
            scripts' default phases) are read where the data has them. None: all of ``splits``.
        sources: ``{split: what it was read from}`` (``--train_file q.jsonl``) for the messages.
        windows: :func:`question_windows`' ``tokenizer``, ``max_length``,
            ``doc_stride``, ``padding`` and ``datasets.map`` options.

    Returns:
        (questions per split, training features or None, evaluation features per split but train).

    Raises:
        InputError: a split a phase needs that the data lacks, training questions without answers, or a
            record that is not a question (:func:`check_question_records`).
    """
    limits = limits or {}
    for split in splits:
        if split not in raw and split in (splits if required is None else required):
            raise InputError(
                f"{PHASE_FLAGS[split]} needs the {split} questions: give --{split}_file (or a --dataset_name "
                f"with a {split!r} split); the data has {list(raw)}."
            )
    splits = [split for split in splits if split in raw]
    examples = {split: first_examples(raw[split], limits.get(split), SAMPLE_FLAGS[split]) for split in splits}
    for split, rows in examples.items():
        check_question_records(rows, columns, (sources or {}).get(split, f"the {split} questions"))
        if split == "train" and not columns.has_answers(rows):
            raise InputError(
                f"The training questions have no {columns.answers!r} column; their columns are "
                f"{rows.column_names}: name it with --answer_column_name."
            )
    train = None
    if "train" in examples:
        train = question_windows(examples["train"], columns=columns, training=True, **windows)
        train = first_examples(train, limits.get("train"), SAMPLE_FLAGS["train"])
    features = {
        split: question_windows(rows, columns=columns, **windows)
        for split, rows in examples.items()
        if split != "train"
    }
    return examples, train, features
