"""What the language-model pretraining scripts share (``scripts/pretrain_mlm.py``, masked;
``scripts/pretrain_clm.py``, causal): their model flags, the model from a checkpoint or from scratch sized by
the tokenizer, the corpus cut into blocks with a held-out part, perplexity, and the model card's data and
evaluation lines, the end of the run (:func:`~hf_efficient.training.finish_run`: card, push). Each script
keeps only what differs (the model class, the collator, the masking flags and metrics).
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasets import Dataset, IterableDataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer, TrainingArguments
from transformers.trainer_utils import has_length

from ..data.inputs import check_tokenizer, first_texts
from ..data.text import (
    TextCorpusArguments,
    check_enough_to_split,
    check_sequence_length,
    group_texts,
    hold_out_blocks,
    load_corpus_from_args,
    load_or_train_tokenizer,
    load_text_corpus,
    match_tokenizer_to_model,
    tokenize_lines,
)
from ..errors import InputError
from .arguments import DataCacheArguments, PaddingFreeModelArguments, first_examples
from .model_card import efficiency_metrics
from .run import (
    finish_run,
    random_state_callbacks,
    random_state_settings,
    train_and_save,
)
from .trainer import EfficientTrainer

logger = logging.getLogger(__name__)
DEFAULT_VALIDATION_SPLIT_PERCENTAGE = 5.0  # run_mlm.py's and run_clm.py's


@dataclass
class LanguageModelArguments(PaddingFreeModelArguments):
    """The model flags of the language-model pretraining scripts (the shared hub flags, plus the tokenizer
    trained here and the position table)."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Warm-start from a BERT / EfficientBert checkpoint; none: scratch."}
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer; none: the checkpoint's, else WordPiece trained here."}
    )
    vocab_size: int = field(default=8000, metadata={"help": "Vocabulary size of a WordPiece trained here."})
    resize_position_embeddings: bool = field(
        default=False,
        metadata={"help": "Extend a checkpoint's position table to --block_size by copying its rows."},
    )

    @property
    def tokenizer_source(self) -> str:
        """Where the tokenizer came from, as the model card says it."""
        return self.tokenizer_name or self.model_name_or_path or "WordPiece, trained"


@dataclass
class LanguageModelDataArguments(TextCorpusArguments, DataCacheArguments):
    """The data flags of the language-model pretraining scripts beyond the corpus (run_mlm.py / run_clm.py's
    evaluation file, held-out share, sample caps, ``--overwrite_cache`` and ``--streaming``).

    ``--validation_split_percentage`` is 5 by default, as in run_mlm.py / run_clm.py, so a run evaluates;
    0 with ``--validation_file`` (the file is the evaluation set) or ``--streaming`` (a stream cannot be
    split) unless given.
    """

    validation_split_percentage: float | None = field(
        default=None,
        metadata={
            "help": f"Percent of the blocks (or texts: --validation_split_by) held out to evaluate on; "
            f"default {DEFAULT_VALIDATION_SPLIT_PERCENTAGE:g} (0 with --validation_file or --streaming)."
        },
    )
    validation_file: str | None = field(
        default=None,
        metadata={"help": "Text to evaluate on (.txt, .csv, .json), instead of a held-out share."},
    )
    max_train_samples: int | None = field(
        default=None,
        metadata={"help": "Only the first N training examples (blocks, or lines with --line_by_line)."},
    )
    max_eval_samples: int | None = field(default=None, metadata={"help": "Only the first N evaluation rows."})
    streaming: bool = field(
        default=False,
        metadata={
            "help": "Read the training corpus as a stream (datasets' IterableDataset: tokenised and grouped "
            "as it is read, nothing converted first); needs --max_steps and a tokenizer."
        },
    )

    def __post_init__(self):
        if self.validation_split_percentage is None:
            held_out = not (self.validation_file or self.streaming)
            self.validation_split_percentage = DEFAULT_VALIDATION_SPLIT_PERCENTAGE if held_out else 0.0


