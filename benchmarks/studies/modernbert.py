"""ModernBERT at its base size, ours against transformers' own: one training step and one forward of the
masked LM on the CPU, tokens/s and peak memory, with the same head setting on both sides.

The model is ModernBERT-base's architecture (transformers' ``ModernBertConfig`` defaults: 22 layers, hidden
768, 12 heads, intermediate 1152, vocabulary 50,368, a global layer every third, windows of 128 tokens) with
the masked LM head, on one batch of random tokens, ``MASK_PROBABILITY`` of them masked. Every point builds
transformers' ``ModernBertForMaskedLM`` from the same seed; ours load its weights, so every side computes
from the same parameters and inputs (the losses are recorded: the checkpoint's pattern gives transformers'
loss). The sides (``--models``):

================  ==========================================================================================
transformers      transformers' ``ModernBertForMaskedLM`` with ``attn_implementation="sdpa"`` (its path
                  without FlashAttention 2: every window layer a dense n x n score matrix with a mask)
ours              ``EfficientModernBertForMaskedLM`` with the checkpoint's pattern: the window layers on the
                  Longformer kernel, the global layers exact (sdpa); the same outputs
ours_bigbird      the global layers on BigBird (64-token blocks), the window layers as above
ours_linear       the global layers on linear attention, the window layers as above
================  ==========================================================================================

Each side runs with ``sparse_prediction`` on (the masked positions' logits only, (M, V)) and off (every
position's, (n, V), which then dominate memory on both sides), in two modes: ``train`` (forward with the
labels, backward, ``torch.optim.AdamW`` step) and ``forward`` (``model.eval()`` under ``torch.no_grad()``,
with the labels: the loss and the same logits). Each point runs in a fresh process
(``benchmarks.harness``): tokens/s of the median call, peak resident memory above the parameters and inputs.

    python -m benchmarks.studies.modernbert                  # base size, 2k / 4k / 8k tokens, every side
    python -m benchmarks.studies.modernbert --lengths 8192 --models transformers ours --modes train
    python -m benchmarks.studies.modernbert --preset smoke   # tiny, for tests

Writes ``<out>/results.json``, ``<out>/summary.md`` and ``<out>/modernbert.png`` (tokens/s and peak memory
against n, per mode), and prints the tables.
"""

from __future__ import annotations

import argparse
import gc
import json

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
from benchmarks.report import length_panel, plot_loglog, status_cell, write_report
from hf_efficient.markdown import markdown_table

MASK_PROBABILITY = 0.15
BASELINE = "transformers"
# side -> (attention_type of the global layers, its attention_config); None: transformers' model
SIDES = {
    "transformers": None,
    "ours": ("full", {}),
    "ours_bigbird": ("bigbird", {"block_size": 64}),
    "ours_linear": ("linear", {}),
}
MODES = ("train", "forward")
SMOKE_MODEL = dict(
    num_hidden_layers=3, hidden_size=32, num_attention_heads=4, intermediate_size=48, vocab_size=512,
    local_attention=16, pad_token_id=0, bos_token_id=1, cls_token_id=1, eos_token_id=2, sep_token_id=2,
)  # fmt: skip
PRESETS = {
    "full": dict(models=list(SIDES), lengths=[2048, 4096, 8192], repeats=2, model={}),  # ModernBERT-base
    "smoke": dict(models=list(SIDES), lengths=[64], repeats=1, model=SMOKE_MODEL),
}
POINT_SETTINGS = "batch threads warmup repeats model".split()


def build(side: str, sizes: dict, sparse: bool):
    """The side's masked LM (``sizes`` over ModernBertConfig's defaults), from transformers' model drawn with
    seed 0: that model itself, or ours with its weights."""
    import torch
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    from hf_efficient import EfficientModernBertConfig, EfficientModernBertForMaskedLM

    torch.manual_seed(0)
    config = ModernBertConfig(**sizes, sparse_prediction=sparse)
    upstream = ModernBertForMaskedLM._from_config(config, attn_implementation="sdpa")
    if SIDES[side] is None:
        return upstream
    attention_type, attention_config = SIDES[side]
    ours_config = EfficientModernBertConfig(
        **sizes, sparse_prediction=sparse, attention_type=attention_type, attention_config=attention_config
    )
    ours = EfficientModernBertForMaskedLM(ours_config)
    ours.load_state_dict(upstream.state_dict())
    del upstream
    gc.collect()
    return ours


