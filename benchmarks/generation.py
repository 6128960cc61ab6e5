"""Autoregressive generation: the time of one new token and the size of the cache, against the context length.

The promise of linear attention in "Transformers are RNNs" (Katharopoulos et al. 2020), RFA (Peng et al.
2021) and Performer (Choromanski et al. 2021) is decoding in constant time and memory per token: each layer
keeps a fixed-size recurrent state instead of every key and value. This benchmark measures it on a causal
``EfficientBertForCausalLM`` (4 layers, hidden 256, 4 heads of 64, intermediate 1024, vocabulary 8,000; random
weights: speed does not depend on them) for every type with a causal form, exact attention with its KV cache
(``full_sdpa``) as the baseline:

1. a prompt of n random tokens goes through the model once (the parallel causal form; ``prefill_s``), which
   leaves the cache (``cache_mib``: the bytes of every tensor it holds, exactly);
2. then one token at a time from that cache, greedy (``warmup`` untimed, ``repeats`` timed steps): the
   median seconds of one step is the per-token latency (the whole model: embeddings, every layer, the
   vocabulary projection of the new token), and ``peak_mib`` the resident memory the steps need on top of
   the model, the prompt and the cache.

Each (type, context) point runs in a fresh process (``benchmarks.harness``). The summary gives, per type, the
latency at the longest context over that at the shortest and the cache size at both: the recurrent types
(linear, performer, rfa) and the sliding window (longformer) must stay within 1.3x in latency with a cache
that does not grow; ``full``'s cache grows linearly with the context, and so does its time per token.

    python -m benchmarks.generation --threads 2       # n = 1k, 4k, 16k, 64k for every causal type
    python -m benchmarks.generation --types linear full_sdpa --lengths 1024 65536
    python -m benchmarks.generation --preset smoke    # tiny, for tests

Writes ``<out>/results.json``, ``<out>/summary.md``, ``<out>/generation.png`` (latency and cache size against
the context) and prints the table.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

from benchmarks.harness import (
    add_point_arguments,
    benchmark_parser,
    cpu_meta,
    fill_from_preset,
    launcher,
    measure,
    set_up_torch,
    sweep,
)
from benchmarks.mechanisms import BASELINE, EXACT_KERNELS, bench_configs, build_model, is_exact
from benchmarks.plugins import parse_args_with_plugins
from benchmarks.report import Panel, ok_points, plot_loglog, status_cell, write_report
from hf_efficient.markdown import markdown_table

MODEL = dict(
    num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024, vocab_size=8000
)
PRESETS = {
    "full": dict(lengths=[1024, 4096, 16384, 65536], warmup=4, repeats=32, model=MODEL),
    "smoke": dict(
        lengths=[16, 64],
        warmup=1,
        repeats=3,
        model=dict(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=128
        ),
    ),
}
POINT_SETTINGS = "threads warmup repeats model config".split()
CONSTANT_LATENCY_RATIO = 1.3  # the bound on latency(longest context) / latency(shortest)


def causal_benchmark_types() -> list[str]:
    """Every registered type with a causal form, exact attention as its sdpa kernel (the baseline) first."""
    from hf_efficient.attention import causal_attention_types

    return [BASELINE, *(t for t in causal_attention_types("text") if not is_exact(t))]


def run_point(point: argparse.Namespace) -> dict:
    """Point function: prefill ``point.length`` tokens, then time single decoding steps from the cache."""
    import time

    import torch

    import hf_efficient
    from hf_efficient import EfficientBertForCausalLM

    set_up_torch(point.threads)
    n, steps = point.length, point.warmup + point.repeats
    sizes = dict(json.loads(point.model), is_decoder=True, max_position_embeddings=n + steps)
    model, (attention_type, implementation, attention_config) = build_model(
        EfficientBertForCausalLM, point.type, point.config, **sizes
    )
    model.eval()
    prompt = torch.randint(5, model.config.vocab_size, (1, n))  # (1, n), clear of the special ids 0..4
    with torch.inference_mode():
        start = time.perf_counter()
        out = model(prompt, logits_to_keep=1)  # builds the cache: generate()'s prefill
        prefill_s = time.perf_counter() - start
    cache = out.cache
    cache_bytes = cache.nbytes
    token = out.logits[:, -1:].argmax(-1)  # (1, 1)

    def step():  # one token, greedy, as generate() decodes
        nonlocal token
        with torch.inference_mode():
            token = model(token, cache=cache).logits[:, -1:].argmax(-1)

    timing = measure(step, point.warmup, point.repeats)
    return {
        "type": point.type,
        "attention_type": attention_type,
        "attn_implementation": implementation,
        "config": attention_config,
        "length": n,
        **timing.fields(),
        "prefill_s": prefill_s,
        "cache_mib": cache_bytes / 2**20,
        "cache_mib_after_steps": cache.nbytes / 2**20,
        "tokens_seen": cache.get_seq_length(),
        "base_rss_mib": timing.base_mib,
        "parameters": sum(p.numel() for p in model.parameters()),
        "hf_efficient": hf_efficient.__version__,
    }


def growth(records: list[dict], name: str, key: str) -> tuple[dict, dict, float] | None:
    """(the point at the shortest context, at the longest, ``key`` at the longest / at the shortest) of a
    type's measured points, or None with fewer than two."""
    points = sorted(
        (r for r in records if r["type"] == name and r["status"] == "ok"), key=lambda r: r["length"]
    )
    if len(points) < 2:
        return None
    return points[0], points[-1], points[-1][key] / points[0][key]