def language_model_corpus(
    model_args: LanguageModelArguments,
    data_args: LanguageModelDataArguments,
    training_args: TrainingArguments,
) -> Dataset | IterableDataset:
    """The training texts (:func:`~hf_efficient.data.load_corpus_from_args`); with ``--streaming`` an
    ``IterableDataset``, once the flags a stream needs are checked.

    Raises:
        ValueError: ``--streaming`` without ``--max_steps`` (a stream has no length, so ``Trainer`` cannot
            tell the steps of an epoch; transformers' ``run_mlm.py`` requires it too), without a tokenizer to
            load (WordPiece is trained on the whole corpus), with a held-out percentage (a stream cannot be
            split; give ``--validation_file``), or with ``--preprocessing_num_workers`` (a stream is mapped
            as it is read, in the training process).
    """
    if data_args.streaming:
        needs = {
            "--max_steps N (a stream has no length, so the steps of an epoch are unknown)": (
                training_args.max_steps <= 0
            ),
            "--tokenizer_name or --model_name_or_path (WordPiece is trained on a whole corpus)": not (
                model_args.tokenizer_name or model_args.model_name_or_path
            ),
            "--validation_file or no --validation_split_percentage (a stream cannot be split)": (
                data_args.validation_split_percentage > 0
            ),
            "no --preprocessing_num_workers (a stream is tokenised as it is read)": (
                data_args.preprocessing_num_workers is not None
            ),
        }
        missing = [need for need, unmet in needs.items() if unmet]
        if missing:
            raise InputError(f"--streaming needs {'; and '.join(missing)}.")
    return load_corpus_from_args(data_args, streaming=data_args.streaming)


def language_model_tokenizer(
    model_args: LanguageModelArguments,
    data_args: TextCorpusArguments,
    corpus: Dataset,
    training_args: TrainingArguments,
) -> PreTrainedTokenizerBase:
    """``--tokenizer_name``, else the checkpoint's, else WordPiece trained on the corpus and saved in the
    output folder (the main process trains it, the others load it)."""
    with training_args.main_process_first(desc="tokenizer"):
        return load_or_train_tokenizer(
            model_args.tokenizer_name or model_args.model_name_or_path, corpus, training_args.output_dir,
            data_args.text_column, model_args.vocab_size, data_args.block_size,
        )  # fmt: skip


def language_model(
    model_class: type[PreTrainedModel],
    model_args: LanguageModelArguments,
    tokenizer: PreTrainedTokenizerBase,
    model_kwargs: dict,
    data_args: TextCorpusArguments,
    corpus: Dataset | IterableDataset,
    needs: tuple[str, ...] = (),
) -> PreTrainedModel:
    """``model_class`` warm-started from ``--model_name_or_path``, or from scratch with the tokenizer's
    vocabulary size and special tokens (over ``--config_name``'s config when given; ``model_kwargs``: the
    config files' and flags' fields win), by :meth:`~hf_efficient.training.ModelArguments.load_model`; its
    position table extended to ``--block_size`` with ``--resize_position_embeddings``; the tokenizer checked
    against it and the corpus (:func:`~hf_efficient.data.inputs.check_tokenizer`, with the special tokens
    the objective ``needs``)."""
    config_kwargs = model_kwargs
    if not model_args.model_name_or_path:  # a new model: the tokenizer's vocabulary and special tokens
        specials = {
            "vocab_size": len(tokenizer),
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
        }
        config_kwargs = {**specials, **model_kwargs}
    model = model_args.load_model(model_class, config_kwargs)
    block_size = data_args.block_size
    if model_args.resize_position_embeddings and block_size > model.max_input_tokens:
        model.resize_position_embeddings(block_size + model.position_offset)
    texts = first_texts(corpus, data_args.text_column)
    where, saved = model_args.tokenizer_flag, model_args.saved_tokenizer()
    check_tokenizer(tokenizer, model.config, where, texts, data_args.source_flag, needs, saved)
    match_tokenizer_to_model(tokenizer, model.max_input_tokens)  # saved with the model
    return model