def run_point(point: argparse.Namespace) -> dict:
    """Point function: one side, mode, head setting and length, timed."""
    import torch

    set_up_torch(point.threads)
    model = build(point.side, json.loads(point.model), point.sparse)
    b, n, vocab = point.batch, point.length, model.config.vocab_size
    g = torch.Generator().manual_seed(1)  # the same batch on every side, whatever building it drew
    ids = torch.randint(5, vocab, (b, n), generator=g)
    masked = torch.rand(b, n, generator=g) < MASK_PROBABILITY
    masked[:, 0] = True  # a target in every row
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones(b, n, dtype=torch.long),
        "labels": ids.where(masked, -100),
    }
    losses = []
    if point.mode == "train":
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def call():
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
    else:
        model.eval()

        def call():
            with torch.no_grad():
                losses.append(float(model(**batch).loss))

    timing = measure(call, point.warmup, point.repeats)
    cores = [core.attention_type for core in getattr(model, "attention_cores", list)()]
    return {
        "side": point.side,
        "mode": point.mode,
        "sparse": point.sparse,
        "length": n,
        **timing.fields(),
        "tokens_per_s": b * n / timing.median_s,
        "first_loss": losses[0],  # before any optimizer step: the same on every side of the checkpoint
        "attention_types": sorted(set(cores)) or ["transformers sdpa"],
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def series_name(record: dict) -> str:
    return f"{record['side']} sparse={record['sparse']}"


def summarize(records: list[dict], meta: dict) -> str:
    """Markdown: per mode, tokens/s (x vs transformers, same head setting and length) / peak MiB; the first
    losses, by which the sides computed the same model."""
    by_point = {(r["side"], r["mode"], r["sparse"], r["length"]): r for r in records}
    lengths = sorted({r["length"] for r in records})
    size = meta["model"] or "ModernBERT-base (ModernBertConfig defaults)"
    lines = [f"ModernBERT masked LM, {size}, batch {meta['batch']}, {meta['threads']} threads", ""]

    def cell(r: dict) -> str:
        ref = by_point.get((BASELINE, r["mode"], r["sparse"], r["length"]))
        if not ref or ref["status"] != "ok":
            return f"{r['tokens_per_s']:,.0f} / {r['peak_mib']:,.0f}"
        memory = f" (x{r['peak_mib'] / ref['peak_mib']:.2f})" if ref["peak_mib"] else ""
        speed = f" (x{ref['median_s'] / r['median_s']:.2f})"
        return f"{r['tokens_per_s']:,.0f}{speed} / {r['peak_mib']:,.0f}{memory}"

    for mode in MODES:
        rows = []
        for side, sparse in dict.fromkeys((r["side"], r["sparse"]) for r in records if r["mode"] == mode):
            cells = [status_cell(by_point.get((side, mode, sparse, n)), cell) for n in lengths]
            rows.append([side, str(sparse), *cells])
        step = "training step (forward, backward, AdamW)" if mode == "train" else "forward (eval, no_grad)"
        lines += [f"### {step}: tokens/s (x vs {BASELINE}) / peak MiB (x vs {BASELINE})", ""]
        lines += markdown_table(["side", "sparse_prediction", *(f"n={n}" for n in lengths)], rows) + [""]
    rows = [
        [series_name(r), r["mode"], str(r["length"]), f"{r['first_loss']:.6f}"]
        for r in records
        if r["status"] == "ok"
    ]
    lines += ["### first loss of each point (the same model on every side)", ""]
    return "\n".join(lines + markdown_table(["side", "mode", "n", "loss"], rows))


def plot(records: list[dict], path) -> None:
    """tokens/s and peak MiB against n, a row per mode, a line per (side, head setting)."""
    grid = []
    for mode in MODES:
        series = {series_name(r): {"side": r["side"], "sparse": r["sparse"], "mode": mode} for r in records}
        dashed = {name for name, match in series.items() if match["side"] == BASELINE}
        grid.append(
            [
                length_panel(records, key, f"{mode}: {label}", label, series, dashed)
                for key, label in (("tokens_per_s", "tokens / second"), ("peak_mib", "peak MiB"))
            ]
        )
    plot_loglog(path, grid, panel_size=(6, 4.5))


def make_parser() -> argparse.ArgumentParser:
    parser = benchmark_parser(__doc__, "modernbert", PRESETS)
    parser.add_argument("--models", nargs="+", choices=list(SIDES), help="sides (default: the preset's)")
    parser.add_argument("--lengths", nargs="+", type=int, help="tokens (default: the preset's)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument(
        "--sparse", nargs="+", choices=["on", "off"], default=["on", "off"], help="sparse_prediction"
    )
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--model", help="JSON of ModernBertConfig fields (default: the preset's)")
    add_point_arguments(parser, threads=2, memory_cap_gib=64.0, timeout=3600.0, plugins=False)
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = make_parser().parse_args(argv)
    preset = PRESETS[args.preset]
    sides, lengths = args.models or preset["models"], sorted(args.lengths or preset["lengths"])
    fill_from_preset(args, preset)
    sparse = [value == "on" for value in args.sparse]
    # A side's points run one after the other, so a machine whose speed drifts moves them together.
    bases = [
        {"side": side, "mode": mode, "sparse": s, "length": n}
        for side in sides
        for mode in args.modes
        for s in sparse
        for n in lengths
    ]
    run = launcher(run_point, args, POINT_SETTINGS)
    records = sweep(bases, run, lambda p: (p["side"], p["mode"], p["sparse"]), desc="modernbert benchmark")
    meta = {
        **cpu_meta(args),
        "batch": args.batch,
        "model": json.loads(args.model),
        "mask_probability": MASK_PROBABILITY,
        "sides": {side: SIDES[side] for side in sides},
        "optimizer": "AdamW",
    }
    plots = {"modernbert.png": lambda path: plot(records, path)}
    return write_report(args.out, {"meta": meta, "records": records}, summarize(records, meta), plots)


if __name__ == "__main__":
    main()
