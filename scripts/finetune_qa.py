"""Fine-tune an EfficientBert, or any BERT checkpoint with its attention swapped, for extractive question
answering (SQuAD 1.1 / 2.0), with the flags of transformers' ``run_qa.py``.

Questions come from SQuAD-format files (``--train_file`` / ``--validation_file`` / ``--test_file``: JSON
lines, run_qa.py's ``{"data": [...]}`` JSON, or SQuAD's nested JSON) or ``--dataset_name``. Contexts
longer than ``--max_seq_length`` are read in windows overlapping by ``--doc_stride`` tokens; start / end
logits become answers (``--n_best_size``, ``--max_answer_length``; with ``--version_2_with_negative`` an
empty answer when the null score beats the best span by ``--null_score_diff_threshold``), scored by SQuAD's
exact match and F1 (offline ``evaluate`` modules) and written to ``<output_dir>/eval_predictions.json``.
Offline example, on IMDB documents whose answers lie past token 512 (``python -m hf_efficient.data.long_qa
write --out runs/long_qa``), with all-MiniLM-L6-v2 (the default checkpoint) read by Longformer attention over
4,096 positions:

    python scripts/finetune_qa.py --train_file runs/long_qa/train.jsonl \
        --validation_file runs/long_qa/validation.jsonl --output_dir runs/long-qa-longformer \
        --attention_type longformer --max_seq_length 4096 --resize_position_embeddings \
        --attention_config '{"attention_window": 256, "global_token_indices": [0]}'

Online: ``--dataset_name rajpurkar/squad --model_name_or_path bert-base-uncased``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from transformers import DataCollatorWithPadding, HfArgumentParser

from hf_efficient import EfficientBertConfig, EfficientBertForQuestionAnswering
from hf_efficient.cli import run_script
from hf_efficient.data import check_sequence_length
from hf_efficient.data.inputs import check_tokenizer, first_texts
from hf_efficient.data.question_answering import (
    SAMPLE_FLAGS,
    SPLIT_FLAGS,
    QAColumns,
    load_question_answering_data,
    predict_answers,
    question_answering_features,
)
from hf_efficient.modeling.checkpoint_files import load_tokenizer
from hf_efficient.training import (
    ConfigArguments,
    DataCacheArguments,
    EfficientTrainer,
    EfficientTrainingArguments,
    SampleLimitArguments,
    TextModelArguments,
    efficiency_metrics,
    finish_run,
    given_phase_flags,
    random_state_callbacks,
    releases_output_dirs,
    setup_run,
    train_and_save,
)

ATTENTION_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "text" / "attention"
logger = logging.getLogger(__name__)


@dataclass
class QuestionAnsweringArguments(SampleLimitArguments, DataCacheArguments):
    dataset_name: str | None = field(
        default=None, metadata={"help": "A SQuAD-format dataset (hub id or folder)."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "The dataset's config."})
    train_file: str | None = field(
        default=None, metadata={"help": "SQuAD-format .json / .jsonl to train on."}
    )
    validation_file: str | None = field(default=None, metadata={"help": "SQuAD-format file to evaluate on."})
    test_file: str | None = field(
        default=None, metadata={"help": "SQuAD-format file to predict (--do_predict)."}
    )
    question_column_name: str | None = field(
        default=None, metadata={"help": "The question column; none: 'question', else the first column."}
    )
    context_column_name: str | None = field(
        default=None, metadata={"help": "The context column; none: 'context', else the second column."}
    )
    answer_column_name: str | None = field(
        default=None, metadata={"help": "The answers column; none: 'answers', else the third column."}
    )
    id_column_name: str | None = field(
        default=None,
        metadata={
            "help": "The questions' id column, which keys the predictions; none: 'id', else row numbers."
        },
    )
    max_seq_length: int = field(default=384, metadata={"help": "Tokens per window (question and context)."})
    doc_stride: int = field(default=128, metadata={"help": "Context tokens consecutive windows share."})
    pad_to_max_length: bool = field(
        default=False,
        metadata={
            "help": "Pad every batch to --max_seq_length (run_qa.py's default); not given: to its longest "
            "window, which is faster."
        },
    )
    n_best_size: int = field(default=20, metadata={"help": "Candidate answers kept per question."})
    max_answer_length: int = field(default=30, metadata={"help": "The most tokens of an answer."})
    version_2_with_negative: bool = field(
        default=False, metadata={"help": "Some questions have no answer (SQuAD 2.0)."}
    )
    null_score_diff_threshold: float = field(
        default=0.0,
        metadata={
            "help": "SQuAD 2.0: answer '' when the null score beats the best span's by more than this."
        },
    )
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes that tokenise (datasets.map)."}
    )


@releases_output_dirs  # the run's output folder lock ends with it, also in a notebook
def main(args: list[str] | None = None) -> dict[str, float]:
    parser = HfArgumentParser(
        (TextModelArguments, QuestionAnsweringArguments, ConfigArguments, EfficientTrainingArguments)
    )
    parsed, model_kwargs = setup_run(parser, EfficientBertConfig, ATTENTION_CONFIGS, args)
    model_args, data_args, _, training_args = parsed

    files = (data_args.train_file, data_args.validation_file, data_args.test_file)
    raw = load_question_answering_data(
        data_args.dataset_name, data_args.dataset_config_name, *files, cache_dir=model_args.cache_dir
    )
    columns = QAColumns.of(
        next(iter(raw.values())), data_args.question_column_name, data_args.context_column_name,
        data_args.answer_column_name, data_args.id_column_name,
    )  # fmt: skip
    sources = {
        split: f"{SPLIT_FLAGS[split]} {path}" for split, path in zip(SPLIT_FLAGS, files, strict=True) if path
    }
    tokenizer = load_tokenizer(
        model_args.tokenizer_name or model_args.model_name_or_path, **model_args.hub_kwargs()
    )
    model = model_args.load_model(EfficientBertForQuestionAnswering, model_kwargs)
    max_length = data_args.max_seq_length
    if model_args.resize_position_embeddings and max_length > model.max_input_tokens:
        model.resize_position_embeddings(max_length + model.position_offset)
    check_sequence_length(max_length, model.max_input_tokens, "--max_seq_length", model.position_offset)
    first = next(iter(raw))
    texts = first_texts(raw[first], columns.question, columns.context)
    where, saved = sources.get(first, first), model_args.saved_tokenizer()
    check_tokenizer(tokenizer, model.config, model_args.tokenizer_flag, texts, where, saved=saved)
    # Saved with the model: pipeline("question-answering", model=output_dir) then reads windows this long.
    tokenizer.model_max_length = max_length
    tokenizer.padding_side = "right"  # the collator pads after the tokens the answer positions count
    phases = {"train": "do_train", "validation": "do_eval", "test": "do_predict"}
    asked = given_phase_flags(args)  # a phase asked for needs its data; a default one reads what is there
    limits = {split: getattr(data_args, flag) for split, flag in SAMPLE_FLAGS.items()}
    with training_args.main_process_first(desc="tokenizing"):
        examples, train, features = question_answering_features(
            raw, [split for split, flag in phases.items() if getattr(training_args, flag)], columns, limits,
            required=[split for split, flag in phases.items() if flag in asked], sources=sources,
            tokenizer=tokenizer, max_length=max_length, doc_stride=data_args.doc_stride,
            padding="max_length" if data_args.pad_to_max_length else False,
            num_proc=data_args.preprocessing_num_workers, load_from_cache_file=data_args.load_from_cache_file,
        )  # fmt: skip

    collator_padding = (
        {"padding": "max_length", "max_length": max_length} if data_args.pad_to_max_length else {}
    )
    trainer = EfficientTrainer(
        model=model,
        args=training_args,
        train_dataset=train,
        data_collator=DataCollatorWithPadding(tokenizer, **collator_padding),
        processing_class=tokenizer,
        callbacks=random_state_callbacks(model, model_args, training_args.seed),
    )
    logger.info(
        "%d training windows of %d questions, %s attention", len(train or []), len(examples.get("train", [])),
        model.config.attention_type,
    )  # fmt: skip
    efficiency = None
    if train is not None:
        train_result = train_and_save(trainer)
        efficiency = efficiency_metrics(
            train_result.metrics, float(np.mean([len(i) for i in train["input_ids"]]))
        )
    post_processing = dict(
        n_best_size=data_args.n_best_size, max_answer_length=data_args.max_answer_length,
        version_2_with_negative=data_args.version_2_with_negative,
        null_score_diff_threshold=data_args.null_score_diff_threshold,
    )  # fmt: skip
    eval_metrics: dict[str, float] = {}
    for split, prefix in (("validation", "eval"), ("test", "predict")):
        if split in features:
            metrics = predict_answers(
                trainer, examples[split], features[split], columns, prefix, **post_processing
            )
            if split == "validation":
                eval_metrics = metrics
    source = data_args.train_file or data_args.dataset_name or data_args.validation_file
    finish_run(
        trainer,
        eval_metrics,
        headline="question answering",
        shown=("exact_match", "f1", "exact", "HasAns_f1", "NoAns_f1"),
        summary=f"Fine-tuned for extractive question answering by `scripts/finetune_qa.py` from "
        f"`{model_args.model_name_or_path}`.",
        data_description=f"{source}: {len(examples.get('train', [])):,} training questions in "
        f"{len(train or []):,} windows of at most {max_length} tokens (doc_stride {data_args.doc_stride}).",
        datasets=[data_args.dataset_name]
        if data_args.dataset_name and not Path(data_args.dataset_name).exists()
        else None,
        base_model=model_args.model_name_or_path,
        training_args=training_args if train is not None else None,
        extra_hyperparameters={"max_seq_length": max_length, "doc_stride": data_args.doc_stride},
        eval_description=f"SQuAD{' 2.0' if data_args.version_2_with_negative else ''} exact match and F1 on "
        f"{data_args.validation_file or 'the validation split'}.",
        efficiency=efficiency,
    )
    return eval_metrics


if __name__ == "__main__":
    run_script(main)  # a user error: one "error: ..." line, exit status 2