def language_model_blocks(
    corpus: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    data_args: LanguageModelDataArguments,
    model: PreTrainedModel,
    training_args: TrainingArguments,
    causal: bool = False,
    line_by_line: bool = False,
    pad_to_max_length: bool = False,
    split_long: bool = False,
) -> tuple[Dataset, Dataset | None]:
    """(training examples, evaluation examples or None).

    Examples are :func:`~hf_efficient.data.group_texts` blocks of ``block_size`` tokens or, with
    ``line_by_line`` (masked LM only), one truncated example per text
    (:func:`~hf_efficient.data.tokenize_lines`, padded to ``block_size`` with ``pad_to_max_length``; with
    ``split_long`` a longer text's rest makes more examples rather than being dropped).
    The evaluation examples come from
    ``--validation_file``, else ``--validation_split_percentage`` is held out, of the blocks or, with
    ``--validation_split_by texts``, of the texts before grouping (no held-out block then shares a document
    with a training block); none without ``do_eval``; the first ``--max_train_samples`` /
    ``--max_eval_samples`` of each.

    The main process groups first and fills the ``datasets`` cache; the others read it.

    Raises:
        ValueError: both ``--validation_file`` and a held-out percentage, or ``block_size`` beyond the
            model's position table.
    """
    if data_args.validation_file and data_args.validation_split_percentage > 0:
        raise InputError(
            f"Give --validation_file or --validation_split_percentage, not both (got "
            f"{data_args.validation_file!r} and {data_args.validation_split_percentage:g}): the file is the "
            "evaluation set."
        )
    check_sequence_length(data_args.block_size, model.max_input_tokens, position_offset=model.position_offset)

    def examples(texts: Dataset, source: str) -> Dataset:
        if line_by_line:
            return tokenize_lines(
                texts, tokenizer, data_args.block_size, data_args.text_column, pad_to_max_length,
                data_args.preprocessing_num_workers, load_from_cache_file=data_args.load_from_cache_file,
                split_long=split_long,
            )  # fmt: skip
        return group_texts(
            texts, tokenizer, data_args.block_size, data_args.text_column,
            model.max_input_tokens, data_args.preprocessing_num_workers, causal=causal,
            load_from_cache_file=data_args.load_from_cache_file, source=source,
        )  # fmt: skip

    seed, percentage = training_args.seed, data_args.validation_split_percentage
    source = data_args.source_flag
    with training_args.main_process_first(desc="grouping texts"):
        if data_args.validation_file:
            eval_texts = load_text_corpus(
                files=[data_args.validation_file], text_column=data_args.text_column,
                keep_linebreaks=data_args.keep_linebreaks,
            )  # fmt: skip
            validation = f"--validation_file {data_args.validation_file}"
            train_examples, eval_examples = examples(corpus, source), examples(eval_texts, validation)
        elif data_args.validation_split_by == "blocks" or percentage <= 0:
            train_examples, eval_examples = hold_out_blocks(examples(corpus, source), percentage, seed)
        else:
            check_enough_to_split(len(corpus), percentage, "texts")
            split = corpus.train_test_split(test_size=percentage / 100, seed=seed)
            held_out = f"The {percentage:g}% of {source}'s texts held out (--validation_split_percentage)"
            train_examples = examples(split["train"], f"{source} (its texts not held out)")
            eval_examples = examples(split["test"], held_out)
    if not training_args.do_eval:
        eval_examples = None
    return (
        first_examples(train_examples, data_args.max_train_samples, "max_train_samples"),
        first_examples(eval_examples, data_args.max_eval_samples, "max_eval_samples"),
    )


def pretrain_language_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    corpus: Dataset,
    blocks: tuple[Dataset, Dataset | None],
    data_collator,
    model_args: LanguageModelArguments,
    data_args: TextCorpusArguments,
    training_args: TrainingArguments,
    summary: str,
    objective: dict[str, Any],
    headline: str,
    compute_metrics=None,
    preprocess_logits_for_metrics=None,
) -> dict[str, float]:
    """Train ``model`` on the blocks with :class:`EfficientTrainer` (redrawing random features if the cores
    have some and the flags ask; only the phases ``--do_train`` / ``--do_eval`` ask for), save it with its
    tokenizer, report the held-out perplexity (and ``compute_metrics``'s, e.g. masked-token accuracy) and end
    the run with :func:`~hf_efficient.training.finish_run` (``headline``: the printed line's name; the model
    card says ``summary``; ``objective``: the hyperparameters of the training objective; the push).

    Returns:
        The training metrics, and the evaluation metrics with ``perplexity`` when blocks were held out.
    """
    train_blocks, eval_blocks = blocks
    # The cores say whether they have random state to redraw (Performer, RFA); no branching on type names.
    callbacks = random_state_callbacks(model, model_args, training_args.seed)
    trainer = EfficientTrainer(
        model=model,
        args=training_args,
        train_dataset=train_blocks,
        eval_dataset=eval_blocks,
        data_collator=data_collator,
        processing_class=tokenizer,
        callbacks=callbacks,
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
    )
    logger.info(
        "%s blocks of %d tokens, attention %s, %s parameters", count(train_blocks), data_args.block_size,
        model.config.attention_type, f"{model.num_parameters():,}",
    )  # fmt: skip
    train_result = train_and_save(trainer) if training_args.do_train else None
    if trainer.is_world_process_zero():
        write_data_settings(
            training_args.output_dir, data_args, model_args, train_blocks, eval_blocks, corpus
        )
    metrics = dict(train_result.metrics) if train_result else {}
    eval_metrics = evaluate_perplexity(trainer) if eval_blocks is not None else {}
    metrics.update(eval_metrics)
    reported = "loss, perplexity" + (" and accuracy" if compute_metrics else "")
    if not eval_metrics and trainer.is_world_process_zero():  # the last line says so, with the training loss
        print(f"{headline}: {not_evaluated(metrics)}", flush=True)
    finish_run(
        trainer,
        eval_metrics,
        headline=headline if eval_metrics else None,
        shown=("loss", "perplexity", "accuracy"),
        summary=summary,
        data_description=(
            f"{count(train_blocks)} examples of up to {data_args.block_size} tokens from "
            f"`{data_args.source}` "
            f"(column `{data_args.text_column}`, {count(corpus)} texts); tokenizer: "
            f"{model_args.tokenizer_source}."
        ),
        datasets=[data_args.dataset_name] if data_args.dataset_name else None,
        base_model=model_args.model_name_or_path,
        training_args=training_args if train_result else None,
        extra_hyperparameters={
            "block_size": data_args.block_size,
            **objective,
            **random_state_settings(model_args, callbacks),
        },
        eval_description=f"{reported[0].upper()}{reported[1:]} on {len(eval_blocks or []):,} held-out "
        f"examples ({held_out_part(data_args)}).",
        efficiency=efficiency_metrics(train_result.metrics, mean_length(train_blocks, data_args.block_size))
        if train_result
        else None,
    )
    return metrics


