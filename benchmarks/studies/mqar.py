"""MQAR (multi-query associative recall, Zoology) for the text attention types: the grid of runs, its table.

``run`` trains ``benchmarks/tasks/train_mqar.py`` for every (type, width, sequence length) through the seeds
runner (``benchmarks.seeds``, one folder per setting:
``<out>/<formulation>/<type>/d<width>_n<length>/seed_<s>``), so the whole grid is one resumable command: a
finished seed is not run again, an interrupted one continues from its checkpoint. It ends with ``summarize``,
which can also be run alone::

    python -m benchmarks.studies.mqar run --types full linear --widths 64 128 --lengths 64 128 256 \\
        --seeds 0 --out runs/mqar
    python -m benchmarks.studies.mqar summarize --results runs/mqar

Flags after ``--`` go to every training run (e.g. ``-- --max_steps 300``); ``--causal`` trains causal LMs
(the types with a causal form) instead of the bidirectional encoder. ``--learning_rates 3e-4 1e-3 3e-3`` runs
every setting at each learning rate (folders ``.../d<width>_n<length>/lr_<lr>/seed_<s>``) and the table keeps,
per setting, the one with the best mean validation accuracy, as Zoology reports the best of its learning-rate
sweep: one rate does not suit every width (the 2-layer softmax model of width 128 stays on the 25% plateau at
the default 1e-3 where width 64 reaches 99%).

``summarize`` collects every ``mqar_results.json`` under ``--results`` (the seeds runner's folders or single
runs) into one table (type x sequence length x width: test recall accuracy, mean ± std over seeds where there
are several) and a plot in Zoology's style (accuracy against model width, one panel per sequence length, one
line per type). Writes ``mqar_summary.md``, ``mqar_summary.json`` and ``mqar_accuracy.png`` into ``--out``
(default: the results folder), and prints the table. ``--merge_with <earlier mqar_summary.json>`` keeps the
settings of an earlier summary that the runs lack (a grid extended on another machine), unchanged.

What to compare with (:data:`ZOOLOGY_NOTE`): Zoology's Figure 2 (attention at or near 100% at every width and
length, where the attention-free models need more width as the sequence grows) and Based's Figure 2 (linear
attention's recall grows with its state size). No number is read off those figures here.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from benchmarks import seeds
from benchmarks.report import pyplot, write_report
from hf_efficient.markdown import markdown_table

RESULTS_FILE = "mqar_results.json"  # what benchmarks/tasks/train_mqar.py writes into each run's output_dir
ZOOLOGY_NOTE = (
    "Zoology (Arora et al. 2023, arXiv 2312.04927), Figure 2: MQAR accuracy against model dimension (64-512) "
    "of 2-layer models at sequence lengths 64, 128 and 256 with 4, 8 and 16 key-value pairs (the sweep of "
    "its repository's `zoology/experiments/paper_configs/iclr24_zoology_figure2/configs.py`: vocabulary "
    "8,192, 100,000 training examples, learning rates swept from 1e-4 to 1e-2, causal LMs). Attention "
    "solves MQAR at every width and length; the gated convolutions (Hyena, H3, RWKV, BaseConv) need a width "
    "that grows with the sequence length. Linear attention: Based (Arora et al. 2024, arXiv 2402.18668), "
    "Figure 2, plots MQAR accuracy against recurrent state size (`arxiv24_based_figure2/configs.py`: Based's "
    "Taylor-feature linear attention with a short convolution, widths 48-128): recall rises with the "
    "state size, the recall-memory tradeoff the paper is about. What this predicts here (a hypothesis, not "
    "a quoted number): `full` at or near 100% where the fixed-size-state types (`linear`, `performer`, "
    "`rfa`) are lower, the gap widening with length (more pairs held in the same state). We read no numbers "
    "off those figures."
)


# ---- running the grid --------------------------------------------------------------------------------------
def setting_folder(
    out: Path, attention_type: str, width: int, length: int, causal: bool, learning_rate: float | None = None
) -> Path:
    """``<out>/<formulation>/<type>/d<width>_n<length>``, then ``lr_<rate>`` for a rate of a sweep."""
    folder = out / ("causal" if causal else "bidirectional") / attention_type / f"d{width}_n{length}"
    return folder if learning_rate is None else folder / f"lr_{learning_rate:g}"


def setting_command(
    attention_type: str,
    width: int,
    length: int,
    causal: bool,
    extra: list[str],
    learning_rate: float | None = None,
) -> list[str]:
    """The training command of one setting, with the seeds runner's ``{seed}`` and ``{output_dir}``."""
    return [
        sys.executable,
        "-m",
        "benchmarks.tasks.train_mqar",
        *("--attention_type", attention_type, "--hidden_size", str(width), "--seq_len", str(length)),
        *(["--causal"] if causal else []),
        *([] if learning_rate is None else ["--learning_rate", f"{learning_rate:g}"]),
        *("--seed", "{seed}", "--output_dir", "{output_dir}"),
        *extra,
    ]


