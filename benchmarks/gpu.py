"""GPU benchmark: every text attention type against exact sdpa (FlashAttention backend) on one CUDA GPU.

Forward + backward of the attention core alone, bfloat16, batch 1, 8 heads x 64, n = 4k .. 64k tokens,
every type with its benchmark settings (``benchmark_config``; ``implementation="auto"``, so the structured
types run on FlexAttention). All points run in one process (the CUDA caching allocator's peak counter is
reset per point, so no fresh process is needed for memory) with CUDA events for time:

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

BASELINE = "full"  # exact attention through transformers' sdpa, FlashAttention on CUDA in bfloat16
BIASED = ("full_bias_sdpa", "full_bias_flex")  # exact attention with a dense per-head bias (Graphormer)
# Other settings of a registered type, measured beside its benchmark_config: BigBird with blocks of
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
    settings = {**cls.benchmark_config, **overrides}
    on_flex = name == "full_bias_flex" or "implementation" in cls.config_class.__dataclass_fields__
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
    """Seconds of each timed call (CUDA events on a GPU) and the peak memory above the inputs, MiB."""
    cuda = device == "cuda"
    for _ in range(warmup):  # first calls compile FlexAttention kernels
        call()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    times = []
    for _ in range(repeats):
        if cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            stop.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(stop) / 1e3)
        else:
            tic = time.perf_counter()
            call()
            times.append(time.perf_counter() - tic)
    peak = (torch.cuda.max_memory_allocated() - before) / 2**20 if cuda else None
    return times, peak


def run(types, lengths, heads, head_dim, warmup, repeats, device, dtype, slow_s, budget_s, out) -> list[dict]:
    records, stopped, began = [], {}, time.perf_counter()
    for n in lengths:
        for name in types:
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
            write_results(out, records)  # after every point: a killed run keeps what it measured
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
    info = dict(
        torch=torch.__version__, transformers=_version("transformers"), python=platform.python_version()
    )
    info["hf_efficient"] = hf_efficient.__version__
    if device == "cuda":
        info.update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda)
    else:
        info.update(cpu=platform.processor() or platform.machine(), note="dry run on the CPU")
    return info


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def write_results(out: Path, records: list[dict], meta: dict | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    previous = json.loads(path.read_text()) if path.exists() and meta is None else {}
    payload = {"meta": meta or previous.get("meta", {}), "records": records}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    tmp.replace(path)


def summarize(records: list[dict], meta: dict) -> str:
    """Markdown: per length, each type's time, its ratio to sdpa's, TFLOP/s and peak memory."""
    base = {r["length"]: r for r in records if r["type"] == BASELINE and r["status"] == "ok"}
    lines = [
        f"# GPU benchmark: {meta.get('gpu') or meta.get('cpu')}",
        "",
        f"forward + backward of the core, {records[0]['dtype'] if records else ''}, batch 1, "
        f"{records[0]['heads'] if records else ''} heads x {records[0]['head_dim'] if records else ''}; "
        "ratio = sdpa's time / this type's (above 1: faster than exact attention); TFLOP/s per useful FLOP "
        "(the registry's FLOP model: the pairs of the mechanism's pattern, fwd + bwd = 3 x fwd).",
        "",
        "| type | n | time (ms) | x sdpa | TFLOP/s | sdpa TFLOP/s | peak MiB | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(records, key=lambda r: (r["type"] != BASELINE, r["type"], r["length"])):
        if r["status"] != "ok":
            lines.append(
                f"| {r['type']} | {r['length']} | - | - | - | - | - | {r['status']}: "
                f"{r.get('reason') or r.get('error', '')} |"
            )
            continue
        ref = base.get(r["length"])
        ratio = f"{ref['median_s'] / r['median_s']:.2f}" if ref else "-"
        ref_tflops = f"{ref['tflops']:.1f}" if ref and ref.get("tflops") else "-"
        tflops = f"{r['tflops']:.1f}" if r.get("tflops") is not None else "-"
        peak = f"{r['peak_mib']:.0f}" if r.get("peak_mib") is not None else "-"
        note = "forward only (no CPU backward on FlexAttention)" if r.get("mode") == "fwd" else ""
        lines.append(
            f"| {r['type']} | {r['length']} | {1e3 * r['median_s']:.2f} | {ratio} | {tflops} | {ref_tflops} "
            f"| {peak} | {note} |"
        )
    return "\n".join(lines) + "\n"


def plot(records: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for key, label, name in (
        ("median_s", "time (s)", "time.png"),
        ("peak_mib", "peak memory (MiB)", "memory.png"),
    ):
        fig, axis = plt.subplots(figsize=(7, 4.5))
        names = list(dict.fromkeys(r["type"] for r in records))
        colours = plt.get_cmap("tab20")
        for i, t in enumerate(names):
            points = [(r["length"], r[key]) for r in records if r["type"] == t and r.get(key) is not None]
            if points:
                style = dict(color="black", linewidth=2.5) if t == BASELINE else dict(color=colours(i % 20))
                axis.plot(*zip(*points, strict=True), marker="os^vD"[i % 5], label=t, **style)
        axis.set(xscale="log", yscale="log", xlabel="sequence length n", ylabel=label)
        axis.set_title(f"forward + backward, {label.split(' (')[0]}")
        axis.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)


def replot(out: Path) -> None:
    """Rewrite summary.md and the plots of a finished run from its results.json."""
    payload = json.loads((out / "results.json").read_text())
    (out / "summary.md").write_text(summarize(payload["records"], payload["meta"]))
    plot(payload["records"], out)


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
    write_results(args.out, [], meta)
    records = run(
        meta["types"],
        device=device,
        dtype=torch.bfloat16,
        slow_s=args.slow_s,
        budget_s=args.budget_s,
        out=args.out,
        **settings,
    )
    write_results(args.out, records, meta)
    (args.out / "summary.md").write_text(summarize(records, meta))
    plot(records, args.out)
    print(summarize(records, meta))
    return {"meta": meta, "records": records}


if __name__ == "__main__":
    main()