def mean_length(examples: Dataset | IterableDataset, block_size: int) -> float:
    """Tokens per training example, for tokens/s: ``block_size`` for blocks, the mean for examples of their
    own lengths (``--line_by_line``, ``--packing``; a stream: its bound, ``block_size``)."""
    if not has_length(examples) or "input_ids" not in examples.column_names:
        return block_size
    return statistics.fmean(len(ids) for ids in examples["input_ids"])


DATA_SETTINGS = "data_settings.json"


def not_evaluated(metrics: dict[str, float]) -> str:
    """The run's last line when nothing was evaluated: the training loss (if it trained) and why."""
    loss = f"train_loss = {metrics['train_loss']:.4f}; " if "train_loss" in metrics else ""
    return (
        f"{loss}nothing evaluated (--do_eval, or no phase flag, with --validation_split_percentage above 0 "
        "or --validation_file evaluates)"
    )


def count(dataset: Dataset | IterableDataset) -> str:
    """The rows of ``dataset`` for a log line or the model card: ``1,234``, or ``streamed`` (not counted)."""
    return f"{len(dataset):,}" if has_length(dataset) else "streamed"


def write_data_settings(output_dir, data_args, model_args, train_blocks, eval_blocks, corpus) -> None:
    """``<output_dir>/data_settings.json``: what the model was trained and evaluated on (corpus, block size,
    tokenizer, held-out part and their sizes), so that runs can be compared on the same data
    (``python -m benchmarks.studies.clm_perplexity`` reads it)."""
    settings = {
        "corpus": data_args.source,
        "text_column": data_args.text_column,
        "texts": len(corpus) if has_length(corpus) else None,  # None: streamed
        "block_size": data_args.block_size,
        "tokenizer": model_args.tokenizer_source,
        "train_blocks": len(train_blocks) if has_length(train_blocks) else None,
        "held_out": held_out_part(data_args),
        "eval_blocks": len(eval_blocks) if eval_blocks is not None else 0,
    }
    (Path(output_dir) / DATA_SETTINGS).write_text(json.dumps(settings, indent=1) + "\n")


def held_out_part(data_args: LanguageModelDataArguments) -> str:
    """What the evaluation examples are, in words: the validation file or the held-out share."""
    if data_args.validation_file:
        return f"`{data_args.validation_file}`"
    return f"{data_args.validation_split_percentage:g}% of the {data_args.validation_split_by}"


def evaluate_perplexity(trainer: Trainer) -> dict[str, float]:
    """``trainer.evaluate()`` on its held-out blocks, with ``perplexity`` = exp(eval_loss) (the mean loss per
    predicted token), logged and saved as ``eval_results.json``."""
    metrics = trainer.evaluate()
    metrics["perplexity"] = math.exp(min(metrics["eval_loss"], 50))
    metrics["eval_samples"] = len(trainer.eval_dataset)  # as run_mlm.py / run_clm.py report
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    return metrics
