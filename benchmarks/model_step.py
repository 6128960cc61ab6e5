"""A whole training step (forward, backward, AdamW step): tokens/s, model FLOPs utilisation, peak memory and
where the time goes, for the text, vision and graph encoders (``--encoder``).

The text model is a 4-layer, hidden-256, 4-head, intermediate-1024 ``EfficientBertForMaskedLM`` with
BERT's 30,522-token vocabulary (``max_position_embeddings`` = n, hidden dropout 0.1) on one batch of random
tokens, 15% of them masked for the MLM loss; the vision and graph encoders take the same sizes for ViT
image classification on n patches and node classification on a graph of n nodes
(``benchmarks.step_models``, where each one's batch and FLOPs are defined). One step is
``model(**batch).loss.backward(); optimizer.step(); optimizer.zero_grad()`` with ``torch.optim.AdamW``.

Each (type, length, variant) point runs in a fresh process (``benchmarks.harness``). A *variant* changes how
the same model trains:

==================  ====================================================================================
default             the model's defaults (text: ``sparse_prediction=None``, the masked positions only,
                    through the chunked loss, no vocabulary-sized tensor)
sparse_logits       text: ``sparse_prediction=True``: the (M, V) logits of the masked positions are built
dense_head          text: ``sparse_prediction=False``: BERT's head, (b, n, V) logits
checkpointing       ``model.gradient_checkpointing_enable()``: each layer recomputed in backward
core_checkpointing  ``model.attention_checkpointing_enable()``: each attention core recomputed in backward
compile             ``torch.compile(model)`` (inductor; what Trainer's ``torch_compile=True`` does)
keep_allocator      the default model; glibc keeps every freed block in its heap for reuse
                    (``benchmarks.harness.keep_freed_memory``): no page faults, a higher peak
lean_allocator      the default model; glibc maps every block of 16 MiB and more on its own and hands it
                    back when freed (``benchmarks.harness.map_large_blocks``): a lower peak, page faults
==================  ====================================================================================

Model FLOPs utilisation (MFU) = the step's model FLOPs (``benchmarks.step_models``; recomputation not
counted) / its median time / the machine's sgemm peak (S x S, S = --sgemm_size, measured before and after
the points, the higher). Peak memory is the process's peak resident size during the steps minus its size
before them (parameters and inputs). Then, except for ``compile`` (one compiled graph), one more step runs
under ``torch.profiler`` for each component's share (``benchmarks.breakdown``) and one counting its aten ops
for the roofline (``benchmarks.roofline``, with the copy bandwidth of ``--bandwidth_gib``): the measured
time's fraction of the roofline time, its memory-bound share and the MFU the step would reach there.

    python -m benchmarks.model_step --types full_sdpa linear --lengths 512 8192
    python -m benchmarks.model_step --types linear --lengths 16384 --variants default dense_head
    python -m benchmarks.model_step --encoder vision --types full_sdpa swin_window --lengths 1024 4096
    python -m benchmarks.model_step --encoder graph --types graph_sparse gat --lengths 10000 50000
    python -m benchmarks.model_step --preset smoke               # tiny, for tests

Writes ``<out>/results.json``, ``<out>/summary.md``, ``<out>/throughput.png``, ``<out>/mfu.png``,
``<out>/memory.png``, ``<out>/breakdown.png`` (and ``<out>/roofline.png`` when the roofline was counted), and
prints the tables.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

from benchmarks import breakdown, flops, roofline, step_models
from benchmarks.harness import (
    ProcessOptions,
    add_point_arguments,
    benchmark_parser,
    cpu_meta,
    fill_from_preset,
    launcher,
    measure,
    measure_bandwidth,
    measure_sgemm_peak,
    set_up_torch,
    sweep,
    use_allocator,
)
from benchmarks.mechanisms import BASELINE, bench_configs, is_exact
from benchmarks.plugins import parse_args_with_plugins
from benchmarks.report import length_panel, plot_loglog, pyplot, status_cell, write_report
from hf_efficient.markdown import markdown_table

SMOKE_MODEL = dict(
    num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=512
)
# Per preset: each encoder's (types, lengths); lengths count tokens, patches (a square) or nodes.
PRESETS = {
    "full": dict(
        points={
            "text": (["full_sdpa", "linear", "performer", "longformer", "nystromformer"], [512, 8192, 16384]),
            "vision": (
                ["full_sdpa", "linear", "performer", "swin_window", "nystromformer"],
                [1024, 4096, 16384],
            ),
            "graph": (["graph_sparse", "gat", "full_sdpa"], [1000, 10000]),
        },
        repeats=3,
        model=step_models.MODEL,
        sgemm_size=4096,
        bandwidth_gib=1.0,
    ),
    "smoke": dict(
        points={
            "text": (["full_sdpa", "linear"], [64]),
            "vision": (["full_sdpa", "linear"], [64]),
            "graph": (["graph_sparse", "full_sdpa"], [64]),
        },
        repeats=1,
        model=SMOKE_MODEL,
        sgemm_size=256,
        bandwidth_gib=1 / 32,
    ),
}
VARIANTS = {
    "default": {},
    "sparse_logits": {"sparse_prediction": True},
    "dense_head": {"sparse_prediction": False},
    "checkpointing": {"gradient_checkpointing": True},
    "core_checkpointing": {"attention_checkpointing": True},
    "compile": {"compile": True},
    "keep_allocator": {"allocator": "keep"},
    "lean_allocator": {"allocator": "lean"},
}
# Per encoder: (the step's task, what n counts)
STEP_NAMES = {
    "text": ("MLM", "tokens"),
    "vision": ("image classification", "patches"),
    "graph": ("node classification", "nodes"),
}
POINT_SETTINGS = "encoder batch threads warmup repeats hidden_dropout model config count_ops".split()


def run_point(point: argparse.Namespace) -> dict:
    """Point function: one (type, length, variant) training step, timed, then profiled once."""
    import torch

    import hf_efficient

    settings = dict(VARIANTS[point.variant])
    point.allocator = settings.pop("allocator", "glibc")
    use_allocator(point)  # before the model's tensors
    set_up_torch(point.threads)
    compiled, checkpointing = settings.pop("compile", False), settings.pop("gradient_checkpointing", False)
    core_checkpointing = settings.pop("attention_checkpointing", False)
    model, batch, (attention_type, implementation, attention_config) = step_models.model_and_batch(
        point, **settings
    )
    if checkpointing:
        model.gradient_checkpointing_enable()
    if core_checkpointing:
        model.attention_checkpointing_enable()
    step_flops = step_models.step_flops(model, batch, point, attention_config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    forward = torch.compile(model) if compiled else model
    losses = []

    def step():
        loss = forward(**batch).loss
        loss.backward()
        with breakdown.scope(breakdown.OPTIMIZER):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    timing = measure(step, point.warmup, point.repeats)
    # A compiled model runs its modules inside one graph: no per-module scopes to read, no aten ops to count.
    profiled, profiled_wall_ms = (None, None) if compiled else breakdown.profile_step(model, step)
    counts = roofline.count_ops(step) if point.count_ops and not compiled else {"op_counts": None}
    b, n = point.batch, point.length  # n tokens, patches or nodes
    known = [v for v in step_flops.values() if v is not None]
    return {
        "encoder": point.encoder,
        "type": point.type,
        "attention_type": attention_type,
        "attn_implementation": implementation,
        "config": attention_config,
        "length": n,
        "variant": point.variant,
        **timing.fields(),
        "tokens_per_s": b * n / timing.median_s,
        "model_flops": sum(known) if None not in step_flops.values() else None,
        "flops_by_component": step_flops,
        "breakdown_ms": profiled,
        "profiled_wall_ms": profiled_wall_ms,
        **counts,
        "base_rss_mib": timing.base_mib,
        "parameters": sum(p.numel() for p in model.parameters()),
        "loss": float(losses[-1]),
        "hf_efficient": hf_efficient.__version__,
    }


def add_utilisation(record: dict, sgemm: dict | None, bandwidth: dict | None = None) -> dict:
    """Achieved GFLOP/s of the step and its fraction of the sgemm peak (MFU); the roofline of its counted
    ops, the measured time's fraction of it and the MFU at it; null when unknown."""
    record = roofline.add_roofline(record, sgemm, bandwidth)
    fields = dict.fromkeys(["gflops", "mfu", "roofline_mfu"])
    if record["status"] == "ok" and record["model_flops"]:
        fields["gflops"] = record["model_flops"] / record["median_s"] / 1e9
        fields["mfu"] = fields["gflops"] / sgemm["gflops"] if sgemm else None
        if fields["mfu"] is not None and record["roofline"]:
            fields["roofline_mfu"] = fields["mfu"] * record["median_s"] / record["roofline"]["seconds"]
    return {**record, **fields}


