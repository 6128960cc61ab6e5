"""The command lines of transformers' example scripts work here: every flag of run_mlm.py, run_clm.py,
run_glue.py, run_classification.py, run_image_classification.py and run_mae.py is taken under its name, read
as ours, or refused saying why; your own CSV with its own column names; language-model pretraining evaluates
by default and its last line names the metric."""

from __future__ import annotations

import csv

import pytest
from transformers import AutoTokenizer

from hf_efficient.training import EfficientTrainer, arguments, language_modeling

from ..data.helpers import write_csv
from .helpers import COMMON, TINY, pretrain_args, recording
from .test_argument_errors import tiny_checkpoint  # noqa: F401 (a fixture)

MODEL = ["model_name_or_path", "config_name", "cache_dir", "model_revision", "token", "trust_remote_code"]
TEXT_MODEL = [*MODEL, "tokenizer_name", "use_fast_tokenizer"]
LANGUAGE_MODEL = [*TEXT_MODEL, "model_type", "config_overrides", "torch_dtype", "low_cpu_mem_usage"]
LANGUAGE_DATA = ["dataset_name", "dataset_config_name", "train_file", "validation_file", "overwrite_cache"]
LANGUAGE_DATA += ["validation_split_percentage", "preprocessing_num_workers", "max_train_samples"]
LANGUAGE_DATA += ["max_eval_samples", "streaming"]
GLUE = [*TEXT_MODEL, "ignore_mismatched_sizes", "task_name", "dataset_name", "dataset_config_name"]
GLUE += ["max_seq_length", "overwrite_cache", "pad_to_max_length", "max_train_samples", "max_eval_samples"]
GLUE += ["max_predict_samples", "train_file", "validation_file", "test_file"]
CLASSIFICATION = [*GLUE, "do_regression", "text_column_names", "text_column_delimiter", "train_split_name"]
CLASSIFICATION += ["validation_split_name", "test_split_name", "remove_splits", "remove_columns"]
CLASSIFICATION += ["label_column_name", "preprocessing_num_workers", "shuffle_train_dataset", "shuffle_seed"]
CLASSIFICATION += ["metric_name"]
QA = [*MODEL, "tokenizer_name", "dataset_name", "dataset_config_name", "train_file", "validation_file"]
QA += ["test_file", "overwrite_cache", "preprocessing_num_workers", "max_seq_length", "pad_to_max_length"]
QA += ["max_train_samples", "max_eval_samples", "max_predict_samples", "version_2_with_negative"]
QA += ["null_score_diff_threshold", "doc_stride", "n_best_size", "max_answer_length"]
IMAGES = [*MODEL, "image_processor_name", "dataset_name", "dataset_config_name", "image_column_name"]
IMAGES += ["train_dir", "validation_dir", "train_val_split", "max_train_samples", "max_eval_samples"]
# The flags of each example script (besides TrainingArguments'), by the script here that stands for it.
UPSTREAM = {
    "pretrain_mlm": [*LANGUAGE_MODEL, *LANGUAGE_DATA, "max_seq_length", "mlm_probability", "line_by_line"]
    + ["pad_to_max_length"],
    "pretrain_clm": [*LANGUAGE_MODEL, *LANGUAGE_DATA, "block_size", "keep_linebreaks"],
    "finetune_glue": CLASSIFICATION,
    "finetune_qa": QA,  # run_qa.py
    "finetune_image_classification": [*IMAGES, "model_type", "label_column_name", "ignore_mismatched_sizes"],
    "pretrain_mae": [*IMAGES, "config_overrides", "mask_ratio", "norm_pix_loss", "base_learning_rate"],
}


class _Parsed(Exception):
    pass


def flags_of(script, monkeypatch) -> set[str]:
    """The flag names (without ``--``) that ``script``'s parser takes."""
    parsers = []

    def capture(parser, *args):
        parsers.append(parser)
        raise _Parsed

    monkeypatch.setattr(script, "setup_run", capture)
    with pytest.raises(_Parsed):
        script.main([])
    return {option[2:] for action in parsers[0]._actions for option in action.option_strings}


@pytest.mark.parametrize("name", UPSTREAM)
def test_every_upstream_flag_is_taken_renamed_or_refused_with_a_reason(name, request, monkeypatch):
    script = request.getfixturevalue(name)
    known = flags_of(script, monkeypatch)
    for flag in UPSTREAM[name]:
        if flag in known:
            continue
        assert flag in arguments.UPSTREAM_FLAGS, f"{name}: --{flag}"
        upstream = arguments.UPSTREAM_FLAGS[flag]
        if upstream.ours in known:
            value = f"{upstream.scale or 1:g}"  # 1 (a fraction: 100 percent)
            translated = arguments.translate_upstream_flags([f"--{flag}", "1"], known)
            assert translated == [f"--{upstream.ours}", value]
        elif "true" not in upstream.accepted:
            with pytest.raises(ValueError, match=rf"--{flag} 1 \(a flag of transformers' example scripts\)"):
                arguments.translate_upstream_flags([f"--{flag}", "1"], known)


