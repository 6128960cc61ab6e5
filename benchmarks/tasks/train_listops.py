"""Long Range Arena's ListOps (Tay et al. 2020), regenerated locally: a small EfficientBert from scratch.

The expressions (``benchmarks.tasks.listops``: MIN, MAX, MED, SUM_MOD over digits, nested up to 10 deep, 10
classes) are generated for a seed and cached (default: ``<output_dir>/../listops_data/<settings>``), so every
attention type trains on the same data. The model and the training schedule come from
``benchmarks/configs/listops/base.json`` (used when no ``--config`` is given) and
each core's ``script_configs["listops"]``; flags override both. Attention with a fixed maximum length
(Linformer: ``capabilities.fixed_max_length``) gets every input padded to ``max_position_embeddings``, as LRA
pads; the others are padded per batch.

One run per attention type; the table and plot of all of them come from the ListOps benchmark (run from the
repository root), with how often each saved model answers a test expression as its outermost operator alone
would (the shortcut a model finds first)::

    python -m benchmarks.tasks.train_listops --attention_type full --output_dir runs/listops/full
    python -m benchmarks.tasks.train_listops --attention_type linear --output_dir runs/listops/linear
    python -m benchmarks.studies.listops --results runs/listops

Each run writes ``listops_results.json`` (test and validation accuracy, seconds per step, settings, LRA's
number for the type, the validation curve) and the model with its tokenizer and a model card. LRA's numbers
are for 96k training examples of 500-2000 tokens and much longer training: they are a reference point, not
what the CPU-sized default reaches (see the config's description).
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from transformers import DataCollatorWithPadding, HfArgumentParser

from benchmarks.tasks.listops import (
    LABEL_NAMES,
    VOCAB,
    ListOpsSpec,
    build_listops_tokenizer,
    describe_listops,
    generate_listops,
    outer_operator_baseline,
    tokenize_listops,
)
from benchmarks.tasks.training import generated_task_run
from hf_efficient import EfficientBertConfig, EfficientBertForSequenceClassification, get_attention_class
from hf_efficient.cli import run_script
from hf_efficient.data import check_sequence_length
from hf_efficient.training import (
    ConfigArguments,
    EfficientTrainer,
    EfficientTrainingArguments,
    RandomStateArguments,
    build_compute_metrics,
    build_model_config,
    finish_run,
    random_state_callbacks,
    releases_output_dirs,
    setup_run,
)

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "listops"
DEFAULT_CONFIG = CONFIGS / "base.json"
ATTENTION_CONFIGS = CONFIGS / "attention"
RESULTS_FILE = "listops_results.json"
logger = logging.getLogger(__name__)


@dataclass
class ListOpsArguments:
    min_length: int = field(
        default=500, metadata={"help": "Shortest expression, in tokens ([CLS] not counted)."}
    )
    max_length: int = field(default=1000, metadata={"help": "Longest expression (LRA: 2000)."})
    max_depth: int = field(
        default=10,
        metadata={"help": "Tree depth as LRA counts it: operators nest at most max_depth - 1 deep."},
    )
    min_args: int = field(default=2, metadata={"help": "Fewest arguments of an operator (LRA: 2)."})
    max_args: int = field(default=10, metadata={"help": "Most arguments of an operator (LRA: 10)."})
    operator_probability: float = field(
        default=0.25,
        metadata={"help": "How often an argument is an operator rather than a digit (LRA: 0.25)."},
    )
    num_train: int = field(default=4000, metadata={"help": "Training examples (LRA: 96,000)."})
    num_validation: int = field(default=200, metadata={"help": "Validation examples (LRA: 2,000)."})
    num_test: int = field(default=500, metadata={"help": "Test examples (LRA: 2,000)."})
    listops_seed: int = field(default=0, metadata={"help": "Seed of the generated data."})
    data_dir: str | None = field(
        default=None,
        metadata={"help": "Cache folder of the data; none: <output_dir>/../listops_data/<settings>."},
    )


class _ListOpsTask:
    metrics = ("accuracy",)
    is_regression = False


def _with_default_config(args: list[str] | None) -> list[str]:
    args = list(sys.argv[1:] if args is None else args)
    if not any(a == "--config" or a.startswith("--config=") for a in args):
        args = ["--config", str(DEFAULT_CONFIG), *args]
    return args


def _data_folder(data_args: ListOpsArguments, output_dir: str) -> Path:
    if data_args.data_dir:
        return Path(data_args.data_dir)
    a = data_args
    key = (
        f"len{a.min_length}-{a.max_length}_depth{a.max_depth}_args{a.min_args}-{a.max_args}"
        f"_op{a.operator_probability:g}"
        f"_n{a.num_train}-{a.num_validation}-{a.num_test}_seed{a.listops_seed}"
    )
    return Path(output_dir).resolve().parent / "listops_data" / key


@releases_output_dirs  # the run's output folder lock ends with it, also in a notebook
def main(args: list[str] | None = None) -> dict:
    parser = HfArgumentParser(
        (RandomStateArguments, ListOpsArguments, ConfigArguments, EfficientTrainingArguments)
    )
    parsed, model_kwargs = setup_run(
        parser, EfficientBertConfig, ATTENTION_CONFIGS, _with_default_config(args)
    )
    model_args, data_args, _, training_args = parsed

    a = data_args
    spec = ListOpsSpec(
        a.min_length, a.max_length, a.max_depth, a.min_args, a.max_args, a.operator_probability
    )
    sizes = {"train": data_args.num_train, "validation": data_args.num_validation, "test": data_args.num_test}
    folder = _data_folder(data_args, training_args.output_dir)
    with training_args.main_process_first(desc="generating ListOps"):
        raw = generate_listops(spec, sizes, seed=data_args.listops_seed, cache_dir=folder)
    stats = {split: describe_listops(raw[split]) for split in raw}
    for split, described in stats.items():
        logger.info("ListOps %s: %s", split, described)

    id2label = dict(enumerate(LABEL_NAMES))
    config = build_model_config(
        EfficientBertConfig,
        {
            **model_kwargs,
            "vocab_size": len(VOCAB),
            "pad_token_id": VOCAB.index("[PAD]"),
            "num_labels": len(LABEL_NAMES),
            "id2label": id2label,
            "label2id": {label: i for i, label in id2label.items()},
        },
    )
    check_sequence_length(spec.max_length + 1, config.max_position_embeddings, "--max_length (+ 1 for [CLS])")
    model = EfficientBertForSequenceClassification(config)
    tokenizer = build_listops_tokenizer(config.max_position_embeddings)
    fixed_length = any(core.capabilities.fixed_max_length for core in model.attention_cores())
    pad_to = config.max_position_embeddings if fixed_length else None
    with training_args.main_process_first(desc="tokenizing"):
        data = tokenize_listops(raw, tokenizer, pad_to)

    trainer = EfficientTrainer(
        model=model,
        args=training_args,
        train_dataset=data["train"],
        eval_dataset=data["validation"] if "validation" in data else None,
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        compute_metrics=build_compute_metrics(_ListOpsTask),
        callbacks=random_state_callbacks(model, model_args, training_args.seed),
    )
    attention = config.attention_type
    logger.info(
        "ListOps: %d training examples, %s attention, padding %s", len(data["train"]), attention, pad_to
    )
    mean_tokens = pad_to or float(np.mean(raw["train"]["length"])) + 1
    metrics, efficiency, record = generated_task_run(trainer, data, mean_tokens)

    lra = get_attention_class(attention).lra_listops  # (LRA model name, ListOps test accuracy %) or None
    result = {
        "attention_type": attention,
        "attention_config": config.attention_config,
        "test_accuracy": metrics.get("test_accuracy"),
        "eval_accuracy": metrics.get("eval_accuracy"),
        "test_majority_fraction": stats["test"]["majority_fraction"] if "test" in stats else None,
        # The label most frequent in training for the test expression's outermost operator (module docs of
        # benchmarks.tasks.listops): what a model reading only the first token reaches.
        "test_outer_operator_baseline": (
            outer_operator_baseline(raw["train"], raw["test"]) if "test" in raw else None
        ),
        "lra_paper_accuracy": lra[1] if lra else None,
        "lra_paper_model": lra[0] if lra else None,
        "padded_to": pad_to,
        **record,  # the curve shows where a type leaves the majority class
        "data": {**{f"num_{k}": v for k, v in sizes.items()}, **asdict(spec), "seed": data_args.listops_seed},
    }
    if trainer.is_world_process_zero():
        results_path = Path(training_args.output_dir, RESULTS_FILE)
        results_path.write_text(json.dumps(result, indent=2))
        logger.info(
            "ListOps %s: %s (table of all runs: python -m benchmarks.studies.listops)",
            attention,
            results_path,
        )
    finish_run(
        trainer,
        metrics,
        headline=None,
        summary="Trained from scratch on ListOps (Long Range Arena, regenerated locally) by "
        "`benchmarks/tasks/train_listops.py`.",
        data_description=f"{sizes['train']:,} generated ListOps expressions of {spec.min_length}-"
        f"{spec.max_length} tokens drawn as LRA draws them (operators nest at most {spec.max_depth - 1} "
        f"deep, {spec.min_args}-{spec.max_args} arguments, each an operator with probability "
        f"{spec.operator_probability:g}; seed {data_args.listops_seed}); `benchmarks.tasks.listops`.",
        training_args=training_args,
        extra_hyperparameters={"min_length": spec.min_length, "max_length": spec.max_length},
        eval_description=f"Validation ({sizes['validation']}) and test ({sizes['test']}) expressions "
        "generated with the same settings. LRA paper (Tay et al. 2020) for this attention: "
        + (f"{lra[0]}, {lra[1]:.2f}%." if lra else "not reported."),
        eval_dataset="listops",
        efficiency=efficiency,
    )
    return result


if __name__ == "__main__":
    run_script(main)  # a user error: one "error: ..." line, exit status 2