def summarize(records: list[dict], meta: dict) -> str:
    """Markdown: tokens/s (x vs full_sdpa, same variant and length) / MFU / peak MiB per point, then each
    point's time per component."""
    by_point = {(r["type"], r["length"], r["variant"]): r for r in records}
    lengths = sorted({r["length"] for r in records})
    series = list(dict.fromkeys((r["type"], r["variant"]) for r in records))

    def cell(r: dict) -> str:
        ref = by_point.get((BASELINE, r["length"], r["variant"]))
        speed = f" (x{ref['median_s'] / r['median_s']:.2f})" if ref and ref["status"] == "ok" else ""
        mfu = "?" if r["mfu"] is None else f"{100 * r['mfu']:.0f}%"
        return f"{r['tokens_per_s']:,.0f}{speed} / {mfu} / {r['peak_mib']:,.0f}"

    model, sgemm, encoder = meta["model"], meta["sgemm"], meta["encoder"]
    peak = f"sgemm peak {sgemm['gflops']:.1f} GFLOP/s" if sgemm else "sgemm peak not measured"
    task, unit = STEP_NAMES[encoder]
    vocab = f", vocab {model['vocab_size']}" if encoder == "text" else ""
    lines = [
        f"### {encoder} training step ({task} forward + backward + AdamW), "
        f"{model['num_hidden_layers']} layers, hidden {model['hidden_size']}, "
        f"{model['num_attention_heads']} heads{vocab}, batch {meta['batch']}, "
        f"{meta['threads']} threads, {peak}: {unit}/s (x vs {BASELINE}) / MFU / peak MiB; n = {unit}",
        "",
    ]
    rows = [[t, v, *(status_cell(by_point.get((t, n, v)), cell) for n in lengths)] for t, v in series]
    lines += markdown_table(["type", "variant", *(f"n={n}" for n in lengths)], rows)
    lines += [
        "",
        "### share of the profiled step per component (profiled step ms); x vs "
        f"{BASELINE} at most: with the attention core at the sgemm peak, the rest as measured",
        "",
    ]
    header = ["type", "variant", "n", *breakdown.COMPONENTS, "ms", "x at most"]
    rows = []
    for r in records:
        if r["status"] == "ok" and r["breakdown_ms"]:
            total = sum(r["breakdown_ms"].values())
            shares = [f"{100 * r['breakdown_ms'][c] / total:.0f}%" for c in breakdown.COMPONENTS]
            bound = speedup_bound(r, by_point.get((BASELINE, r["length"], r["variant"])), sgemm)
            cells = [*shares, f"{total:,.0f}", "?" if bound is None else f"x{bound:.2f}"]
            rows.append([r["type"], r["variant"], str(r["length"]), *cells])
    lines += markdown_table(header, rows)
    lines += roofline_table(records, meta)
    return "\n".join(lines)