def run_grid(args: argparse.Namespace) -> list[str]:
    """Every setting through ``benchmarks.seeds`` (which skips finished seeds); returns the failed ones."""
    from tqdm.auto import tqdm

    if args.causal:
        from hf_efficient.attention.registry import causal_attention_types

        refused = sorted(set(args.types) - set(causal_attention_types("text")))
        if refused:
            raise SystemExit(
                f"--causal: {', '.join(refused)} have no causal form; causal types: "
                f"{', '.join(causal_attention_types('text'))} (or leave out --causal)."
            )
    rates = args.learning_rates or [None]  # None: the config's learning rate, no lr_ folder
    settings = [(t, w, n, lr) for t in args.types for n in args.lengths for w in args.widths for lr in rates]
    failed = []
    for attention_type, width, length, rate in tqdm(settings, desc="MQAR settings", unit="setting"):
        folder = setting_folder(args.out, attention_type, width, length, args.causal, rate)
        label = f"{attention_type} d{width} n{length}" + (" causal" if args.causal else "")
        label += "" if rate is None else f" lr {rate:g}"
        command = setting_command(attention_type, width, length, args.causal, args.extra, rate)
        argv = ["--seeds", *map(str, args.seeds), "--out", str(folder), "--results_file", RESULTS_FILE]
        try:
            seeds.main([*argv, *seeds.in_process_flag(args), "--label", label, "--", *command])
        except SystemExit as error:  # a failed seed: reported by the runner, the grid goes on
            if error.code:
                failed.append(label)
    return failed


# ---- the table and the plot --------------------------------------------------------------------------------
def collect(root: Path) -> list[dict]:
    """Every run's results under ``root``, sorted by formulation, type, length, width and folder."""
    paths = sorted(root.rglob(RESULTS_FILE))
    if not paths:
        raise FileNotFoundError(
            f"No {RESULTS_FILE} under {root}: run `python -m benchmarks.studies.mqar run` (or "
            "benchmarks/tasks/train_mqar.py) first."
        )
    results = [json.loads(path.read_text()) for path in paths]
    return sorted(results, key=lambda r: (*setting_key(r), r.get("output_dir", "")))


def setting_key(result: dict) -> tuple:
    return (result["formulation"], result["attention_type"], result["seq_len"], result["hidden_size"])


def learning_rate(result: dict) -> float | None:
    return result.get("training", {}).get("learning_rate")


def selection_score(runs: list[dict]) -> float:
    """How a learning rate is chosen among a setting's sweep: mean validation accuracy over its seeds (test
    accuracy only for runs that recorded none, e.g. older results)."""
    return statistics.fmean(
        run["test_accuracy"] if run.get("eval_accuracy") is None else run["eval_accuracy"] for run in runs
    )


def aggregate(results: list[dict]) -> list[dict]:
    """One entry per setting (formulation, type, length, width): test accuracy's mean, std (n - 1; 0 for one
    run) and number of seeds at the setting's best learning rate (by mean validation accuracy, when several
    were run), with every rate's validation and test means, the pairs and seconds per step."""
    groups = defaultdict(lambda: defaultdict(list))  # setting -> learning rate -> runs
    for result in results:
        if result.get("test_accuracy") is not None:
            groups[setting_key(result)][learning_rate(result)].append(result)
    settings = []
    for (formulation, attention_type, length, width), by_rate in sorted(groups.items()):
        best_rate = max(by_rate, key=lambda rate: selection_score(by_rate[rate]))
        runs = by_rate[best_rate]
        accuracies = [run["test_accuracy"] for run in runs]
        step_times = [run["seconds_per_step"] for run in runs if run.get("seconds_per_step")]
        settings.append(
            {
                "formulation": formulation,
                "attention_type": attention_type,
                "seq_len": length,
                "hidden_size": width,
                "num_kv_pairs": runs[0]["num_kv_pairs"],
                "accuracy_mean": statistics.fmean(accuracies),
                "accuracy_std": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
                "seeds": [run.get("training", {}).get("seed") for run in runs],
                "learning_rate": best_rate,
                "learning_rates": [  # the sweep: each rate's mean validation and test accuracy
                    {
                        "learning_rate": rate,
                        "validation_mean": selection_score(rate_runs),
                        "test_mean": statistics.fmean(run["test_accuracy"] for run in rate_runs),
                    }
                    for rate, rate_runs in sorted(by_rate.items(), key=lambda item: item[0] or 0.0)
                ],
                "seconds_per_step": statistics.fmean(step_times) if step_times else None,
            }
        )
    return settings


