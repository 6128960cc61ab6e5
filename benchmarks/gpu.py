"""GPU benchmark: every text attention type against exact sdpa (FlashAttention backend) on one CUDA GPU.

Forward + backward of the attention core alone, bfloat16, batch 1, 8 heads x 64, n = 4k .. 64k tokens,
every type with its benchmark settings (``benchmarks.mechanisms``; ``implementation="auto"``, so the
structured types run on FlexAttention). All points run in one process (the CUDA caching allocator's peak
counter is reset per point, so no fresh process is needed for memory) with CUDA events for time:

    python -m benchmarks.gpu --out benchmarks/results/reference/gpu
    python -m benchmarks.gpu --dry-run --out /tmp/gpu_dry   # CPU, tiny sizes: the same code paths

Writes ``results.json`` (machine, settings, one record per point), ``summary.md`` (time, ratio to sdpa,
achieved TFLOP/s per useful FLOP from the registry's FLOP models, peak memory) and ``time.png`` /
``memory.png``. A type that fails or runs out of memory at a length gets an error record and is not run at
larger lengths; a point slower than ``--slow_s`` also ends its type's sweep, and nothing new starts after
``--budget_s`` seconds, so the run ends in bounded time.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

import hf_efficient
from hf_efficient.attention import AttentionSpec, build_attention, get_attention_class

from . import harness
from .mechanisms import benchmark_config
from .report import (
    length_panel,
    markdown_table,
    plot_loglog,
    status_cell,
    time_and_memory_plots,
    write_report,
)

BASELINE = "full"  # exact attention through transformers' sdpa, FlashAttention on CUDA in bfloat16
BIASED = ("full_bias_sdpa", "full_bias_flex")  # exact attention with a dense per-head bias (Graphormer)
# Other settings of a registered type, measured beside its benchmark settings: BigBird with blocks of
# FlexAttention's 128 tokens (the layout's blocks are then whole flex blocks, no token-level mask).
VARIANTS = {"bigbird_block128": ("bigbird", {"block_size": 128})}
GPU_SETTINGS = dict(lengths=[4096, 8192, 16384, 32768, 65536], heads=8, head_dim=64, warmup=2, repeats=5)
DRY_SETTINGS = dict(lengths=[256, 512], heads=2, head_dim=16, warmup=1, repeats=1)


def default_types() -> list[str]:
    """Every registered type that runs on a plain sequence, exact attention first, then the biased pair."""
    usable = [t for t in hf_efficient.list_attention_types("text") if t != BASELINE]
    return [BASELINE, *usable, *VARIANTS, *BIASED]


def build_point(name: str, n: int, heads: int, head_dim: int, device: str, dtype: torch.dtype):
    """(call, FLOPs of one call or None, mode) for one (type, length) point.

    On CUDA every point is forward + backward. On the CPU (dry run) the FlexAttention paths run forward
    only (FlexAttention has no CPU backward): forced with ``implementation="flex"``, so the dry run goes
    through the same code as the GPU run."""
    base, overrides = VARIANTS.get(name, (BASELINE if name in BIASED else name, {}))
    cls = get_attention_class(base)
    kernel = "flex_attention" if name == "full_bias_flex" else "sdpa"
    spec = AttentionSpec(heads, head_dim, attn_implementation=kernel, max_seq_len=n)
    settings = {**benchmark_config(base), **overrides}
    on_flex = name == "full_bias_flex" or any(kernel.name == "flex" for kernel in cls.kernels)
    forward_only = device == "cpu" and on_flex
    if forward_only and name != "full_bias_flex":
        settings["implementation"] = "flex"
    core = build_attention(base, spec, settings).to(device).train()
    q, k, v = (
        torch.randn(1, heads, n, head_dim, device=device, dtype=dtype, requires_grad=not forward_only)
        for _ in "qkv"
    )
    bias = torch.randn(1, heads, n, n, device=device, dtype=dtype) if name in BIASED else None
    grad = torch.randn(1, heads, n, head_dim, device=device, dtype=dtype)
    shared = cls.capabilities.shared_query_key

    def call():
        with torch.set_grad_enabled(not forward_only):
            out = core(q, q if shared else k, v, attention_bias=bias).output
        if not forward_only:
            out.backward(grad)

    flops = cls.forward_flops(n, head_dim, core.config)
    factor = 1.0 if forward_only else 3.0
    return call, None if flops is None else factor * heads * flops, "fwd" if forward_only else "fwd_bwd"


def measure(call, device: str, warmup: int, repeats: int) -> tuple[list[float], float | None]:
    """Seconds of each timed call (CUDA events on a GPU; on the CPU :func:`benchmarks.harness.measure`'s
    times) and the peak memory above the inputs, MiB (None on the CPU)."""
    if device != "cuda":
        return harness.measure(call, warmup, repeats).times_s, None
    for _ in range(warmup):  # first calls compile FlexAttention kernels
        call()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return times, (torch.cuda.max_memory_allocated() - before) / 2**20


def run(meta, lengths, heads, head_dim, warmup, repeats, device, dtype, slow_s, budget_s, out) -> list[dict]:
    records, stopped, began = [], {}, time.perf_counter()
    for n in lengths:
        for name in meta["types"]:
            record = dict(type=name, length=n, heads=heads, head_dim=head_dim, dtype=str(dtype))
            if name in stopped:
                record.update(status="skipped", reason=stopped[name])
            elif time.perf_counter() - began > budget_s:
                record.update(status="skipped", reason=f"run budget of {budget_s} s spent")
            elif name in BIASED and n > 16384:
                record.update(status="skipped", reason="the dense (h, n, n) bias alone exceeds 4 GiB")
            else:
                record.update(measure_point(name, n, heads, head_dim, warmup, repeats, device, dtype))
                if record["status"] != "ok":
                    stopped[name] = f"{record['status']} at n={n}"
                elif record["median_s"] > slow_s:
                    stopped[name] = f"slower than {slow_s} s at n={n}"
            records.append(record)
            print(json.dumps(record), flush=True)
            save_partial(out, meta, records)
    return records


def measure_point(name, n, heads, head_dim, warmup, repeats, device, dtype) -> dict:
    try:
        call, flops, mode = build_point(name, n, heads, head_dim, device, dtype)
        times, peak = measure(call, device, warmup, repeats)
    except torch.cuda.OutOfMemoryError:
        return dict(status="oom")
    except Exception as error:  # recorded, and the sweep goes on with the other types
        return dict(status="error", error=f"{type(error).__name__}: {str(error)[:300]}")
    finally:
        if device == "cuda":
            torch.cuda.empty_cache()
    median = statistics.median(times)
    tflops = None if flops is None else flops / median / 1e12
    return dict(
        status="ok", mode=mode, median_s=median, times_s=times, peak_mib=peak, flops=flops, tflops=tflops
    )


def machine(device: str) -> dict:
    info = dict(torch=torch.__version__, transformers=harness.package_version("transformers"))
    info.update(python=platform.python_version(), hf_efficient=hf_efficient.__version__)
    if device == "cuda":
        info.update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda)
    else:
        info.update(cpu=platform.processor() or platform.machine(), note="dry run on the CPU")
    return info


def save_partial(out: Path, meta: dict, records: list[dict]) -> None:
    """results.json after every point, so a killed run keeps what it measured (the report rewrites it)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))