def speedup_bound(record: dict, baseline: dict | None, sgemm: dict | None) -> float | None:
    """The speed-up over ``baseline`` (the exact type's point, same length and variant) that ``record``'s step
    would have if its attention core's matrix FLOPs ran at the sgemm peak and everything else took the time
    it took: baseline time / (measured time x the non-core share of the profiled step + core FLOPs / peak).
    No kernel work on the core alone can go past it; None where a number is missing."""
    core_flops = record["flops_by_component"].get(breakdown.CORE)
    ok = baseline and baseline["status"] == "ok" and sgemm and record["breakdown_ms"] and core_flops
    if not ok:
        return None
    shares = record["breakdown_ms"]
    rest_s = record["median_s"] * (1.0 - shares[breakdown.CORE] / sum(shares.values()))
    return baseline["median_s"] / (rest_s + core_flops / (sgemm["gflops"] * 1e9))


def roofline_table(records: list[dict], meta: dict) -> list[str]:
    """Per point: the measured time's fraction of the step's roofline time, the memory-bound share of that
    time, the MFU at the roofline, and the ops that take most of it."""
    counted = [r for r in records if r["status"] == "ok" and r.get("roofline")]
    if not counted:
        return []
    sgemm, bandwidth = meta["sgemm"], meta["bandwidth"]
    lines = [
        "",
        f"### roofline of the step's aten ops (sgemm {sgemm['gflops']:.1f} GFLOP/s, copy "
        f"{bandwidth['copy_gbps']:.1f} GB/s, same run): roofline time / measured, share bound by memory, "
        "MFU at the roofline, largest ops (share of roofline time)",
        "",
    ]
    rows = []
    for r in counted:
        limits = r["roofline"]
        at_roofline = "?" if r["roofline_mfu"] is None else f"{100 * r['roofline_mfu']:.0f}%"
        largest = roofline.largest_ops(limits, 4)
        rows.append(
            [
                r["type"],
                r["variant"],
                str(r["length"]),
                f"{100 * r['roofline_fraction']:.0f}%",
                f"{100 * limits['memory_bound_share']:.0f}%",
                at_roofline,
                largest,
            ]
        )
    header = ["type", "variant", "n", "roofline / measured", "memory-bound", "MFU at roofline", "largest ops"]
    return lines + markdown_table(header, rows)


