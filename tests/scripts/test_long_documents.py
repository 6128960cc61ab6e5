"""A long document from checkpoint to prediction, as a new user meets it (issue 57): the saved tokenizer
says the model's length, data mistakes stop before training with the row, the column and the file, and the
whole path (a zoo build, a fine-tune at 2,048 tokens on a CSV of one's own, a pipeline with remote code in a
process without hf_efficient) reads every token of a long input."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from hf_efficient.errors import InputError

from ..data.helpers import write_csv
from .helpers import COMMON
from .test_argument_errors import tiny_checkpoint  # noqa: F401 (a fixture)


def reviews_csv(path, rows) -> str:
    return write_csv(path, ["review", "verdict"], rows)


def finetune_command(checkpoint, train: str, output_dir, *extra) -> list[str]:
    """finetune_glue.py on a CSV of one's own (columns review, verdict), one step."""
    return [
        *("--model_name_or_path", str(checkpoint), "--train_file", train, "--validation_file", train),
        *("--text_column_names", "review", "--label_column_name", "verdict", "--output_dir", str(output_dir)),
        *("--max_seq_length", "32", "--max_steps", "1", "--save_strategy", "no", *COMMON, *extra),
    ]


ROWS = [["a gripping film", "good"], ["two hours lost", "bad"], ["fine acting", "good"], ["dull", "bad"]]


def test_resized_positions_are_what_the_saved_tokenizer_says(finetune_glue, tiny_checkpoint, tmp_path):  # noqa: F811
    """--resize_position_embeddings to 96 tokens: the saved tokenizer truncates at 96, not at the 64 it was
    loaded with (so pipeline(..., truncation=True) reads what the model reads)."""
    train = reviews_csv(tmp_path / "reviews.csv", ROWS)
    extra = ("--max_seq_length", "96", "--resize_position_embeddings", "True")
    finetune_glue.main(finetune_command(tiny_checkpoint, train, tmp_path / "run", *extra))
    assert AutoTokenizer.from_pretrained(tiny_checkpoint).model_max_length != 96
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["max_position_embeddings"] == 96
    assert AutoTokenizer.from_pretrained(tmp_path / "run").model_max_length == 96


def test_a_label_column_of_one_class_is_refused(finetune_glue, tiny_checkpoint, tmp_path):  # noqa: F811
    train = reviews_csv(tmp_path / "reviews.csv", [[text, "good"] for text, _ in ROWS])
    expected = r"--train_file .*reviews.csv: the label column 'verdict' holds one class, 'good', in all 4"
    with pytest.raises(InputError, match=expected + " rows; a classifier needs two classes or more"):
        finetune_glue.main(finetune_command(tiny_checkpoint, train, tmp_path / "run"))


def test_an_empty_text_cell_is_refused_with_its_row_column_and_file(finetune_glue, tiny_checkpoint, tmp_path):  # noqa: F811
    train = reviews_csv(tmp_path / "reviews.csv", ROWS)
    dev = reviews_csv(tmp_path / "dev.csv", [*ROWS[:2], ["", "good"], ROWS[3]])  # row 3's review is empty
    command = finetune_command(tiny_checkpoint, train, tmp_path / "run")
    command[command.index("--validation_file") + 1] = dev
    expected = r"--validation_file .*dev.csv, column 'review': row 3 \(counting data rows from 1\) holds"
    with pytest.raises(InputError, match=expected + r" no text \(empty\); 1 of the 4 rows hold none"):
        finetune_glue.main(command)