def summarize(records: list[dict], meta: dict) -> str:
    """Markdown: per type and length, time, ratio to sdpa's, TFLOP/s per useful FLOP and peak memory."""
    base = {r["length"]: r for r in records if r["type"] == BASELINE and r["status"] == "ok"}
    first = records[0] if records else {}
    rows = []
    for r in sorted(records, key=lambda r: (r["type"] != BASELINE, r["type"], r["length"])):
        ref = base.get(r["length"])
        note = r.get("reason") or r.get("error") or ""
        if r.get("mode") == "fwd":
            note = "forward only (no CPU backward on FlexAttention)"
        rows.append(
            [
                r["type"],
                str(r["length"]),
                status_cell(r, lambda r: f"{1e3 * r['median_s']:.2f}"),
                status_cell(r, lambda r, ref=ref: f"{ref['median_s'] / r['median_s']:.2f}" if ref else "-"),
                status_cell(r, lambda r: f"{r['tflops']:.1f}" if r.get("tflops") is not None else "-"),
                f"{ref['tflops']:.1f}" if ref and ref.get("tflops") else "-",
                status_cell(r, lambda r: f"{r['peak_mib']:.0f}" if r.get("peak_mib") is not None else "-"),
                note,
            ]
        )
    header = ["type", "n", "time (ms)", "x sdpa", "TFLOP/s", "sdpa TFLOP/s", "peak MiB", "note"]
    intro = [
        f"# GPU benchmark: {meta.get('gpu') or meta.get('cpu')}",
        "",
        f"forward + backward of the core, {first.get('dtype', '')}, batch 1, {first.get('heads', '')} heads "
        f"x {first.get('head_dim', '')}; x sdpa = sdpa's time / this type's (above 1: faster than exact "
        "attention); TFLOP/s per useful FLOP (the registry's FLOP model: the pairs of the mechanism's "
        "pattern, fwd + bwd = 3 x fwd).",
        "",
    ]
    return "\n".join(intro + markdown_table(header, rows))


def plots(records: list[dict]) -> dict:
    """time.png and memory.png: one line per type against n, exact sdpa dashed."""

    def draw(key: str, label: str, path: Path) -> None:
        names = list(dict.fromkeys(r["type"] for r in records))
        series = {t: {"type": t} for t in names}
        panel = length_panel(records, key, f"forward + backward: {label}", label, series, dashed={BASELINE})
        plot_loglog(path, [[panel]], panel_size=(8.0, 5.0))

    return time_and_memory_plots(draw)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: the same code paths.")
    parser.add_argument("--types", nargs="*", default=None)
    parser.add_argument("--lengths", type=int, nargs="*", default=None)
    parser.add_argument("--slow_s", type=float, default=2.0, help="A point slower than this ends its type.")
    parser.add_argument("--budget_s", type=float, default=300.0, help="No new point after this many seconds.")
    args = parser.parse_args(argv)
    settings = dict(DRY_SETTINGS if args.dry_run else GPU_SETTINGS)
    if args.lengths:
        settings["lengths"] = args.lengths
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("benchmarks.gpu needs a CUDA GPU; use --dry-run on a CPU.")
    meta = dict(machine(device), settings=settings, types=args.types or default_types())
    records = run(
        meta,
        device=device,
        dtype=torch.bfloat16,
        slow_s=args.slow_s,
        budget_s=args.budget_s,
        out=args.out,
        **settings,
    )
    return write_report(
        args.out, {"meta": meta, "records": records}, summarize(records, meta), plots(records)
    )


if __name__ == "__main__":
    main()
