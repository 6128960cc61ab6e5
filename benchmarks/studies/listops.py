"""ListOps (Long Range Arena) results of ``benchmarks/tasks/train_listops.py``: one table and one plot of all
runs.

Every ``listops_results.json`` under ``--results`` (one per run, each written by the training script next to
its saved model) becomes a row: test and validation accuracy, the LRA paper's number for the type
(the core's ``lra_listops``), the majority class and the outer-operator baseline of
the test data, how often the saved model answers a test expression as its outermost operator alone would
(the shortcut a model finds first; the data is generated again from the run's settings), seconds per step
and training time. The validation curves of the runs go into one plot.

    python -m benchmarks.tasks.train_listops --attention_type full --output_dir runs/listops/full
    python -m benchmarks.tasks.train_listops --attention_type linear --output_dir runs/listops/linear
    python -m benchmarks.studies.listops --results runs/listops

Reference results: ``benchmarks/results/reference/listops/`` (its settings and the loop over every type that
regenerates it: ``benchmarks/results/reference/README.md``).

Writes ``listops_summary.md``, ``listops_summary.json`` (the runs' results with the agreement added) and
``listops_curves.png`` into ``--out`` (default: the results folder), and prints the table.
"""

from __future__ import annotations

import argparse
import functools
import json
from dataclasses import asdict
from pathlib import Path

from benchmarks.report import pyplot, write_report
from hf_efficient.markdown import markdown_table

RESULTS_FILE = "listops_results.json"  # what benchmarks/tasks/train_listops.py writes into each output_dir
COLUMNS = [
    "attention",
    "test accuracy (%)",
    "LRA paper (%)",
    "validation accuracy (%)",
    "majority class (%)",
    "outer operator (%)",
    "answers as outer operator (%)",
    "s/step",
    "training time (s)",
]
DATA_NOTE = (
    "LRA paper: 96k training expressions of 500-2000 tokens. Outer operator: the test accuracy of answering "
    "each expression's outermost operator with its most frequent training label (what a model reading only "
    "the first token reaches; LRA's Transformer scores about this, its Linear Trans. and Performer about the "
    "majority class). Answers as outer operator: how often the saved model's test prediction is that guess "
    "(100% means it reads only the first token)."
)


def lra_reference(attention_type: str) -> str:
    """LRA's ListOps accuracy for the type, e.g. ``'36.37 (Transformer)'``, or ``'-'``."""
    from hf_efficient.attention import ATTENTION_REGISTRY

    core = ATTENTION_REGISTRY.get(attention_type)
    if core is None or core.lra_listops is None:
        return "-"
    name, accuracy = core.lra_listops
    return f"{accuracy:.2f} ({name})"


def table_row(result: dict) -> list[str]:
    """One run's cells, in the order of ``COLUMNS``."""

    def percent(key: str) -> str:
        return f"{100 * result[key]:.2f}" if result.get(key) is not None else "-"

    seconds, runtime = result.get("seconds_per_step"), result.get("train_runtime")
    return [
        result["attention_type"],
        percent("test_accuracy"),
        lra_reference(result["attention_type"]),
        percent("eval_accuracy"),
        percent("test_majority_fraction"),
        percent("test_outer_operator_baseline"),
        percent("test_outer_operator_agreement"),
        f"{seconds:.3f}" if seconds is not None else "-",
        f"{runtime:.0f}" if runtime else "-",
    ]


def collect(root: Path) -> list[dict]:
    """Every run's results under ``root`` with its outer-operator agreement, sorted by type and folder."""
    from tqdm.auto import tqdm

    paths = sorted(root.rglob(RESULTS_FILE))
    if not paths:
        raise FileNotFoundError(
            f"No {RESULTS_FILE} under {root}: run benchmarks/tasks/train_listops.py first."
        )
    results, data_by_settings = [], {}
    for path in tqdm(paths, desc="ListOps runs", unit="run"):
        result = json.loads(path.read_text())
        agreement = saved_model_agreement(path.parent, result, data_by_settings)
        result["test_outer_operator_agreement"] = agreement
        results.append(result)
    return sorted(results, key=lambda r: (r["attention_type"], r.get("output_dir", "")))