def accuracy_cell(setting: dict | None) -> str:
    """``"99.8"`` for one seed, ``"99.8 ± 0.2 (3)"`` for several, ``"-"`` for none (percent); ``" @ 3e-4"``
    after it names the chosen learning rate where a sweep ran."""
    if setting is None:
        return "-"
    mean, seeds = 100 * setting["accuracy_mean"], len(setting["seeds"])
    cell = f"{mean:.1f}" if seeds == 1 else f"{mean:.1f} ± {100 * setting['accuracy_std']:.1f} ({seeds})"
    return cell + (f" @ {setting['learning_rate']:g}" if len(setting["learning_rates"]) > 1 else "")


def sweep_table(settings: list[dict]) -> list[str]:
    """Where a setting ran at several learning rates: test accuracy (validation) at each rate, one row per
    setting, so that how much the rate decides is in plain sight. Empty without a sweep."""
    swept = [s for s in settings if len(s["learning_rates"]) > 1]
    if not swept:
        return []
    rates = sorted({r["learning_rate"] for s in swept for r in s["learning_rates"]})
    rows = []
    for s in swept:
        by_rate = {r["learning_rate"]: r for r in s["learning_rates"]}
        cells = [
            f"{100 * by_rate[rate]['test_mean']:.1f} ({100 * by_rate[rate]['validation_mean']:.1f})"
            if rate in by_rate
            else "-"
            for rate in rates
        ]
        rows.append(
            [s["attention_type"], s["formulation"], f"n={s['seq_len']}, d={s['hidden_size']}", *cells]
        )
    header = ["attention", "form", "setting", *(f"lr {rate:g}" for rate in rates)]
    title = "Every learning rate: test accuracy (%), validation accuracy in parentheses (mean over seeds)"
    return ["", f"## {title}", "", *markdown_table(header, rows)]


def summarize(settings: list[dict], plotted: bool) -> str:
    """The markdown table (one row per formulation and type, one column per length and width) and notes."""
    columns = sorted({(s["seq_len"], s["hidden_size"], s["num_kv_pairs"]) for s in settings})
    by_key = {(s["formulation"], s["attention_type"], s["seq_len"], s["hidden_size"]): s for s in settings}
    rows = []
    for formulation, attention_type in sorted({(s["formulation"], s["attention_type"]) for s in settings}):
        cells = [accuracy_cell(by_key.get((formulation, attention_type, n, d))) for n, d, _ in columns]
        rows.append([attention_type, formulation, *cells])
    header = ["attention", "form", *(f"n={n} ({k} pairs), d={d}" for n, d, k in columns)]
    lines = ["# MQAR (multi-query associative recall): test recall accuracy (%)", ""]
    lines += markdown_table(header, rows)
    lines += [
        "",
        "n: sequence length, d: model width (2 layers). Mean ± std (number of seeds) where several ran. "
        "Accuracy: the fraction of queries answered with exactly the value stored with their key. "
        "`x @ lr`: several learning rates ran for the setting and `lr` had the best mean validation accuracy "
        "(Zoology reports the best of its sweep); the next table has every rate.",
    ]
    lines += sweep_table(settings)
    lines += ["", ZOOLOGY_NOTE]
    if plotted:
        lines += ["", "![MQAR accuracy against model width](mqar_accuracy.png)"]
    return "\n".join(lines)


def plot_accuracy(settings: list[dict], path: Path) -> None:
    """Zoology's layout: accuracy against width, one panel per sequence length, one line per type (dashed:
    causal LM)."""
    plt = pyplot()
    lengths = sorted({s["seq_len"] for s in settings})
    figure, axes = plt.subplots(
        1,
        len(lengths),
        figsize=(4 * len(lengths) + 1.5, 3.6),
        sharey=True,
        squeeze=False,
        layout="constrained",
    )
    # one colour per type in every panel, and one legend beside them (inside, it hid the points near 0%)
    kinds = sorted({(s["attention_type"], s["formulation"]) for s in settings})
    colours = {kind: f"C{i % 10}" for i, kind in enumerate(kinds)}
    for panel, length in zip(axes[0], lengths, strict=True):
        lines = defaultdict(list)
        for s in settings:
            if s["seq_len"] == length:
                lines[(s["attention_type"], s["formulation"])].append(s)
        for (attention_type, formulation), points in sorted(lines.items()):
            points.sort(key=lambda s: s["hidden_size"])
            panel.errorbar(
                [s["hidden_size"] for s in points],
                [100 * s["accuracy_mean"] for s in points],
                yerr=[100 * s["accuracy_std"] for s in points],
                marker="o",
                capsize=3,
                linestyle="--" if formulation == "causal" else "-",
                color=colours[(attention_type, formulation)],
                label=attention_type + (" (causal)" if formulation == "causal" else ""),
            )
        pairs = points[0]["num_kv_pairs"] if lines else "?"
        panel.set(xscale="log", xlabel="model width", title=f"length {length}, {pairs} pairs", ylim=(-3, 103))
        widths = sorted({s["hidden_size"] for s in settings})
        panel.set_xticks(widths, [str(w) for w in widths])
        panel.minorticks_off()
    axes[0][0].set_ylabel("MQAR accuracy (%)")
    handles = {
        label: handle
        for panel in axes[0]
        for handle, label in zip(*panel.get_legend_handles_labels(), strict=True)
    }
    figure.legend(handles.values(), handles.keys(), fontsize=7, loc="outside right center")
    figure.savefig(path, dpi=120)
    plt.close(figure)


