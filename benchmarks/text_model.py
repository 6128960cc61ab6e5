"""A whole text model, one training step's forward and backward: tokens per second and peak memory.

The model is a 4-layer, hidden-256, 4-head (head 64), intermediate-1024 ``EfficientBertForMaskedLM`` with
BERT's vocabulary (30,522) and ``max_position_embeddings`` set to the sequence length, in training mode
(hidden dropout 0.1, attention-probability dropout 0: dropout inside attention would push exact sdpa off
its fused kernel). One step is ``model(input_ids, attention_mask, labels).loss.backward()`` on a batch of
random token ids with 15% of positions masked for the MLM loss (the model's default head: only the masked
positions reach the vocabulary, through a chunked loss); no optimizer step (``benchmarks.model_step``
times the whole step, optimizer included, with model FLOPs utilisation and a per-component breakdown).
Exact attention runs with two kernels, ``full_eager`` (BERT's) and ``full_sdpa``; speed-ups in the
summary are against ``full_sdpa`` at the same length, measured in the same run. The types are the
registry's text types (``benchmarks.mechanisms``), each with its core's ``benchmark_config``; the long
lengths (16,384 in the full preset) run the types whose FLOP model at that length is below exact
attention's, and ``full_sdpa`` as their baseline.

Each (type, length) point runs in a fresh Python process (``benchmarks.harness``): an address-space cap makes
an over-large point fail fast, and peak memory is the process's peak resident set size during the steps
(VmHWM, reset after the model and inputs are built) minus its size at that moment, i.e. activations,
gradients and workspace on top of the parameters.

    python -m benchmarks.text_model --threads 2                  # n = 512, 2048, 8192 for every text type,
                                                                 # and 16384 for the long-input types
    python -m benchmarks.text_model --types longformer full_sdpa --lengths 16384
    python -m benchmarks.text_model --preset smoke               # tiny, for tests

Writes ``<out>/results.json``, ``<out>/summary.md``, ``<out>/throughput.png``, ``<out>/time.png`` and
``<out>/memory.png``, and prints the table.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

from benchmarks import flops
from benchmarks.attention import plot_metric
from benchmarks.harness import (
    ProcessOptions,
    add_point_arguments,
    launch,
    machine_meta,
    measure,
    set_up_torch,
    sweep,
)
from benchmarks.mechanisms import (
    BASELINE,
    EXACT,
    bench_configs,
    benchmark_config,
    benchmark_types,
    is_exact,
    resolve,
)
from benchmarks.plugins import parse_args_with_plugins
from benchmarks.report import (
    Panel,
    markdown_table,
    ok_points,
    plot_loglog,
    status_cell,
    time_and_memory_plots,
    write_report,
)

MODEL = dict(
    num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024, vocab_size=30522
)
PRESETS = {
    "full": dict(lengths=[512, 2048, 8192], long_lengths=[16384], repeats=3, model=MODEL),
    "smoke": dict(
        lengths=[32, 64],
        long_lengths=[],
        repeats=1,
        model=dict(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=512
        ),
    ),
}
MASK_PROBABILITY = 0.15
MASK_TOKEN_ID = 103  # BERT's [MASK]; smaller vocabularies use id 1
POINT_SETTINGS = "batch threads warmup repeats hidden_dropout model config".split()


def runs_long(name: str, n: int, model: dict) -> bool:
    """Whether a type runs at the long length n: the baseline does, and every type whose FLOP model (at its
    benchmark settings, the model's head size) counts fewer FLOPs than exact attention at n."""
    if name == BASELINE:
        return True
    head_dim = model["hidden_size"] // model["num_attention_heads"]
    cost = flops.forward_flops(name, n, heads=1, head_dim=head_dim, config=benchmark_config(name))
    return cost is not None and cost < flops.forward_flops(EXACT, n, heads=1, head_dim=head_dim)


def mlm_model_and_batch(point: argparse.Namespace, **config_fields):
    """The point's ``EfficientBertForMaskedLM`` in training mode and one MLM batch.

    ``point`` has ``type``, ``config`` (JSON or None), ``model`` (JSON sizes), ``batch``, ``length`` and
    ``hidden_dropout``; ``config_fields`` go to the config as well (``sparse_prediction``).

    Returns:
        (model, batch: dict of input_ids / attention_mask / labels (b, n), (attention_type,
        attn_implementation, attention_config)).
    """
    import torch

    from hf_efficient import EfficientBertConfig, EfficientBertForMaskedLM

    b, n = point.batch, point.length
    attention_type, implementation, attention_config = resolve(point.type, point.config)
    config = EfficientBertConfig(
        **json.loads(point.model),
        max_position_embeddings=n,
        attention_type=attention_type,
        attention_config=attention_config or None,
        hidden_dropout_prob=point.hidden_dropout,
        attention_probs_dropout_prob=0.0,
        **config_fields,
    )
    model = EfficientBertForMaskedLM._from_config(config, attn_implementation=implementation).train()
    vocab = config.vocab_size
    input_ids = torch.randint(5, vocab, (b, n))  # (b, n), clear of the special ids 0..4
    masked = torch.rand(b, n) < MASK_PROBABILITY
    labels = torch.where(masked, input_ids, -100)  # (b, n), the MLM collator's convention
    input_ids = input_ids.masked_fill(masked, MASK_TOKEN_ID if vocab > MASK_TOKEN_ID else 1)
    attention_mask = torch.ones(b, n, dtype=torch.long)  # what a tokenizer hands over
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    return model, batch, (attention_type, implementation, attention_config)


def run_point(point: argparse.Namespace) -> dict:
    """Point function: one (type, length) training step of the whole model, in this process."""
    import hf_efficient

    set_up_torch(point.threads)
    b, n = point.batch, point.length
    model, batch, (attention_type, implementation, attention_config) = mlm_model_and_batch(point)
    losses = []

    def step():
        loss = model(**batch).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    timing = measure(step, point.warmup, point.repeats)
    return {
        "type": point.type,
        "attention_type": attention_type,
        "attn_implementation": implementation,
        "config": attention_config,
        "length": n,
        "mode": "fwd_bwd",
        **timing.fields(),
        "tokens_per_s": b * n / timing.median_s,
        "base_rss_mib": timing.base_mib,
        "parameters": sum(p.numel() for p in model.parameters()),
        "loss": float(losses[-1]),
        "hf_efficient": hf_efficient.__version__,
    }


def summarize(records: list[dict], meta: dict) -> str:
    """Markdown table: tokens/s (speed-up vs full_sdpa) and peak MiB per type and length."""
    by_point = {(r["type"], r["length"]): r for r in records}
    lengths = sorted({r["length"] for r in records})
    types = list(dict.fromkeys(r["type"] for r in records))

    def throughput_and_memory(r: dict) -> str:
        ref = by_point.get((BASELINE, r["length"]))
        speed = f" (x{ref['median_s'] / r['median_s']:.2f})" if ref and ref["status"] == "ok" else ""
        return f"{r['tokens_per_s']:,.0f}{speed} / {r['peak_mib']:,.0f}"

    model = meta["model"]
    lines = [
        f"### forward + backward (MLM loss), {model['num_hidden_layers']} layers, hidden "
        f"{model['hidden_size']}, {model['num_attention_heads']} heads, vocab {model['vocab_size']}, batch "
        f"{meta['batch']}, {meta['threads']} threads: tokens/s (x speed-up vs {BASELINE}) / peak MiB",
        "",
    ]
    rows = [[t, *(status_cell(by_point.get((t, n)), throughput_and_memory) for n in lengths)] for t in types]
    lines += markdown_table(["type", *(f"n={n}" for n in lengths)], rows)
    configs = {r["type"]: r["config"] for r in records if r["status"] == "ok" and r.get("config")}
    if configs:
        lines += ["", "attention_config: " + "; ".join(f"{t} {json.dumps(c)}" for t, c in configs.items())]
    return "\n".join(lines)


def plot_throughput(records: list[dict], path: Path) -> None:
    """Tokens per second against n for every type, log-log; exact attention dashed."""
    types = list(dict.fromkeys(r["type"] for r in records))
    lines = {t: ok_points(records, "length", "tokens_per_s", type=t) for t in types}
    exact = {t for t in types if is_exact(t)}
    panel = Panel("text model, forward + backward", "sequence length n", "tokens / second", lines, exact)
    plot_loglog(path, [[panel]], panel_size=(7, 5))


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the model and batch a point builds (:func:`mlm_model_and_batch`), and --repeats."""
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--model", help="JSON of EfficientBertConfig sizes (default: the preset's)")
    parser.add_argument("--hidden_dropout", type=float, default=0.1)
    parser.add_argument("--config", help="JSON attention_config applied to the (single) benchmarked type")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full")
    parser.add_argument("--types", nargs="+", help="types (default: every text type + full_eager/sdpa)")
    parser.add_argument("--lengths", nargs="+", type=int, help="lengths for every type")
    parser.add_argument(
        "--long_lengths",
        nargs="+",
        type=int,
        help="extra lengths for --long_types only (default: the preset's, none when --lengths is given)",
    )
    parser.add_argument(
        "--long_types",
        nargs="+",
        help="types run at --long_lengths (default: full_sdpa and every type with fewer FLOPs than exact)",
    )
    add_model_arguments(parser)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/text_model"))
    add_point_arguments(parser, threads=2, memory_cap_gib=16.0, timeout=900.0)
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = parse_args_with_plugins(make_parser, argv)
    preset = PRESETS[args.preset]
    if args.long_lengths is None:
        args.long_lengths = [] if args.lengths else preset["long_lengths"]
    args.lengths = args.lengths or preset["lengths"]
    args.repeats = args.repeats or preset["repeats"]
    args.model = args.model or json.dumps(preset["model"])
    model = json.loads(args.model)

    types = args.types or benchmark_types("text")
    points = [(t, n) for t in types for n in sorted(args.lengths)]
    for n in sorted(args.long_lengths):
        long_types = args.long_types or [t for t in types if runs_long(t, n, model)]
        points += [(t, n) for t in types if t in long_types]
    options = ProcessOptions.from_args(args)
    settings = {name: getattr(args, name) for name in POINT_SETTINGS}

    def run(base: dict) -> dict:
        return launch(run_point, {**settings, **base}, base, options)

    bases = [{"type": t, "length": n, "mode": "fwd_bwd"} for t, n in points]
    records = sweep(bases, run, lambda p: p["type"], desc="text model benchmark")
    meta = {
        **machine_meta(args.threads),
        "batch": args.batch,
        "model": model,
        "hidden_dropout": args.hidden_dropout,
        "attention_probs_dropout": 0.0,
        "mask_probability": MASK_PROBABILITY,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "dtype": "float32",
        "device": "cpu",
        "bench_configs": bench_configs(),
        "plugins": args.plugin,
    }
    results = {"meta": meta, "records": records}
    plots = {
        "throughput.png": functools.partial(plot_throughput, records),
        **time_and_memory_plots(functools.partial(plot_metric, records)),  # as the attention benchmark's
    }
    write_report(args.out, results, summarize(records, meta), plots)
    return results


if __name__ == "__main__":
    main()
