"""hf_efficient.data.question_answering: SQuAD files in their three forms, run_qa.py's columns, answer checks,
training windows whose positions point at the answer (or [CLS]), and the post-processing of logits into
answers (n-best, max answer length, SQuAD 2.0's null answer) and SQuAD's scores."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from datasets import Dataset

from hf_efficient.data.packaged_bert import packaged_tokenizer
from hf_efficient.data.question_answering import (
    QAColumns,
    answer_questions,
    check_question_records,
    load_squad_files,
    question_windows,
    squad_scores,
)
from hf_efficient.errors import InputError

FILLER = "The film opened in a small town and nobody cared much about the plot or the cast at all. "
CONTEXT = FILLER * 6 + "The director was Maria Lopez from Madrid. " + FILLER * 4
ANSWER = "Maria Lopez"
ROWS = [
    {
        "id": "a",
        "title": "t",
        "context": CONTEXT,
        "question": "Who was the director?",
        "answers": {"text": [ANSWER], "answer_start": [CONTEXT.index(ANSWER)]},
    },
    {
        "id": "b",
        "title": "t",
        "context": CONTEXT,
        "question": "Who sang?",
        "answers": {"text": [], "answer_start": []},
    },
]
WINDOWS = dict(columns=QAColumns(), max_length=64, doc_stride=16)


@pytest.fixture(scope="module")
def tokenizer():
    return packaged_tokenizer()


def test_three_file_forms_load_the_same_rows(tmp_path):
    (tmp_path / "q.jsonl").write_text("\n".join(json.dumps(row) for row in ROWS))
    (tmp_path / "flat.json").write_text(json.dumps({"data": ROWS}))
    qas = [
        {"id": row["id"], "question": row["question"], "answers": [
            {"text": text, "answer_start": start}
            for text, start in zip(*row["answers"].values(), strict=True)
        ]}
        for row in ROWS
    ]  # fmt: skip
    nested = {"data": [{"title": "t", "paragraphs": [{"context": CONTEXT, "qas": qas}]}]}  # SQuAD's own form
    (tmp_path / "squad.json").write_text(json.dumps(nested))
    files = {"train": "q.jsonl", "validation": "flat.json", "test": "squad.json"}
    loaded = load_squad_files({split: str(tmp_path / name) for split, name in files.items()})
    for split in files:
        assert [{k: row[k] for k in ROWS[0]} for row in loaded[split]] == ROWS, split


def test_file_errors_name_the_flag(tmp_path):
    with pytest.raises(FileNotFoundError, match="--validation_file .*nope.json: no such file"):
        load_squad_files({"validation": str(tmp_path / "nope.json")})
    (tmp_path / "q.csv").write_text("question,context\n")
    with pytest.raises(InputError, match=r"--train_file .*q.csv: question answering reads SQuAD-format"):
        load_squad_files({"train": str(tmp_path / "q.csv")})
    (tmp_path / "bad.json").write_text(json.dumps({"version": 2}))
    with pytest.raises(InputError, match="in a non-empty list under 'data'"):
        load_squad_files({"test": str(tmp_path / "bad.json")})


def test_columns_as_run_qa_finds_them_and_answer_checks():
    data = Dataset.from_list(ROWS)
    assert QAColumns.of(data) == QAColumns("question", "context", "answers")
    renamed = Dataset.from_dict({"q": ["x"], "c": ["y"], "a": [{"text": [], "answer_start": []}]})
    assert QAColumns.of(renamed) == QAColumns("q", "c", "a", None)  # the first, second and third column
    with pytest.raises(
        InputError, match=r"no question column 'ask'; its columns are .*--question_column_name"
    ):
        QAColumns.of(data, question="ask")


BAD_RECORDS = {  # {case: (the second record, what the error says of it)}
    "no question": (
        {key: value for key, value in ROWS[1].items() if key != "question"},
        r"record 2 \(id 'b'\): 'question' holds no question \(no such key\); every record needs a question",
    ),
    "an empty context": (
        {**ROWS[1], "context": " "},
        r"record 2 \(id 'b'\): 'context' holds no context \(str ' '\)",
    ),
    "answers as scalars": (
        {**ROWS[0], "id": "b", "answers": {"text": ANSWER, "answer_start": CONTEXT.index(ANSWER)}},
        r"record 2 \(id 'b'\): 'answers' must be \{'text': \[...\], 'answer_start': \[...\]\} \(SQuAD's "
        r"format.*: write \{'text': \['Maria Lopez'\], 'answer_start': \[551\]\}\.$",
    ),
    "an answer at another offset": (
        {**ROWS[0], "id": "b", "answers": {"text": [ANSWER], "answer_start": [3]}},
        r"record 2 \(id 'b'\): the answer 'Maria Lopez' is not at answer_start=3 of its context",
    ),
    "an id used twice": (
        {**ROWS[1], "id": "a"},
        r"record 2 \(id 'a'\): the id 'a' is also record 1's; each question needs its own id",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_every_record_is_checked(case, tmp_path):
    """A JSON lines record without its question failed in the tokenizer ("You need to specify either `text`
    or `text_target`"), answers as scalars in the answer check itself (TypeError), and a repeated id kept one
    of the two questions' answers in the predictions."""
    record, message = BAD_RECORDS[case]
    (tmp_path / "q.jsonl").write_text("\n".join(json.dumps(row) for row in (ROWS[0], record)))
    data = load_squad_files({"train": str(tmp_path / "q.jsonl")})["train"]
    with pytest.raises(InputError, match=rf"^--train_file q.jsonl, {message}"):
        check_question_records(data, QAColumns.of(data), "--train_file q.jsonl")


def test_squad_json_without_a_question_is_named(tmp_path):
    qas = [{"id": "x", "answers": []}]
    nested = {"data": [{"title": "t", "paragraphs": [{"context": CONTEXT, "qas": qas}]}]}
    (tmp_path / "squad.json").write_text(json.dumps(nested))
    data = load_squad_files({"validation": str(tmp_path / "squad.json")})["validation"]
    with pytest.raises(InputError, match=r"^v, record 1 \(id 'x'\): 'question' holds no question"):
        check_question_records(data, QAColumns.of(data), "v")


def test_questions_without_ids_are_said_or_named(caplog):
    """Without an id column the predictions are keyed "0", "1", ...: said once; --id_column_name names one."""
    rows = [{key: value for key, value in row.items() if key != "id"} for row in ROWS]
    with caplog.at_level(logging.INFO, logger="hf_efficient"):
        columns = QAColumns.of(Dataset.from_list(rows))
    assert columns.id is None
    said = [r.getMessage() for r in caplog.records if r.name.startswith("hf_efficient")]
    assert len(said) == 1 and "keyed by row number" in said[0] and "--id_column_name" in said[0]
    named = Dataset.from_list([{**row, "qid": f"q{i}"} for i, row in enumerate(rows)])
    assert QAColumns.of(named, id="qid").id == "qid"
    with pytest.raises(InputError, match=r"no id column 'key'; its columns are .*--id_column_name"):
        QAColumns.of(named, id="key")


def test_training_windows_point_at_the_answer_or_cls(tokenizer):
    features = question_windows(Dataset.from_list(ROWS), tokenizer=tokenizer, training=True, **WINDOWS)
    assert len(features) > 4 and all(len(ids) <= 64 for ids in features["input_ids"])
    found = 0
    for ids, start, end in zip(
        features["input_ids"], features["start_positions"], features["end_positions"], strict=True
    ):
        if start:
            assert tokenizer.decode(ids[start : end + 1]) == ANSWER.lower()
            found += 1
        else:
            assert end == 0
    assert found >= 1  # the answer's windows; every other window of "a", and all of "b" (no answer): [CLS]
    padded = question_windows(
        Dataset.from_list(ROWS), tokenizer, padding="max_length", training=True, **WINDOWS
    )
    assert {len(ids) for ids in padded["input_ids"]} == {64}


def logits_for(features, tokenizer, answer_start: int, answer_end: int, null: float = 0.0):
    """Logits that score the characters [answer_start, answer_end) highest in every window holding them,
    and [CLS] at ``null``."""
    n = max(len(ids) for ids in features["input_ids"])
    start, end = np.full((len(features), n), -5.0), np.full((len(features), n), -5.0)
    for row, offsets in enumerate(features["offset_mapping"]):
        start[row, 0] = end[row, 0] = null / 2
        for i, offset in enumerate(offsets):
            if offset is not None and offset[0] == answer_start:
                start[row, i] = 5.0
            if offset is not None and offset[1] == answer_end:
                end[row, i] = 5.0
    return start, end


def test_logits_become_answers_and_scores(tokenizer):
    examples = Dataset.from_list(ROWS)
    features = question_windows(examples, tokenizer=tokenizer, **WINDOWS)
    assert set(features["example_id"]) == {"a", "b"} and len(features) > 4
    first = CONTEXT.index(ANSWER)
    start, end = logits_for(features, tokenizer, first, first + len(ANSWER))
    answers, nbest, null_odds = answer_questions(examples, features, start, end, n_best_size=5)
    assert answers["a"] == ANSWER and answers["b"] == ANSWER  # without SQuAD 2.0, "b" gets a span too
    assert len(nbest["a"]) == 5 and nbest["a"][0]["answer"] == ANSWER and not null_odds
    assert sum(c["probability"] for c in nbest["a"]) == pytest.approx(1.0)
    short, _, _ = answer_questions(examples, features, start, end, max_answer_length=1)
    assert short["a"] in ("Maria", "Lopez")  # two tokens do not fit: the best one-token span
    scores = squad_scores(examples.select([0]), answers, QAColumns(), version_2_with_negative=False)
    assert scores == {"exact_match": 100.0, "f1": 100.0}
    # SQuAD 2.0: a null score (15) above the span's (10) by more than the threshold answers "".
    start, end = logits_for(features, tokenizer, first, first + len(ANSWER), null=15.0)
    v2 = dict(version_2_with_negative=True)
    answers, _, null_odds = answer_questions(examples, features, start, end, **v2)
    assert answers == {"a": "", "b": ""} and null_odds["a"] == pytest.approx(5.0)
    answers, _, _ = answer_questions(examples, features, start, end, null_score_diff_threshold=6.0, **v2)
    assert answers["a"] == ANSWER
    scores = squad_scores(examples, answers, QAColumns(), version_2_with_negative=True)
    assert scores["HasAns_exact"] == 100.0 and scores["NoAns_total"] == 1