def read_earlier_summary(path: Path) -> list[dict]:
    """The settings of an earlier ``mqar_summary.json`` (a list of :func:`aggregate`'s entries)."""
    if not path.is_file():
        raise FileNotFoundError(f"--merge_with {path}: no such file; give an earlier mqar_summary.json.")
    needed = {"formulation", "attention_type", "seq_len", "hidden_size", "accuracy_mean", "learning_rates"}
    try:
        settings = json.loads(path.read_text())
        lacking = [sorted(needed - set(setting)) for setting in settings if needed - set(setting)]
    except (ValueError, TypeError) as error:  # not JSON, not a list of objects
        lacking = [repr(error)]
    if lacking:
        raise ValueError(
            f"--merge_with {path}: not an MQAR summary (the list of settings `summarize` writes into "
            f"mqar_summary.json; here: {lacking[0]})."
        )
    return settings


def merge_settings(settings: list[dict], earlier: list[dict]) -> list[dict]:
    """``settings`` plus every setting of ``earlier`` they lack (the runs win where both have one), sorted."""
    ran = {setting_key(s) for s in settings}
    merged = settings + [s for s in earlier if setting_key(s) not in ran]
    return sorted(merged, key=setting_key)


def summarize_results(results_dir: Path, out: Path | None, merge_with: Path | None = None) -> list[dict]:
    settings = aggregate(collect(results_dir))
    if merge_with is not None:
        settings = merge_settings(settings, read_earlier_summary(merge_with))
    plots = {"mqar_accuracy.png": functools.partial(plot_accuracy, settings)} if settings else {}
    write_report(
        out or results_dir,
        settings,
        summarize(settings, bool(plots)),
        plots,
        results_name="mqar_summary.json",
        summary_name="mqar_summary.md",
    )
    return settings


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="train the grid through benchmarks.seeds, then summarize")
    run.add_argument("--types", nargs="+", required=True, help="attention types, e.g. full linear")
    run.add_argument("--widths", type=int, nargs="+", default=[64, 128], help="model widths (hidden_size)")
    run.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256], help="sequence lengths")
    run.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds, e.g. 0 1 2")
    run.add_argument("--causal", action="store_true", help="causal LMs (types with a causal form only)")
    run.add_argument(
        "--learning_rates",
        type=float,
        nargs="+",
        help="a sweep: every setting at each rate, the table keeps the best on validation (default: the "
        "config's rate)",
    )
    run.add_argument("--out", type=Path, required=True, help="folder of the runs and of the summary")
    seeds.add_in_process_argument(run)
    summary = commands.add_parser("summarize", help="the table and plot of the runs under --results")
    summary.add_argument("--results", type=Path, required=True, help="folder holding the runs")
    summary.add_argument("--out", type=Path, help="where the summary goes (default: --results)")
    summary.add_argument(
        "--merge_with",
        type=Path,
        help="an earlier mqar_summary.json whose settings these runs lack are kept (e.g. the reference "
        "summary, when its runs are on another machine); a setting both have comes from the runs",
    )
    argv = sys.argv[1:] if argv is None else list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.extra = argv[split + 1 :]
    if args.command == "summarize" and args.extra:
        parser.error("summarize takes no training flags after '--'")
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.command == "summarize":
        return summarize_results(args.results, args.out, args.merge_with)
    failed = run_grid(args)
    settings = summarize_results(args.out, None)
    if failed:
        print(f"Failed settings (see their seed_*/log.txt): {', '.join(failed)}", file=sys.stderr)
        raise SystemExit(1)
    return settings


if __name__ == "__main__":
    main()
