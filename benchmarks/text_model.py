"""A whole text model, one training step's forward and backward: tokens per second and peak memory.

The model is a 4-layer, hidden-256, 4-head (head 64), intermediate-1024 ``EfficientBertForMaskedLM`` with
BERT's vocabulary (30,522) and ``max_position_embeddings`` set to the sequence length, in training mode
(hidden dropout 0.1, attention-probability dropout 0: dropout inside attention would push exact sdpa off
its fused kernel). One step is ``model(input_ids, attention_mask, labels).loss.backward()`` on a batch of
random token ids with 15% of positions masked for the MLM loss (the standard HF head computes the logits of
every position, as ``BertForMaskedLM`` does); no optimizer step. Exact attention runs with two kernels,
``full_eager`` (BERT's) and ``full_sdpa``; speed-ups in the summary are against ``full_sdpa`` at the same
length, measured in the same run.

Each (type, length) point runs in a fresh Python process, with the helpers of ``benchmarks/attention.py``:
an address-space cap makes an over-large point fail fast, and peak memory is the process's peak resident
set size during the steps (VmHWM, reset after the model and inputs are built) minus its size at that
moment, i.e. activations, gradients and workspace on top of the parameters.

    python benchmarks/text_model.py --threads 2                   # n = 512, 2048, 8192 for every text type,
                                                                  # and 16384 for the long-input types
    python benchmarks/text_model.py --types longformer full_sdpa --lengths 16384
    python benchmarks/text_model.py --preset smoke                # tiny, for tests

Writes ``<out>/results.json``, ``<out>/summary.md``, ``<out>/throughput.png``, ``<out>/time.png`` and
``<out>/memory.png``, and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/attention.py, also when imported
from attention import (  # noqa: E402
    BENCH_CONFIGS,
    cap_address_space,
    current_rss_bytes,
    machine_meta,
    peak_rss_bytes,
    reset_peak_rss,
)
from attention import plot as plot_time_and_memory  # noqa: E402

# The types the issue runs at 16,384 tokens (exact sdpa comes along as the baseline of the ratios).
LONG_TYPES = [
    "longformer",
    "bigbird",
    "linformer",
    "nystromformer",
    "linear",
    "performer",
    "rfa",
    "long_short",
    "reformer_lsh",
]
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


def resolve_type(name: str, config_json: str | None) -> tuple[str, str, dict]:
    """Benchmark type name -> (attention_type, attn_implementation, attention_config)."""
    if name.startswith("full_"):
        return "full", name.removeprefix("full_"), {}
    return name, "sdpa", {**BENCH_CONFIGS.get(name, {}), **json.loads(config_json or "{}")}


def run_point(args: argparse.Namespace) -> dict:
    """Measure one (type, length) point in this process (called in a fresh subprocess)."""
    cap_address_space(args.memory_cap_gib)
    import torch

    import hf_efficient
    from hf_efficient import EfficientBertConfig, EfficientBertForMaskedLM

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    b, n = args.batch, args.length
    attention_type, implementation, attention_config = resolve_type(args.type, args.config)
    config = EfficientBertConfig(
        **json.loads(args.model),
        max_position_embeddings=n,
        attention_type=attention_type,
        attention_config=attention_config or None,
        hidden_dropout_prob=args.hidden_dropout,
        attention_probs_dropout_prob=0.0,
    )
    model = EfficientBertForMaskedLM._from_config(config, attn_implementation=implementation).train()
    vocab = config.vocab_size
    input_ids = torch.randint(5, vocab, (b, n))  # (b, n), clear of the special ids 0..4
    masked = torch.rand(b, n) < MASK_PROBABILITY
    labels = torch.where(masked, input_ids, -100)  # (b, n), the MLM collator's convention
    input_ids = input_ids.masked_fill(masked, MASK_TOKEN_ID if vocab > MASK_TOKEN_ID else 1)
    attention_mask = torch.ones(b, n, dtype=torch.long)  # what a tokenizer hands over

    def step():
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        return loss

    rss_before = current_rss_bytes()
    reset_peak_rss()  # so an earlier peak in this process (imports, set-up) cannot hide the step's own
    times = []
    for i in range(args.warmup + args.repeats):
        start = time.perf_counter()
        loss = step()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    peak_mib = (peak_rss_bytes() - rss_before) / 2**20
    median = statistics.median(times)
    return {
        "type": args.type,
        "attention_type": attention_type,
        "attn_implementation": implementation,
        "config": attention_config,
        "length": n,
        "mode": "fwd_bwd",
        "status": "ok",
        "median_s": median,
        "times_s": times,
        "tokens_per_s": b * n / median,
        "peak_mib": peak_mib,
        "base_rss_mib": rss_before / 2**20,
        "parameters": sum(p.numel() for p in model.parameters()),
        "loss": float(loss),
        "hf_efficient": hf_efficient.__version__,
    }


def launch_point(args: argparse.Namespace, name: str, n: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--type", name, "--length", str(n)]
    for option in ("batch", "threads", "warmup", "repeats", "memory_cap_gib", "hidden_dropout", "model"):
        cmd += [f"--{option}", str(getattr(args, option))]
    if args.config:
        cmd += ["--config", args.config]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    base = {"type": name, "length": n, "mode": "fwd_bwd"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**base, "status": f"timeout (> {args.timeout:.0f} s)"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        status = "out of memory" if "memory" in last.lower() or "alloc" in last.lower() else "error"
        return {**base, "status": f"{status}: {last[:200]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(records: list[dict], meta: dict) -> str:
    """Markdown table: tokens/s (speed-up vs full_sdpa) and peak MiB per type and length."""
    ok = {(r["type"], r["length"]): r for r in records if r["status"] == "ok"}
    lengths = sorted({r["length"] for r in records})
    types = list(dict.fromkeys(r["type"] for r in records))
    model = meta["model"]
    lines = [
        f"### forward + backward (MLM loss), {model['num_hidden_layers']} layers, hidden "
        f"{model['hidden_size']}, {model['num_attention_heads']} heads, vocab {model['vocab_size']}, batch "
        f"{meta['batch']}, {meta['threads']} threads: tokens/s (x speed-up vs full_sdpa) / peak MiB",
        "",
        "| type | " + " | ".join(f"n={n}" for n in lengths) + " |",
        "|---" * (len(lengths) + 1) + "|",
    ]
    for t in types:
        cells = []
        for n in lengths:
            r, ref = ok.get((t, n)), ok.get(("full_sdpa", n))
            if r is None:
                failed = next((x for x in records if (x["type"], x["length"]) == (t, n)), None)
                cells.append(failed["status"].split(":")[0] if failed else "-")
                continue
            speed = f" (x{ref['median_s'] / r['median_s']:.2f})" if ref else ""
            cells.append(f"{r['tokens_per_s']:,.0f}{speed} / {r['peak_mib']:,.0f}")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    configs = {t: r["config"] for (t, _), r in ok.items() if r.get("config")}
    if configs:
        lines += ["", "attention_config: " + "; ".join(f"{t} {json.dumps(c)}" for t, c in configs.items())]
    return "\n".join(lines)


def plot_throughput(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    types = list(dict.fromkeys(r["type"] for r in records))
    fig, ax = plt.subplots(figsize=(7, 5))
    for t, color in zip(types, plt.cm.tab20(range(len(types))), strict=True):
        pts = sorted(
            (r["length"], r["tokens_per_s"]) for r in records if r["type"] == t and r["status"] == "ok"
        )
        if pts:
            style = "--" if t.startswith("full") else "-"
            ax.plot(*zip(*pts, strict=True), style, marker="o", color=color, label=t)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="sequence length n",
        ylabel="tokens / second",
        title="text model, forward + backward",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
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
    parser.add_argument("--long_types", nargs="+", default=LONG_TYPES + ["full_sdpa"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--model", help="JSON of EfficientBertConfig sizes (default: the preset's)")
    parser.add_argument("--hidden_dropout", type=float, default=0.1)
    parser.add_argument("--config", help="JSON attention_config applied to the (single) benchmarked type")
    parser.add_argument(
        "--memory_cap_gib", type=float, default=16.0, help="address-space cap per point (0: none)"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per point")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/text_model"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--type", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    if args.long_lengths is None:
        args.long_lengths = [] if args.lengths else preset["long_lengths"]
    args.lengths = args.lengths or preset["lengths"]
    args.repeats = args.repeats or preset["repeats"]
    args.model = args.model or json.dumps(preset["model"])
    if args.worker:
        print(json.dumps(run_point(args)))
        return

    from tqdm.auto import tqdm

    import hf_efficient

    types = args.types or ["full_eager", "full_sdpa"] + [
        t for t in hf_efficient.list_attention_types("text") if t != "full"
    ]
    points = [(t, n) for t in types for n in sorted(args.lengths)]
    points += [(t, n) for n in sorted(args.long_lengths) for t in types if t in args.long_types]
    args.out.mkdir(parents=True, exist_ok=True)
    records, failed = [], set()
    for t, n in (bar := tqdm(points, desc="text model benchmark")):
        bar.set_postfix_str(f"{t} n={n}")
        if t in failed:  # a longer sequence cannot succeed where a shorter one failed
            records.append(
                {"type": t, "length": n, "mode": "fwd_bwd", "status": "skipped (failed at shorter n)"}
            )
            continue
        record = launch_point(args, t, n)
        if record["status"] != "ok":
            failed.add(t)
        records.append(record)
    meta = {
        **machine_meta(args.threads),
        "batch": args.batch,
        "model": json.loads(args.model),
        "hidden_dropout": args.hidden_dropout,
        "attention_probs_dropout": 0.0,
        "mask_probability": MASK_PROBABILITY,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "dtype": "float32",
        "device": "cpu",
        "bench_configs": BENCH_CONFIGS,
    }
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))
    plot_throughput(records, args.out / "throughput.png")
    plot_time_and_memory(records, args.out)  # time.png, memory.png (log-log, as the attention benchmark)
    table = summarize(records, meta)
    (args.out / "summary.md").write_text(table + "\n")
    print(table)
    print(f"\nwrote {args.out}/results.json, summary.md, throughput.png, time.png, memory.png")


if __name__ == "__main__":
    main()