def saved_model_agreement(run_dir: Path, result: dict, data_by_settings: dict) -> float | None:
    """How often the model saved in ``run_dir`` answers a test expression with the guess for its outermost
    operator (``benchmarks.tasks.listops.outer_operator_agreement``); None without a saved model or test
    data. The data is generated again from the run's settings (only the train and test splits: each has its
    own stream), once per settings in ``data_by_settings``: the runs of one table share it."""
    import torch
    from transformers import AutoTokenizer

    from benchmarks.tasks import listops
    from hf_efficient import EfficientBertForSequenceClassification

    data = result.get("data") or {}
    if not (run_dir / "config.json").exists() or not data.get("num_test"):
        return None
    key = json.dumps(data, sort_keys=True)
    if key not in data_by_settings:
        spec = listops.ListOpsSpec(**{name: data[name] for name in asdict(listops.ListOpsSpec())})
        sizes = {"train": data["num_train"], "test": data["num_test"]}
        data_by_settings[key] = listops.generate_listops(spec, sizes, seed=data["seed"])
    raw = data_by_settings[key]
    model = EfficientBertForSequenceClassification.from_pretrained(run_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(run_dir)
    test = listops.tokenize_listops(raw["test"], tokenizer, result.get("padded_to"))
    test = test.select_columns(["input_ids", "attention_mask"])
    predictions = []
    with torch.no_grad():
        for start in range(0, len(test), 32):
            batch = tokenizer.pad(test[start : start + 32], return_tensors="pt")  # per batch, as in training
            predictions += model(**batch).logits.argmax(-1).tolist()
    guesses = listops.outer_operator_guesses(raw["train"])
    return listops.outer_operator_agreement(predictions, list(raw["test"]["source"]), guesses)


def setting(result: dict) -> str:
    """A run's data and model in a few words, e.g. ``'20-80 tokens, depth 3; 4 x 128, 20000 steps'``."""
    data, model = result.get("data") or {}, result.get("model")
    size = (
        f"{model.get('num_hidden_layers')} x {model.get('hidden_size')}" if model else "model size not saved"
    )
    return (
        f"{data.get('min_length')}-{data.get('max_length')} tokens, depth {data.get('max_depth')}; "
        f"{size}, {result.get('steps')} steps"
    )


def settings_differ(results: list[dict]) -> bool:
    """Whether the runs differ in data, model size or steps (then each row names its setting)."""
    return len({json.dumps([r.get("data"), setting(r)], sort_keys=True) for r in results}) > 1


def summarize(results: list[dict], curves: bool) -> str:
    """The markdown table of the runs, a note on their data, and the curves' image when there is one. Runs of
    different settings get a ``setting`` column: each row's floors (majority class, outer operator) are
    those of its own test data."""
    lines = ["# ListOps (Long Range Arena), regenerated locally", ""]
    if settings_differ(results):
        columns = [COLUMNS[0], "setting", *COLUMNS[1:]]
        rows = [
            [row[0], setting(r), *row[1:]] for r, row in zip(results, map(table_row, results), strict=True)
        ]
        lines += markdown_table(columns, rows)
        note = "each row's setting, its floors (majority class, outer operator) those of its own test data"
        lines += ["", f"Data: {note}. {DATA_NOTE}"]
    else:
        lines += markdown_table(COLUMNS, [table_row(r) for r in results])
        data = results[0].get("data", {})
        lines += [
            "",
            f"Data: {data.get('num_train')} training / {data.get('num_test')} test expressions of "
            f"{data.get('min_length')}-{data.get('max_length')} tokens (seed {data.get('seed')}). "
            + DATA_NOTE,
        ]
    if curves:
        lines += ["", "![validation accuracy during training](listops_curves.png)"]
    return "\n".join(lines)


def plot_curves(results: list[dict], path: Path) -> None:
    """Validation accuracy against training step, one line per run, with the majority class and the
    outer-operator baseline as dashed floors: of the runs' data, or, where the settings differ, each run's
    outer-operator floor in its line's colour."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(7, 4.5))
    differ = settings_differ(results)
    for index, result in enumerate(results):
        if result.get("eval_curve"):
            steps, accuracy = zip(*result["eval_curve"], strict=True)
            label = result["attention_type"] + (f" ({setting(result)})" if differ else "")
            axes.plot(steps, [100 * a for a in accuracy], marker="o", color=f"C{index % 10}", label=label)
            if differ and result.get("test_outer_operator_baseline") is not None:
                axes.axhline(
                    100 * result["test_outer_operator_baseline"], color=f"C{index % 10}", linestyle="--"
                )
    floors = {"majority class": "test_majority_fraction", "outer operator": "test_outer_operator_baseline"}
    for (name, key), style in zip(floors.items(), (":", "--"), strict=True):
        if not differ and results[0].get(key) is not None:
            axes.axhline(100 * results[0][key], color="grey", linestyle=style, label=f"{name} (test)")
    if differ:
        axes.plot([], [], color="grey", linestyle="--", label="outer operator (test), per run")
    axes.set(xlabel="training step", ylabel="validation accuracy (%)", title="ListOps")
    axes.legend(fontsize=8, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--results", type=Path, required=True, help="folder holding the runs' output_dirs")
    parser.add_argument("--out", type=Path, help="where the summary goes (default: --results)")
    args = parser.parse_args(argv)
    results = collect(args.results)
    curves = any(r.get("eval_curve") for r in results)
    plots = {"listops_curves.png": functools.partial(plot_curves, results)} if curves else {}
    summary = summarize(results, curves)
    write_report(
        args.out or args.results,
        results,
        summary,
        plots,
        results_name="listops_summary.json",
        summary_name="listops_summary.md",
    )
    return results


if __name__ == "__main__":
    main()
