"""Quality numbers as a mean over seeds: run any training command once per seed and aggregate its metrics.

    python -m benchmarks.seeds --seeds 0 1 2 --out runs/seeds/fmnist_full -- \\
        python scripts/finetune_image_classification.py --config configs/vision/base_fmnist.json \\
        --attention_type full --dataset_name fashion_mnist --seed {seed} --output_dir {output_dir}

The command after ``--`` is run for each seed with ``{seed}`` and ``{output_dir}`` (``<out>/seed_<seed>``)
filled in. A run's metrics are the numbers in the ``*_results.json`` files that transformers' Trainer writes
into its output folder (``all_results.json``, ``eval_results.json``, ``test_results.json``...), or in
``--results_file`` where a script writes its own. The runner writes ``<out>/seeds.json`` (every run's metrics,
and mean, standard deviation (n - 1), min and max per metric; the command and the folder it ran in) and
``<out>/seeds.md`` (a table, and the command). It is resumable: a seed whose folder already holds results is
not run again (delete the folder to redo it), and the command is stored so a resumed run with another command
refuses to mix them. A seed that was interrupted after writing a checkpoint (a ``checkpoint-*`` folder and no
results) continues from it: ``--resume_args`` (default ``--resume_from_checkpoint last``, what the package's
scripts understand) is appended to its command. A seed whose command fails is reported and left out of the
aggregate; the exit status is then 1. ``--in_process`` runs a Python command (``python script.py ...``,
``python -m module ...``) in this process instead of a fresh one, for tests and debugging: its output still
goes to the seed's log, an exception it raises propagates.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.report import write_report
from hf_efficient.in_process import is_python, run_python_command
from hf_efficient.markdown import markdown_table

COMMAND_FILE = "command.json"


def add_in_process_argument(parser: argparse.ArgumentParser) -> None:
    """``--in_process``, of this runner and of the studies that run their settings through it."""
    parser.add_argument(
        "--in_process",
        action="store_true",
        help="run each seed's Python command in this process: tests and debugging only (no isolation)",
    )


def in_process_flag(args: argparse.Namespace) -> list[str]:
    """``["--in_process"]`` for this runner's command line when a study was given it, else ``[]``."""
    return ["--in_process"] if args.in_process else []


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        usage="%(prog)s [options] -- command with {seed} and {output_dir}",
    )
    parser.add_argument("--seeds", type=int, nargs="+", required=True, help="Seeds to run, e.g. 0 1 2.")
    parser.add_argument("--out", type=Path, required=True, help="Folder of the runs and of the summary.")
    parser.add_argument("--metrics", nargs="*", default=None, help="Metrics to show (default: all numeric).")
    parser.add_argument(
        "--results_file", default=None, help="A JSON file of metrics each run writes, relative to its folder."
    )
    parser.add_argument("--label", default=None, help="Name of the setting in the table (default: --out's).")
    parser.add_argument(
        "--resume_args",
        default="--resume_from_checkpoint last",
        help="Added to the command of a seed that left a checkpoint-* folder but no results ('': none).",
    )
    add_in_process_argument(parser)
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])  # --help ends here, with or without a command
    if split == len(argv):
        parser.error("give the training command after '--' (with {seed} and {output_dir} in it)")
    args.command = argv[split + 1 :]
    if not args.command or not any("{seed}" in part for part in args.command):
        parser.error("the command after '--' must use {seed} (and should write into {output_dir})")
    return args


def run_metrics(folder: Path, results_file: str | None) -> dict[str, float] | None:
    """The numeric metrics a finished run left in ``folder``, or None if it has none (not run, or killed)."""
    files = [folder / results_file] if results_file else sorted(folder.glob("*_results.json"))
    metrics = {}
    for path in files:
        if path.is_file():
            values = json.loads(path.read_text())
            metrics.update(
                {k: v for k, v in values.items() if isinstance(v, int | float) and math.isfinite(v)}
            )
    return metrics or None


def aggregate(runs: dict[int, dict[str, float]]) -> dict[str, dict[str, float]]:
    """metric -> {mean, std (n - 1; 0 for one run), min, max, n} over the runs that report it."""
    names = sorted({name for metrics in runs.values() for name in metrics})
    summary = {}
    for name in names:
        values = [metrics[name] for metrics in runs.values() if name in metrics]
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        summary[name] = dict(
            mean=statistics.fmean(values), std=std, min=min(values), max=max(values), n=len(values)
        )
    return summary