def test_translation_keeps_values_and_refuses_what_does_not_apply():
    known = {"block_size", "train_files", "validation_split_percentage", "output_dir"}
    args = ["--train_file=a.txt", "--max_seq_length", "64", "--train_val_split", "0.15"]
    args += ["--use_fast_tokenizer", "--low_cpu_mem_usage", "True", "--output_dir", "x"]
    assert arguments.translate_upstream_flags(args, known) == [
        *("--train_files", "a.txt", "--block_size", "64", "--validation_split_percentage", "15"),
        *("--output_dir", "x"),
    ]
    with pytest.raises(ValueError, match=r"--use_fast_tokenizer False .*: the tokenizers here are always"):
        arguments.translate_upstream_flags(["--use_fast_tokenizer", "False"], known)
    with pytest.raises(ValueError, match=r"--train_val_split takes a number, got 'a'"):
        arguments.translate_upstream_flags(["--train_val_split", "a"], known)
    own = ["--max_seq_length", "64"]  # a script with a flag of that name takes it as it is
    assert arguments.translate_upstream_flags(own, {"max_seq_length"}) == own


def last_line(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_language_models_evaluate_by_default_and_say_the_metric_last(pretrain_mlm, data, tmp_path, capsys):
    """5% of the blocks are held out by default, as in run_mlm.py / run_clm.py, so a run evaluates and its
    last line names the metrics; a run that evaluates nothing says so, with the training loss."""
    args = pretrain_args(data, tmp_path / "run", "full", {}, "--max_steps", "1")
    metrics = pretrain_mlm.main(args)
    assert metrics["eval_samples"] > 0 and metrics["perplexity"] > 1
    assert last_line(capsys).startswith("masked language modelling: eval_loss = ")
    none = ["--validation_split_percentage", "0", "--output_dir", str(tmp_path / "none")]
    assert "eval_loss" not in pretrain_mlm.main([*args, *none])
    line = last_line(capsys)
    assert line.startswith("masked language modelling: train_loss = ") and "nothing evaluated" in line


def test_run_mlm_command_line(pretrain_mlm, data, tmp_path, monkeypatch):
    """run_mlm.py's flags: --train_file, --max_seq_length (our --block_size), --max_train_samples (blocks),
    --use_fast_tokenizer, --low_cpu_mem_usage; --model_type is refused saying why."""
    trainers = []
    monkeypatch.setattr(language_modeling, "EfficientTrainer", recording(EfficientTrainer, trainers))
    args = ["--train_file", data["corpus"], "--max_seq_length", "32", "--max_train_samples", "6"]
    args += ["--use_fast_tokenizer", "--low_cpu_mem_usage", "--preprocessing_num_workers", "1"]
    args += ["--vocab_size", "300", "--config_overrides", TINY, "--max_steps", "1", *COMMON]
    pretrain_mlm.main([*args, "--output_dir", str(tmp_path / "run")])
    train = trainers[0].train_dataset
    assert len(train) == 6 and {len(ids) for ids in train["input_ids"]} == {32}
    with pytest.raises(ValueError, match=r"--model_type bert .* always EfficientBert"):
        pretrain_mlm.main([*args, "--model_type", "bert", "--output_dir", str(tmp_path / "x")])


def test_run_clm_command_line(pretrain_clm, data, tmp_path, monkeypatch, capsys):
    """run_clm.py's --keep_linebreaks (False: the line breaks dropped) and --max_seq_length as --block_size;
    --pad_to_max_length, which run_clm.py does not have, is refused saying why."""
    trainers = []
    monkeypatch.setattr(language_modeling, "EfficientTrainer", recording(EfficientTrainer, trainers))
    args = ["--train_file", data["corpus"], "--max_seq_length", "32", "--vocab_size", "300"]
    args += ["--config_overrides", TINY, "--max_steps", "1", "--attention_type", "full", *COMMON]
    pretrain_clm.main([*args, "--keep_linebreaks", "False", "--output_dir", str(tmp_path / "run")])
    assert {len(ids) for ids in trainers[0].train_dataset["input_ids"]} == {32}
    assert trainers[0].eval_dataset is not None
    assert last_line(capsys).startswith("causal language modelling: eval_loss = ")
    with pytest.raises(ValueError, match=r"--pad_to_max_length .* pretrain_clm.py's blocks hold exactly"):
        pretrain_clm.main([*args, "--pad_to_max_length", "--output_dir", str(tmp_path / "x")])


def own_csv(finetune_glue, checkpoint, data, tmp_path, monkeypatch, *header):
    """(the rows of a CSV of 16 Rotten Tomatoes rows with columns ``header``, finetune_glue.py's command line
    training and evaluating on it for a step, the list that records its trainers)."""
    rows = list(csv.reader(open(data["train"])))[1:17]
    own = write_csv(tmp_path / "own.csv", list(header), rows)
    trainers = []
    monkeypatch.setattr(finetune_glue, "EfficientTrainer", recording(EfficientTrainer, trainers))
    args = ["--model_name_or_path", str(checkpoint), "--train_file", own, "--validation_file", own]
    args += ["--max_seq_length", "32", "--max_steps", "1", "--save_strategy", "no", *COMMON]
    return rows, args, trainers


def test_own_csv_with_its_own_column_names(finetune_glue, tiny_checkpoint, data, tmp_path, monkeypatch):  # noqa: F811
    """--text_column_names / --label_column_name apply to --train_file as in run_classification.py; a CSV
    without a label column names the flags."""
    run = (finetune_glue, tiny_checkpoint, data, tmp_path, monkeypatch)
    rows, args, trainers = own_csv(*run, "review", "stars")
    columns = ["--text_column_names", "review", "--label_column_name", "stars"]
    finetune_glue.main([*args, *columns, "--output_dir", str(tmp_path / "run")])
    trainer = trainers[0]
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    texts = [text for text, _ in rows]
    assert trainer.train_dataset["input_ids"] == tokenizer(texts, truncation=True, max_length=32)["input_ids"]
    assert trainer.train_dataset["label"] == [int(label) for _, label in rows]
    with pytest.raises(
        ValueError,
        match=r"--train_file .*own.csv has no column\(s\) \['label'\]; its columns are \['review', 'stars'\]"
        r": name yours with --text_column_names .* and --label_column_name",
    ):
        finetune_glue.main([*args, "--output_dir", str(tmp_path / "x")])


def test_run_classification_flags(finetune_glue, tiny_checkpoint, data, tmp_path, monkeypatch):  # noqa: F811
    """--pad_to_max_length pads every batch to --max_seq_length; --do_regression makes number labels a
    regression target; --metric_name is refused saying why."""
    run = (finetune_glue, tiny_checkpoint, data, tmp_path, monkeypatch)
    rows, args, trainers = own_csv(*run, "sentence", "label")
    regression = ["--pad_to_max_length", "--do_regression", "True", "--output_dir", str(tmp_path / "run")]
    finetune_glue.main([*args, *regression])
    (trainer,) = trainers
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    assert tuple(batch["input_ids"].shape) == (2, 32)
    assert trainer.model.config.problem_type == "regression"
    assert trainer.train_dataset["label"] == [float(label) for _, label in rows]
    metric = ["--metric_name", "accuracy", "--output_dir", str(tmp_path / "y")]
    with pytest.raises(ValueError, match=r"--metric_name accuracy .*: the metrics are the task's"):
        finetune_glue.main([*args, *metric])


def test_split_names_of_run_classification(finetune_glue, tiny_checkpoint, data, tmp_path, monkeypatch):  # noqa: F811
    """--validation_split_name: the named split is evaluated on; one that is not there lists the splits."""
    rows = list(csv.reader(open(data["train"])))[1:21]
    folder = tmp_path / "reviews"
    folder.mkdir()
    for split, part in {"train": rows[:12], "validation": rows[12:16], "test": rows[16:]}.items():
        write_csv(folder / f"{split}.csv", ["sentence", "label"], part)
    trainers = []
    monkeypatch.setattr(finetune_glue, "EfficientTrainer", recording(EfficientTrainer, trainers))
    args = ["--model_name_or_path", str(tiny_checkpoint), "--dataset_name", str(folder)]
    args += ["--max_seq_length", "32", "--max_steps", "1", "--save_strategy", "no", *COMMON]
    finetune_glue.main([*args, "--validation_split_name", "test", "--output_dir", str(tmp_path / "run")])
    assert trainers[0].eval_dataset.num_rows == 4 and trainers[0].train_dataset.num_rows == 12
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    expected = tokenizer([text for text, _ in rows[16:]], truncation=True, max_length=32)["input_ids"]
    assert trainers[0].eval_dataset["input_ids"] == expected
    with pytest.raises(ValueError, match=r"--train_split_name 'dev': .* has the splits \['train', "):
        finetune_glue.main([*args, "--train_split_name", "dev", "--output_dir", str(tmp_path / "x")])
