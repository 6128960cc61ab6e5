"""scripts/finetune_qa.py on the long-document QA set (answers past token 512) with a tiny checkpoint read by
Longformer attention: training windows, SQuAD 1.1 and 2.0 scores, predictions in the output folder, the saved
model answering through pipeline("question-answering") in one window, and the errors of wrong flags."""

from __future__ import annotations

import json
import logging

import pytest
from transformers import pipeline

from hf_efficient.data.long_qa import main as write_long_qa
from hf_efficient.data.packaged_bert import packaged_tokenizer
from hf_efficient.errors import InputError

from ..tiny_models import save_tiny_bert
from .helpers import COMMON

LONGFORMER = ["--attention_type", "longformer", "--attention_config"]
LONGFORMER += ['{"attention_window": 32, "global_token_indices": [0]}']


@pytest.fixture(scope="module")
def long_qa(tmp_path_factory) -> dict[str, str]:
    """The long-document QA files: 4 training, 3 validation and 2 test questions (a third unanswerable),
    contexts of at most 1,000 tokens, answers past token 512."""
    folder = tmp_path_factory.mktemp("long_qa")
    args = ["write", "--out", str(folder), "--max_reviews", "300", "--max_context_tokens", "1000"]
    write_long_qa([*args, "--train_size", "4", "--validation_size", "3", "--test_size", "2", "--seed", "3"])
    return {split: str(folder / f"{split}.jsonl") for split in ("train", "validation", "test")}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny BERT (1 layer, hidden 32) with 1,024 positions and all-MiniLM-L6-v2's tokenizer."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"), packaged_tokenizer(), max_positions=1024)


def qa_args(long_qa, checkpoint, output_dir, *extra) -> list[str]:
    args = ["--model_name_or_path", str(checkpoint), "--output_dir", str(output_dir), *LONGFORMER]
    args += ["--train_file", long_qa["train"], "--validation_file", long_qa["validation"]]
    args += ["--max_seq_length", "1024", "--max_steps", "2", "--per_device_train_batch_size", "2"]
    return [*args, *COMMON, *extra]


def test_train_evaluate_predict_and_answer_in_one_window(finetune_qa, long_qa, checkpoint, tmp_path):
    out = tmp_path / "run"
    args = qa_args(long_qa, checkpoint, out, "--test_file", long_qa["test"], "--do_train", "--do_eval")
    metrics = finetune_qa.main([*args, "--do_predict", "--version_2_with_negative"])
    assert {"eval_exact", "eval_f1", "eval_HasAns_f1", "eval_total"} <= set(metrics) and metrics[
        "eval_total"
    ] == 3
    assert 0 <= metrics["eval_f1"] <= 100
    validation = [json.loads(line) for line in open(long_qa["validation"])]
    predictions = json.loads((out / "eval_predictions.json").read_text())
    assert set(predictions) == {row["id"] for row in validation}
    for row in validation:  # every answer is "" or a span of its context
        assert predictions[row["id"]] in row["context"]
    assert set(json.loads((out / "eval_null_odds.json").read_text())) == set(predictions)
    assert len(json.loads((out / "predict_predictions.json").read_text())) == 2
    assert json.loads((out / "predict_results.json").read_text())["predict_total"] == 2
    assert json.loads((out / "config.json").read_text())["attention_type"] == "longformer"
    assert "pipeline_tag: question-answering" in (out / "README.md").read_text()
    # The saved tokenizer allows the model's windows: the pipeline reads a whole document in one forward.
    qa = pipeline("question-answering", model=str(out))
    shapes = []
    qa.model.register_forward_pre_hook(
        lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    row = validation[0]
    answer = qa(question=row["question"], context=row["context"])
    assert len(shapes) == 1 and shapes[0][0] == 1 and shapes[0][1] > 600
    assert answer["answer"] == row["context"][answer["start"] : answer["end"]]


def test_squad_v1_with_run_qa_flags(finetune_qa, long_qa, checkpoint, tmp_path):
    """SQuAD 1.1 scores; --pad_to_max_length, --max_train_samples (questions, then windows), --n_best_size,
    --max_answer_length and --doc_stride as run_qa.py takes them."""
    args = qa_args(long_qa, checkpoint, tmp_path, "--pad_to_max_length", "--max_train_samples", "2")
    args += [
        "--n_best_size",
        "3",
        "--max_answer_length",
        "2",
        "--doc_stride",
        "64",
        "--max_eval_samples",
        "2",
    ]
    metrics = finetune_qa.main(args)
    assert set(metrics) >= {"eval_exact_match", "eval_f1"} and metrics["eval_samples"] == 2
    nbest = json.loads((tmp_path / "eval_nbest_predictions.json").read_text())
    assert len(nbest) == 2 and all(len(candidates) <= 3 for candidates in nbest.values())
    tokenizer = packaged_tokenizer()
    for candidates in nbest.values():
        for candidate in candidates:
            assert len(tokenizer(candidate["answer"], add_special_tokens=False)["input_ids"]) <= 2


def test_wrong_flags_raise_naming_them(finetune_qa, long_qa, checkpoint, tmp_path):
    base = ["--model_name_or_path", str(checkpoint), *COMMON]
    with pytest.raises(InputError, match="--do_eval needs the validation questions: give --validation_file"):
        finetune_qa.main(
            [*base, "--train_file", long_qa["train"], "--do_eval", "--output_dir", str(tmp_path / "a")]
        )
    with pytest.raises(InputError, match="doc_stride=2000 must be below"):
        finetune_qa.main([*qa_args(long_qa, checkpoint, tmp_path / "b"), "--doc_stride", "2000"])
    with pytest.raises(
        InputError, match="--max_seq_length 2048 is larger than the model.s max_position_embeddings"
    ):
        finetune_qa.main([*qa_args(long_qa, checkpoint, tmp_path / "c"), "--max_seq_length", "2048"])
    with pytest.raises(InputError, match=r"Give the questions: --train_file"):
        finetune_qa.main([*base, "--output_dir", str(tmp_path / "d")])


def test_default_phases_read_the_splits_there_are(finetune_qa, long_qa, checkpoint, tmp_path):
    """Without phase flags the script trains and evaluates what the data has (as finetune_glue.py): a run
    with training questions only trains; --do_eval without them is the error above."""
    args = ["--model_name_or_path", str(checkpoint), "--train_file", long_qa["train"], *LONGFORMER]
    args += ["--max_seq_length", "1024", "--max_steps", "1", "--output_dir", str(tmp_path), *COMMON]
    assert finetune_qa.main(args) == {}
    assert (tmp_path / "model.safetensors").exists() and not (tmp_path / "eval_predictions.json").exists()


def test_a_window_covering_every_window_is_said(finetune_qa, long_qa, checkpoint, tmp_path, caplog):
    """An attention_window of 2,048 over 1,024-token windows is exact attention at Longformer's cost: said
    once, as the other text scripts say it (the run trains as asked)."""
    wide = ["--attention_type", "longformer", "--attention_config", '{"attention_window": 2048}']
    args = ["--model_name_or_path", str(checkpoint), "--train_file", long_qa["train"], *wide]
    args += ["--max_seq_length", "1024", "--max_steps", "1", "--output_dir", str(tmp_path), *COMMON]
    with caplog.at_level(logging.INFO, logger="hf_efficient"):
        finetune_qa.main(args)
    said = [r.getMessage() for r in caplog.records if "covers every input" in r.getMessage()]
    assert len(said) == 1 and "each query sees every key of inputs up to" in said[0], said