def mean_and_spread(stats: dict[str, float], scale: float = 1.0, digits: int = 2) -> str:
    """``"88.12 ± 0.31 (3 seeds)"`` for a metric's aggregate (``scale=100`` for percentages)."""
    seeds = "1 seed" if stats["n"] == 1 else f"{stats['n']} seeds"
    return f"{scale * stats['mean']:.{digits}f} ± {scale * stats['std']:.{digits}f} ({seeds})"


def check_same_command(out: Path, command: list[str]) -> None:
    """Store the command on the first run; refuse to resume a folder made by another command."""
    path = out / COMMAND_FILE
    if path.exists():
        previous = json.loads(path.read_text())
        if previous != command:
            raise SystemExit(
                f"{out} holds runs of another command:\n  {shlex.join(previous)}\nnot\n  "
                f"{shlex.join(command)}\nUse another --out, or delete the folder to start again."
            )
    else:
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(command))


def run_seed(command: list[str], seed: int, folder: Path, resume_args: str, in_process: bool = False) -> int:
    """Run the command for one seed (continuing from its checkpoint if an earlier try left one), its output
    appended to ``<folder>/log.txt``; returns its exit status. ``in_process``: a Python command in this
    process (:func:`hf_efficient.in_process.run_python_command`)."""
    # plain replacement, not str.format: a command may hold other braces (JSON in --attention_config)
    filled = [part.replace("{seed}", str(seed)).replace("{output_dir}", str(folder)) for part in command]
    if resume_args and any(folder.glob("checkpoint-*")):
        filled += shlex.split(resume_args)
    folder.mkdir(parents=True, exist_ok=True)
    print(f"seed {seed}: {shlex.join(filled)}", flush=True)
    with open(folder / "log.txt", "a") as log:
        if not in_process:
            return subprocess.run(filled, stdout=log, stderr=subprocess.STDOUT).returncode
        if not is_python(filled[0]):
            raise SystemExit(f"--in_process runs Python commands only, not {filled[0]}")
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            return run_python_command(filled[1:])


def summarize(label: str, command: list[str], runs: dict, failed: list[int], stats: dict, metrics) -> str:
    shown = metrics or list(stats)
    header = ["setting", "metric", "mean ± std", "min", "max", "seeds"]
    rows = [
        [label, name, f"{stats[name]['mean']:.4g} ± {stats[name]['std']:.2g}", f"{stats[name]['min']:.4g}"]
        + [f"{stats[name]['max']:.4g}", str(stats[name]["n"])]
        for name in shown
        if name in stats
    ]
    lines = [f"# {label}: {len(runs)} seed(s) {sorted(runs)}", "", *markdown_table(header, rows), ""]
    if failed:
        lines.append(f"Failed (left out): seeds {failed}; see their log.txt.")
    lines += ["Command (per seed):", "", "    " + shlex.join(command)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    check_same_command(args.out, args.command)
    runs, failed = {}, []
    for seed in args.seeds:
        folder = args.out / f"seed_{seed}"
        metrics = run_metrics(folder, args.results_file)
        if metrics is None:  # not run yet, or interrupted before it wrote results: (re)run it
            status = run_seed(args.command, seed, folder, args.resume_args, args.in_process)
            metrics = run_metrics(folder, args.results_file) if status == 0 else None
        else:
            print(f"seed {seed}: results found in {folder}, not run again", flush=True)
        if metrics is None:
            failed.append(seed)
        else:
            runs[seed] = metrics
    stats = aggregate(runs)
    label = args.label or args.out.name
    # cwd: where the commands ran, so that a reader of seeds.json can resolve their relative paths
    results = {"label": label, "command": args.command, "cwd": str(Path.cwd())}
    results |= {"runs": runs, "failed": failed, "aggregate": stats}
    summary = summarize(label, args.command, runs, failed, stats, args.metrics)
    write_report(args.out, results, summary, results_name="seeds.json", summary_name="seeds.md")
    if failed:
        raise SystemExit(1)
    return results


if __name__ == "__main__":
    main()