def plot_series(records: list[dict], key: str, label: str, path: Path) -> None:
    """``key`` against n, a line per (type, variant), log-log; exact attention dashed."""
    series = {f"{r['type']} {r['variant']}": {"type": r["type"], "variant": r["variant"]} for r in records}
    dashed = {name for name, match in series.items() if is_exact(match["type"])}
    panel = length_panel(records, key, f"training step: {label}", label, series, dashed)
    plot_loglog(path, [[panel]], panel_size=(7, 5))


def plot_breakdown(records: list[dict], path: Path) -> None:
    """Stacked bars: each point's profiled step time per component."""
    plt = pyplot()
    ok = [r for r in records if r["status"] == "ok" and r["breakdown_ms"]]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(ok) + 2), 5))
    labels = [f"{r['type']}\n{r['variant']}\nn={r['length']}" for r in ok]
    bottom = [0.0] * len(ok)
    for component in breakdown.COMPONENTS:
        heights = [r["breakdown_ms"][component] for r in ok]
        ax.bar(labels, heights, bottom=bottom, label=component)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set(ylabel="profiled step (ms)", title="where a training step's time goes")
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the model and batch a point builds (``benchmarks.step_models``), and --repeats."""
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--model", help="JSON of EfficientBertConfig sizes (default: the preset's)")
    parser.add_argument("--hidden_dropout", type=float, default=0.1)
    parser.add_argument("--config", help="JSON attention_config applied to the (single) benchmarked type")


def make_parser() -> argparse.ArgumentParser:
    parser = benchmark_parser(__doc__, "model_step", PRESETS)
    parser.add_argument("--encoder", choices=step_models.ENCODERS, default="text")
    parser.add_argument("--types", nargs="+", help="benchmark type names (default: the preset's)")
    parser.add_argument(
        "--lengths", nargs="+", type=int, help="tokens, patches (a square) or nodes (default: the preset's)"
    )
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=["default"])
    add_model_arguments(parser)
    parser.add_argument("--sgemm_size", type=int, help="S of the S x S sgemm peak (0: not measured)")
    parser.add_argument(
        "--bandwidth_gib", type=float, help="GiB copied to measure the memory bandwidth (0: no roofline)"
    )
    add_point_arguments(parser, threads=2, memory_cap_gib=16.0, timeout=900.0)
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = parse_args_with_plugins(make_parser, argv)
    head_variants = [v for v in args.variants if set(VARIANTS[v]) & set(step_models.TEXT_ONLY_FIELDS)]
    if args.encoder != "text" and head_variants:
        make_parser().error(
            f"--variants {' '.join(head_variants)} set the text model's MLM head; the {args.encoder} encoder "
            "has none: use default, checkpointing, core_checkpointing or compile with --encoder "
            f"{args.encoder}, or --encoder text"
        )
    preset = PRESETS[args.preset]
    preset_types, preset_lengths = preset["points"][args.encoder]
    types, lengths = args.types or preset_types, sorted(args.lengths or preset_lengths)
    fill_from_preset(args, preset)
    options = ProcessOptions.from_args(args)
    sgemm_before = measure_sgemm_peak(args.sgemm_size, options)
    bandwidth = measure_bandwidth(args.bandwidth_gib, options)
    args.count_ops = bandwidth is not None and sgemm_before is not None
    # A type's variants run one after the other, so a machine whose speed drifts during the run (the sgemm
    # peak is measured before and after for that reason) moves them together.
    bases = [{"type": t, "length": n, "variant": v} for t in types for v in args.variants for n in lengths]
    run = launcher(run_point, args, POINT_SETTINGS)
    records = sweep(bases, run, lambda p: (p["type"], p["variant"]), desc="model step benchmark")
    # The peak is measured before and after the points and the higher one kept: a machine busier at one of
    # the two moments would otherwise under-state the peak and over-state every MFU.
    sgemm_after = measure_sgemm_peak(args.sgemm_size, options)
    measured = [s for s in (sgemm_before, sgemm_after) if s is not None]
    sgemm = max(measured, key=lambda s: s["gflops"]) if measured else None
    if sgemm is not None:
        sgemm = {**sgemm, "gflops_before_after": [s["gflops"] for s in measured]}
    records = [add_utilisation(record, sgemm, bandwidth) for record in records]
    meta = {
        **cpu_meta(args),
        "encoder": args.encoder,
        "sgemm": sgemm,
        "bandwidth": bandwidth,
        "batch": args.batch,
        "model": json.loads(args.model),
        "hidden_dropout": args.hidden_dropout,
        "mask_probability": step_models.MASK_PROBABILITY if args.encoder == "text" else None,
        "optimizer": "AdamW",
        "flops_convention": flops.CONVENTION,
        "bench_configs": bench_configs(),
        "plugins": args.plugin,
    }
    plots = {
        "throughput.png": functools.partial(
            plot_series, records, "tokens_per_s", f"{STEP_NAMES[args.encoder][1]} / second"
        ),
        "mfu.png": functools.partial(plot_series, records, "mfu", "model FLOPs utilisation"),
        "memory.png": functools.partial(plot_series, records, "peak_mib", "peak MiB"),
        "breakdown.png": functools.partial(plot_breakdown, records),
    }
    counted = [r for r in records if r["status"] == "ok" and r.get("roofline")]
    if counted:
        points = [
            (f"{r['type']} {r['variant']} n={r['length']}", r["roofline"], r["median_s"]) for r in counted
        ]
        title = f"{args.encoder} training step: how close to the machine"
        plots["roofline.png"] = functools.partial(roofline.plot_fractions, points, title)
    return write_report(args.out, {"meta": meta, "records": records}, summarize(records, meta), plots)


if __name__ == "__main__":
    main()