def summarize(records: list[dict], meta: dict) -> str:
    """Per-token latency (ms) and cache MiB per type and context, then the growth of both from the shortest
    to the longest context, checked against the bounds of a constant-state decoder."""
    by_point = {(r["type"], r["length"]): r for r in records}
    lengths = sorted({r["length"] for r in records})
    types = list(dict.fromkeys(r["type"] for r in records))
    model = meta["model"]

    def latency_and_cache(r: dict) -> str:
        return f"{1e3 * r['median_s']:.2f} / {r['cache_mib']:,.2f}"

    lines = [
        f"### one new token after n tokens of context, {model['num_hidden_layers']} layers, hidden "
        f"{model['hidden_size']}, {model['num_attention_heads']} heads, vocab {model['vocab_size']}, batch "
        f"1, {meta.get('gpu') or str(meta['threads']) + ' threads'}: ms per token (median of "
        f"{meta['repeats']}) / cache MiB",
        "",
    ]
    rows = [[t, *(status_cell(by_point.get((t, n)), latency_and_cache) for n in lengths)] for t in types]
    lines += markdown_table(["type", *(f"n={n:,}" for n in lengths)], rows)
    growth_rows = []
    for name in types:
        latency, cache = growth(records, name, "median_s"), growth(records, name, "cache_mib")
        if latency is None:
            continue
        first, last, ratio = latency
        constant = not is_exact(name)  # every causal type but exact attention keeps a fixed-size state
        verdict = ""
        if constant:
            holds = ratio <= CONSTANT_LATENCY_RATIO and cache[2] == 1.0
            verdict = "yes" if holds else "NO"
        growth_rows.append(
            [
                name,
                f"x{ratio:.2f}",
                f"{first['cache_mib']:,.2f} -> {last['cache_mib']:,.2f} (x{cache[2]:.1f})",
                f"{first['prefill_s']:.2f} -> {last['prefill_s']:.2f}",
                verdict or "- (grows by design)",
            ]
        )
    if growth_rows:
        span = f"n={lengths[0]:,} -> n={lengths[-1]:,}"
        lines += ["", f"### from {span}", ""]
        header = [
            "type",
            "ms per token",
            "cache MiB",
            "prompt (prefill) s",
            f"constant state (<= x{CONSTANT_LATENCY_RATIO}, same cache)",
        ]
        lines += markdown_table(header, growth_rows)
    configs = {r["type"]: r["config"] for r in records if r["status"] == "ok" and r.get("config")}
    if configs:
        lines += ["", "attention_config: " + "; ".join(f"{t} {json.dumps(c)}" for t, c in configs.items())]
    return "\n".join(lines)


def plot_generation(records: list[dict], path: Path) -> None:
    """Two log-log panels against the context: ms per new token, cache MiB; exact attention dashed."""
    types = list(dict.fromkeys(r["type"] for r in records))
    exact = {t for t in types if is_exact(t)}
    latency = {t: [(n, 1e3 * s) for n, s in ok_points(records, "length", "median_s", type=t)] for t in types}
    cache = {t: ok_points(records, "length", "cache_mib", type=t) for t in types}
    panels = [
        Panel("time per new token", "context n (tokens)", "ms per token", latency, exact),
        Panel("generation cache", "context n (tokens)", "cache MiB", cache, exact),
    ]
    plot_loglog(path, [panels], panel_size=(6, 4.5))


def make_parser() -> argparse.ArgumentParser:
    parser = benchmark_parser(__doc__, "generation", PRESETS)
    parser.add_argument("--types", nargs="+", help="types (default: every causal type, full_sdpa first)")
    parser.add_argument("--lengths", nargs="+", type=int, help="context lengths (prompt tokens)")
    parser.add_argument("--repeats", type=int, help="timed decoding steps per point")
    parser.add_argument("--model", help="JSON of EfficientBertConfig sizes (default: the preset's)")
    parser.add_argument("--config", help="JSON attention_config applied to the (single) benchmarked type")
    add_point_arguments(parser, threads=2, memory_cap_gib=16.0, timeout=1800.0, warmup=None)
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = parse_args_with_plugins(make_parser, argv)
    fill_from_preset(args, PRESETS[args.preset])
    args.lengths = sorted(args.lengths)
    types = args.types or causal_benchmark_types()
    refused = [t for t in types if t in EXACT_KERNELS and t != BASELINE]
    if refused:
        raise SystemExit(f"--types: {refused}: exact attention decodes with one kernel here, {BASELINE}.")
    bases = [{"type": t, "length": n} for t in types for n in args.lengths]
    run = launcher(run_point, args, POINT_SETTINGS)
    records = sweep(bases, run, lambda p: p["type"], desc="generation benchmark")
    meta = {
        **cpu_meta(args),
        "model": json.loads(args.model),
        "batch": 1,
        "bench_configs": bench_configs(),
        "plugins": args.plugin,
    }
    plots = {"generation.png": functools.partial(plot_generation, records)}
    return write_report(args.out, {"meta": meta, "records": records}, summarize(records, meta), plots)


if __name__ == "__main__":
    main()
