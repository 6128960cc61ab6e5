"""Long Range Arena's ListOps (Tay et al. 2020), regenerated locally: a small EfficientBert from scratch.

The expressions (``hf_efficient.data.listops``: MIN, MAX, MED, SUM_MOD over digits, nested up to 10 deep, 10
classes) are generated for a seed and cached (default: ``<output_dir>/../listops_data/<settings>``), so every
attention type trains on the same data. The model and the training schedule come from
``configs/listops/base.json`` (used when no ``--config`` is given) and
``configs/listops/attention/<type>.json``; flags override both. Attention with a fixed maximum length
(Linformer: ``capabilities.fixed_max_length``) gets every input padded to ``max_position_embeddings``, as LRA
pads; the others are padded per batch.

One run per attention type, then one summary table (markdown + JSON) of all of them, with how often each saved
model answers a test expression as its outermost operator alone would (the shortcut a model finds first)::

    python scripts/train_listops.py --attention_type full --output_dir runs/listops/full
    python scripts/train_listops.py --attention_type linear --output_dir runs/listops/linear
    python scripts/train_listops.py --summarize runs/listops

Each run writes ``listops_results.json`` (test and validation accuracy, seconds per step, settings, LRA's
number for the type), the model with its tokenizer and a model card, and prints a markdown table row. LRA's
numbers are for 96k training examples of 500-2000 tokens and much longer training: they are a reference
point, not what the CPU-sized default reaches (see the config's description).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AutoTokenizer, DataCollatorWithPadding, HfArgumentParser

from hf_efficient import EfficientBertConfig, EfficientBertForSequenceClassification
from hf_efficient.attention import ATTENTION_REGISTRY
from hf_efficient.data import check_sequence_length
from hf_efficient.data.listops import (
    LABEL_NAMES,
    VOCAB,
    ListOpsSpec,
    build_listops_tokenizer,
    describe_listops,
    generate_listops,
    outer_operator_agreement,
    outer_operator_baseline,
    outer_operator_guesses,
    tokenize_listops,
)
from hf_efficient.training import (
    ConfigArguments,
    EfficientTrainer,
    EfficientTrainingArguments,
    RandomStateArguments,
    build_compute_metrics,
    build_model_card,
    efficiency_metrics,
    end_distributed_run,
    evaluate_and_save,
    random_state_callbacks,
    save_model_card,
    setup_run,
    train_and_save,
)

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "listops"
DEFAULT_CONFIG = CONFIGS / "base.json"
ATTENTION_CONFIGS = CONFIGS / "attention"
RESULTS_FILE = "listops_results.json"
TABLE_HEADER = (
    "| attention | test accuracy (%) | LRA paper (%) | validation accuracy (%) | majority class (%) "
    "| outer operator (%) | answers as outer operator (%) | s/step | training time (s) |\n"
    "|---|---|---|---|---|---|---|---|---|"
)
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


def lra_listops(attention_type: str) -> tuple[str | None, float | None]:
    """(model name, ListOps test accuracy %) the LRA paper reports for the type (its core's facts)."""
    cls = ATTENTION_REGISTRY.get(attention_type)
    return (cls.lra_listops if cls is not None else None) or (None, None)


def lra_reference(attention_type: str) -> str:
    """LRA's ListOps accuracy for the type, e.g. ``'36.37 (Transformer)'``, or ``'-'``."""
    name, accuracy = lra_listops(attention_type)
    if accuracy is None:
        return "-"
    return f"{accuracy:.2f} ({name})"


def table_row(result: dict) -> str:
    def percent(key: str) -> str:
        return f"{100 * result[key]:.2f}" if result.get(key) is not None else "-"

    seconds = result.get("seconds_per_step")
    runtime = result.get("train_runtime")
    return (
        f"| {result['attention_type']} | {percent('test_accuracy')} "
        f"| {lra_reference(result['attention_type'])} "
        f"| {percent('eval_accuracy')} | {percent('test_majority_fraction')} "
        f"| {percent('test_outer_operator_baseline')} | {percent('test_outer_operator_agreement')} "
        f"| {f'{seconds:.3f}' if seconds is not None else '-'} | {f'{runtime:.0f}' if runtime else '-'} |"
    )


def summarize(root: str | Path) -> list[dict]:
    """Collect every ``listops_results.json`` under ``root`` into ``listops_summary.md`` / ``.json`` there."""
    root = Path(root)
    paths = sorted(root.rglob(RESULTS_FILE))
    if not paths:
        raise FileNotFoundError(f"No {RESULTS_FILE} under {root}: run scripts/train_listops.py first.")
    results, data_by_settings = [], {}
    for path in tqdm(paths, desc="ListOps runs", unit="run"):
        result = json.loads(path.read_text())
        agreement = _outer_operator_agreement(path.parent, result, data_by_settings)
        result["test_outer_operator_agreement"] = agreement
        results.append(result)
    results.sort(key=lambda r: (r["attention_type"], r.get("output_dir", "")))
    settings = {json.dumps(r.get("data"), sort_keys=True) for r in results}
    lines = ["# ListOps (Long Range Arena), regenerated locally", "", TABLE_HEADER]
    lines += [table_row(r) for r in results]
    if len(settings) > 1:
        lines += ["", "Warning: these runs used different data settings; compare with care."]
    data = results[0].get("data", {})
    lines += [
        "",
        f"Data: {data.get('num_train')} training / {data.get('num_test')} test expressions of "
        f"{data.get('min_length')}-{data.get('max_length')} tokens (seed {data.get('seed')}). LRA paper: 96k "
        "training expressions of 500-2000 tokens. Outer operator: the test accuracy of answering each "
        "expression's outermost operator with its most frequent training label (what a model reading only "
        "the first token reaches; LRA's Transformer scores about this, its Linear Trans. and Performer about "
        "the majority class). Answers as outer operator: how often the saved model's test prediction is that "
        "guess (100% means it reads only the first token).",
    ]
    if any(r.get("eval_curve") for r in results):
        _plot_curves(results, root / "listops_curves.png")
        lines += ["", "![validation accuracy during training](listops_curves.png)"]
    text = "\n".join(lines) + "\n"
    (root / "listops_summary.md").write_text(text)
    (root / "listops_summary.json").write_text(json.dumps(results, indent=2))
    print(text, flush=True)
    return results


def _outer_operator_agreement(run_dir: Path, result: dict, data_by_settings: dict) -> float | None:
    """How often the model saved in ``run_dir`` answers a test expression with the guess for its outermost
    operator (:func:`outer_operator_agreement`); None without a saved model or test data. The data is
    generated again from the run's settings (only the train and test splits: each has its own stream), once
    per settings in ``data_by_settings``: the runs of one table share it."""
    data = result.get("data") or {}
    if not (run_dir / "config.json").exists() or not data.get("num_test"):
        return None
    key = json.dumps(data, sort_keys=True)
    if key not in data_by_settings:
        spec = ListOpsSpec(**{name: data[name] for name in asdict(ListOpsSpec())})
        sizes = {"train": data["num_train"], "test": data["num_test"]}
        data_by_settings[key] = generate_listops(spec, sizes, seed=data["seed"])
    raw = data_by_settings[key]
    model = EfficientBertForSequenceClassification.from_pretrained(run_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(run_dir)
    test = tokenize_listops(raw["test"], tokenizer, result.get("padded_to"))
    test = test.select_columns(["input_ids", "attention_mask"])
    predictions = []
    with torch.no_grad():
        for start in range(0, len(test), 32):
            batch = tokenizer.pad(test[start : start + 32], return_tensors="pt")  # per batch, as in training
            predictions += model(**batch).logits.argmax(-1).tolist()
    guesses = outer_operator_guesses(raw["train"])
    return outer_operator_agreement(predictions, list(raw["test"]["source"]), guesses)


def _plot_curves(results: list[dict], path: Path) -> None:
    """Validation accuracy against training step, one line per run, with the majority class and the
    outer-operator baseline of the first run's data as dashed floors."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for result in results:
        if result.get("eval_curve"):
            steps, accuracy = zip(*result["eval_curve"], strict=True)
            axes.plot(steps, [100 * a for a in accuracy], marker="o", label=result["attention_type"])
    floors = {"majority class": "test_majority_fraction", "outer operator": "test_outer_operator_baseline"}
    for (name, key), style in zip(floors.items(), (":", "--"), strict=True):
        if results[0].get(key) is not None:
            axes.axhline(100 * results[0][key], color="grey", linestyle=style, label=f"{name} (test)")
    axes.set(xlabel="training step", ylabel="validation accuracy (%)", title="ListOps")
    axes.legend(fontsize=8, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


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


def main(args: list[str] | None = None) -> dict:
    args = list(sys.argv[1:] if args is None else args)
    if "--summarize" in args or any(a.startswith("--summarize=") for a in args):
        pre = argparse.ArgumentParser(description="Summarize ListOps runs into one table.")
        pre.add_argument("--summarize", required=True, help="Folder holding the runs' output_dirs.")
        return {"runs": summarize(pre.parse_args(args).summarize)}

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
    config = EfficientBertConfig(
        **{
            **model_kwargs,
            "vocab_size": len(VOCAB),
            "pad_token_id": VOCAB.index("[PAD]"),
            "num_labels": len(LABEL_NAMES),
            "id2label": id2label,
            "label2id": {label: i for i, label in id2label.items()},
        }
    )
    check_sequence_length(spec.max_length + 1, config.max_position_embeddings, "max_length + 1 ([CLS])")
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
    train_result = train_and_save(trainer)
    mean_tokens = pad_to or float(np.mean(raw["train"]["length"])) + 1
    efficiency = efficiency_metrics(train_result.metrics, mean_tokens)
    metrics: dict[str, float] = {}
    if "validation" in data:
        metrics.update(evaluate_and_save(trainer, data["validation"], "eval"))
    if "test" in data:
        metrics.update(evaluate_and_save(trainer, data["test"], "test"))

    steps = train_result.global_step
    result = {
        "attention_type": attention,
        "attention_config": config.attention_config,
        "test_accuracy": metrics.get("test_accuracy"),
        "eval_accuracy": metrics.get("eval_accuracy"),
        "test_majority_fraction": stats["test"]["majority_fraction"] if "test" in stats else None,
        # The label most frequent in training for the test expression's outermost operator (module docs of
        # hf_efficient.data.listops): what a model reading only the first token reaches.
        "test_outer_operator_baseline": (
            outer_operator_baseline(raw["train"], raw["test"]) if "test" in raw else None
        ),
        "lra_paper_accuracy": lra_listops(attention)[1],
        "lra_paper_model": lra_listops(attention)[0],
        "train_runtime": train_result.metrics.get("train_runtime"),
        "steps": steps,
        "seconds_per_step": train_result.metrics["train_runtime"] / steps if steps else None,
        "padded_to": pad_to,
        "num_parameters": model.num_parameters(),
        "model": {
            key: getattr(config, key)
            for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
        },
        "data": {**{f"num_{k}": v for k, v in sizes.items()}, **asdict(spec), "seed": data_args.listops_seed},
        "training": {
            "learning_rate": training_args.learning_rate,
            "per_device_train_batch_size": training_args.per_device_train_batch_size,
            "num_train_epochs": training_args.num_train_epochs,
            "max_steps": training_args.max_steps,
            "seed": training_args.seed,
        },
        # Validation accuracy during training (eval_strategy "steps"): where a type leaves the majority class.
        "eval_curve": [
            [entry["step"], entry["eval_accuracy"]]
            for entry in trainer.state.log_history
            if "eval_accuracy" in entry and entry["step"] < steps
        ]
        + ([[steps, metrics["eval_accuracy"]]] if "eval_accuracy" in metrics else []),
        "output_dir": str(training_args.output_dir),
    }
    if trainer.is_world_process_zero():
        Path(training_args.output_dir, RESULTS_FILE).write_text(json.dumps(result, indent=2))
        print(f"{TABLE_HEADER}\n{table_row(result)}", flush=True)
        card = build_model_card(
            model,
            summary="Trained from scratch on ListOps (Long Range Arena, regenerated locally) by "
            "`scripts/train_listops.py`.",
            data_description=f"{sizes['train']:,} generated ListOps expressions of {spec.min_length}-"
            f"{spec.max_length} tokens drawn as LRA draws them (operators nest at most {spec.max_depth - 1} "
            f"deep, {spec.min_args}-{spec.max_args} arguments, each an operator with probability "
            f"{spec.operator_probability:g}; seed {data_args.listops_seed}); `hf_efficient.data.listops`.",
            training_args=training_args,
            extra_hyperparameters={"min_length": spec.min_length, "max_length": spec.max_length},
            eval_metrics=metrics,
            eval_description=f"Validation ({sizes['validation']}) and test ({sizes['test']}) expressions "
            "generated with the same settings. LRA paper (Tay et al. 2020) for this attention: "
            f"{lra_reference(attention)}.",
            eval_dataset="listops",
            efficiency=efficiency,
        )
        save_model_card(card, training_args.output_dir)
    return result


if __name__ == "__main__":
    main()
    end_distributed_run()  # every process: gloo threads must not outlive the group
