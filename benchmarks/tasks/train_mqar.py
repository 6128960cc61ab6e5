"""Multi-query associative recall (MQAR; Zoology, Arora et al. 2023): a 2-layer EfficientBert from scratch.

The data is Zoology's MQAR generator redone in numpy (``benchmarks.tasks.mqar``: key-value pairs, then every
key asked again at a power-law distance; the label is the value stored with it), generated from
``--mqar_seed`` (training), ``mqar_seed + 10`` (test, as Zoology) and ``mqar_seed + 20`` (validation, for the
curve). Two formulations:

* default, every text attention type: a bidirectional masked-LM encoder (``EfficientBertForMaskedLM``,
  ``sparse_prediction``: only the query positions reach the vocabulary) whose label at a query position is
  the value. Reading both ways cannot leak the answer: the value appears only in the context (the position
  after a query holds the filler token), so the model must look the key up as a causal one does;
* ``--causal``: a causal LM as Zoology trains (``EfficientBertForCausalLM``, the types with a causal form
  only), the labels moved one position right because its loss predicts ``labels[i + 1]`` at position i.

The causal form learns recall much sooner: at length 64, width 64 and 1,252 steps causal ``full`` reached
84.7% test recall where the encoder stayed at 9.8% (calibration: ``benchmarks/configs/mqar/base.json``).

The model and schedule come from ``benchmarks/configs/mqar/base.json`` (used when no ``--config`` is given)
and each core's ``script_configs["mqar"]`` (windows, landmarks, projections and features sized so that no
type is full attention in disguise at length 64); flags override both; ``--hidden_size`` sets the width (and
the MLP to twice it). Run from the repository root::

    python -m benchmarks.tasks.train_mqar --attention_type full --output_dir runs/mqar/full
    python -m benchmarks.tasks.train_mqar --attention_type linear --causal --output_dir runs/mqar/causal

Writes ``mqar_results.json`` into ``--output_dir`` (test recall accuracy: the fraction of queries answered
with exactly the right value; validation accuracy and its curve; settings; seconds per step; training time),
the model and a model card. Checkpoints let ``--resume_from_checkpoint last`` continue a stopped run. The
grid over types, widths and lengths (through ``benchmarks.seeds``) and its table and plot:
``python -m benchmarks.studies.mqar``.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser, default_data_collator

from benchmarks.tasks.mqar import (
    ZOOLOGY_TEST_SEED_OFFSET,
    MQARSpec,
    causal_labels,
    describe_spec,
    generate_mqar,
    recall_accuracy,
    zoology_num_kv_pairs,
)
from benchmarks.tasks.training import generated_task_run
from hf_efficient import EfficientBertConfig, EfficientBertForCausalLM, EfficientBertForMaskedLM
from hf_efficient.attention.registry import causal_attention_types
from hf_efficient.cli import run_script
from hf_efficient.errors import InputError
from hf_efficient.training import (
    ConfigArguments,
    EfficientTrainer,
    EfficientTrainingArguments,
    RandomStateArguments,
    build_model_config,
    finish_run,
    masked_lm_predictions,
    random_state_callbacks,
    releases_output_dirs,
    setup_run,
)

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "mqar"
DEFAULT_CONFIG = CONFIGS / "base.json"
ATTENTION_CONFIGS = CONFIGS / "attention"
RESULTS_FILE = "mqar_results.json"
VALIDATION_SEED_OFFSET = 20
logger = logging.getLogger(__name__)


@dataclass
class MQARArguments:
    seq_len: int = field(default=64, metadata={"help": "Tokens per example (Zoology's Figure 2: 64-256)."})
    num_kv_pairs: int | None = field(
        default=None,
        metadata={"help": "Key-value pairs per example; none: seq_len // 16, as Zoology's Figure 2."},
    )
    vocab_size: int = field(default=8192, metadata={"help": "Vocabulary (Zoology: 8,192)."})
    power_a: float = field(default=0.01, metadata={"help": "Power law of the query gaps (Zoology: 0.01)."})
    random_non_queries: bool = field(
        default=False, metadata={"help": "Random tokens instead of the filler 0 (Zoology's Figure 2: False)."}
    )
    num_train: int = field(default=40_000, metadata={"help": "Training examples (Zoology: 100,000)."})
    num_validation: int = field(default=500, metadata={"help": "Validation examples (the curve)."})
    num_test: int = field(default=1_000, metadata={"help": "Test examples (Zoology: 3,000)."})
    mqar_seed: int = field(
        default=0, metadata={"help": "Seed of the generated data (test: +10, validation: +20)."}
    )
    hidden_size: int | None = field(
        default=None, metadata={"help": "Model width (d_model); also sets intermediate_size to twice it."}
    )
    causal: bool = field(
        default=False,
        metadata={
            "help": "Train a causal LM as Zoology does (types with a causal form only); default: encoder."
        },
    )


def _with_default_config(args: list[str] | None) -> list[str]:
    args = list(sys.argv[1:] if args is None else args)
    if not any(a == "--config" or a.startswith("--config=") for a in args):
        args = ["--config", str(DEFAULT_CONFIG), *args]
    return args


def build_model(model_kwargs: dict, spec: MQARSpec, causal: bool):
    """The 2-layer masked-LM encoder (sparse prediction) or, with ``causal``, the causal LM, for ``spec``'s
    vocabulary and length; a type without a causal form is refused for ``causal``."""
    attention = model_kwargs.get("attention_type", "full")
    if causal and attention not in causal_attention_types("text"):
        raise InputError(
            f"--causal needs an attention type with a causal form; {attention!r} has none. Causal types: "
            f"{', '.join(causal_attention_types('text'))}; or leave out --causal to train the bidirectional "
            "encoder, which every text type can."
        )
    config = build_model_config(
        EfficientBertConfig,
        {
            **model_kwargs,
            "vocab_size": spec.vocab_size,
            "max_position_embeddings": spec.seq_len,
            "pad_token_id": 0,  # the filler token; nothing is padded (attention_mask is all ones)
            **({"is_decoder": True} if causal else {"sparse_prediction": True}),
        },
    )
    return (EfficientBertForCausalLM if causal else EfficientBertForMaskedLM)(config)


@releases_output_dirs  # the run's output folder lock ends with it, also in a notebook
def main(args: list[str] | None = None) -> dict:
    parser = HfArgumentParser(
        (RandomStateArguments, MQARArguments, ConfigArguments, EfficientTrainingArguments)
    )
    parsed, model_kwargs = setup_run(
        parser, EfficientBertConfig, ATTENTION_CONFIGS, _with_default_config(args)
    )
    model_args, data_args, _, training_args = parsed
    if data_args.hidden_size is not None:
        model_kwargs.update(hidden_size=data_args.hidden_size, intermediate_size=2 * data_args.hidden_size)

    a = data_args
    pairs = a.num_kv_pairs if a.num_kv_pairs is not None else zoology_num_kv_pairs(a.seq_len)
    spec = MQARSpec(a.seq_len, pairs, a.vocab_size, a.power_a, a.random_non_queries)
    model = build_model(model_kwargs, spec, a.causal)
    config = model.config

    seeds = {
        "train": a.mqar_seed,
        "validation": a.mqar_seed + VALIDATION_SEED_OFFSET,
        "test": a.mqar_seed + ZOOLOGY_TEST_SEED_OFFSET,
    }
    sizes = {"train": a.num_train, "validation": a.num_validation, "test": a.num_test}
    data = {split: generate_mqar(spec, sizes[split], seeds[split]) for split in sizes if sizes[split] > 0}
    if a.causal:  # EfficientBertForCausalLM predicts labels[i + 1] at position i
        data = {
            split: ds.map(
                lambda batch: {"labels": causal_labels(batch["labels"])}, batched=True, desc="causal labels"
            )
            for split, ds in data.items()
        }

    def compute_metrics(prediction) -> dict[str, float]:
        return {"accuracy": recall_accuracy(prediction.predictions, prediction.label_ids, causal=a.causal)}

    trainer = EfficientTrainer(
        model=model,
        args=training_args,
        train_dataset=data["train"],
        eval_dataset=data.get("validation"),
        data_collator=default_data_collator,
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=masked_lm_predictions,  # (b, n) predicted ids, not (b, n, V) logits
        callbacks=random_state_callbacks(model, model_args, training_args.seed),
    )
    form = "causal LM" if a.causal else "bidirectional encoder"
    logger.info("MQAR %s: %s, %s attention, width %d", describe_spec(spec), form, config.attention_type,
                config.hidden_size)  # fmt: skip
    metrics, efficiency, record = generated_task_run(trainer, data, spec.seq_len)
    result = {
        "attention_type": config.attention_type,
        "attention_config": config.attention_config,
        "formulation": "causal" if a.causal else "bidirectional",
        "test_accuracy": metrics.get("test_accuracy"),
        "eval_accuracy": metrics.get("eval_accuracy"),
        # numbers at the top level, so that benchmarks.seeds aggregates them with the accuracies
        "hidden_size": config.hidden_size,
        "seq_len": spec.seq_len,
        "num_kv_pairs": spec.num_kv_pairs,
        "data": {**describe_spec(spec), **{f"num_{k}": v for k, v in sizes.items()}, "seeds": seeds},
        **record,
    }
    if trainer.is_world_process_zero():
        results_path = Path(training_args.output_dir, RESULTS_FILE)
        results_path.write_text(json.dumps(result, indent=2))
        table = "table of all runs: python -m benchmarks.studies.mqar"
        logger.info("MQAR %s: %s (%s)", config.attention_type, results_path, table)
    finish_run(
        trainer,
        metrics,
        headline=f"MQAR {config.attention_type} ({form}, width {config.hidden_size}, length {spec.seq_len})",
        shown=("accuracy",),
        summary="Trained from scratch on multi-query associative recall (Zoology, Arora et al. 2023; "
        "generated locally) by `benchmarks/tasks/train_mqar.py`.",
        data_description=f"{sizes['train']:,} generated MQAR examples of {spec.seq_len} tokens, "
        f"{spec.num_kv_pairs} key-value pairs each, vocabulary {spec.vocab_size}, query gaps with power law "
        f"a = {spec.power_a:g} (seed {seeds['train']}); `benchmarks.tasks.mqar`.",
        training_args=training_args,
        extra_hyperparameters={
            "seq_len": spec.seq_len,
            "num_kv_pairs": spec.num_kv_pairs,
            "formulation": form,
        },
        eval_description=f"Recall accuracy (queries answered with exactly the stored value) on "
        f"{sizes['validation']} validation and {sizes['test']} test examples generated likewise.",
        efficiency=efficiency,
    )
    return result


if __name__ == "__main__":
    run_script(main)  # a user error: one "error: ..." line, exit status 2
