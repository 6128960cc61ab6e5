"""Attention alone: time and peak memory against sequence length for every registered mechanism.

Each (mechanism, length, mode) point runs in a fresh Python process, so its peak memory is its own and no
allocator state leaks between points. Exact attention is measured with two kernels, ``full_eager`` and
``full_sdpa``; ratios in the summary are against ``full_sdpa`` at the same length, measured in the same run.

    python benchmarks/attention.py                           # every type, 1k..16k, fwd and fwd+bwd
    python benchmarks/attention.py --preset demo             # small and quick
    python benchmarks/attention.py --types longformer bigbird --lengths 4096 16384 --modes fwd_bwd

Writes ``<out>/results.json``, ``<out>/time.png``, ``<out>/memory.png`` and prints a markdown table.
Peak memory is the process's peak resident set size (VmHWM, reset just before the first call) minus its
size at that moment (inputs and parameters already allocated), i.e. what the mechanism itself needs on top
of its inputs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH_CONFIGS = {
    # Settings the issues quote; every other type uses its defaults.
    "longformer": {"attention_window": 512},
    "bigbird": {"block_size": 64},
}
PRESETS = {
    "full": dict(lengths=[1024, 2048, 4096, 8192, 16384], modes=["fwd", "fwd_bwd"], repeats=3),
    "demo": dict(lengths=[256, 1024, 2048], modes=["fwd_bwd"], repeats=2),
    "smoke": dict(lengths=[64, 128], modes=["fwd_bwd"], repeats=1, heads=2, head_dim=16),
}


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> None:
    """Make the kernel's peak-RSS counter (VmHWM) start again from the current size (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024  # reported in kB


def cap_address_space(gib: float) -> None:
    """Cap this process's address space (0: no cap): an over-large point fails fast instead of swapping."""
    import resource

    if gib > 0:
        cap = int(gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def run_point(args: argparse.Namespace) -> dict:
    """Measure one point in this process (called in a fresh subprocess)."""
    cap_address_space(args.memory_cap_gib)
    import torch

    import hf_efficient
    from hf_efficient.attention import AttentionSpec, GraphEdges, build_attention, get_attention_class

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    b, h, n, d = args.batch, args.heads, args.length, args.head_dim
    if args.type.startswith("full_"):
        attention_type, impl = "full", args.type.removeprefix("full_")
        config = {}
    else:
        attention_type, impl = args.type, "sdpa"
        config = {**BENCH_CONFIGS.get(args.type, {}), **json.loads(args.config or "{}")}
    spec = AttentionSpec(num_heads=h, head_dim=d, attn_implementation=impl, max_seq_len=n)
    core = build_attention(attention_type, spec, config).train(False)
    caps = get_attention_class(attention_type).capabilities
    grad = args.mode == "fwd_bwd"
    q, k, v = (torch.randn(b, h, n, d, requires_grad=grad) for _ in range(3))
    edges = None
    if caps.requires_edges:  # a random graph of fixed in-degree over the "sequence"
        targets = torch.arange(b * n).repeat_interleave(args.graph_degree)
        sources = (targets // n) * n + torch.randint(0, n, (b * n * args.graph_degree,))
        edges = GraphEdges(torch.stack([sources, targets]))
    upstream = torch.randn(b, h, n, d)

    def call():
        out = core(q, q if caps.shared_query_key else k, v, edges=edges).output
        if grad:
            (out * upstream).sum().backward()
            for t in (q, k, v):
                t.grad = None

    rss_before = current_rss_bytes()
    reset_peak_rss()  # so an earlier peak in this process (imports, set-up) cannot hide the call's own
    times = []
    with torch.set_grad_enabled(grad):
        for i in range(args.warmup + args.repeats):
            start = time.perf_counter()
            call()
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
    peak_mib = (peak_rss_bytes() - rss_before) / 2**20  # read before the error check allocates n x n
    rel_error = None
    if attention_type != "full" and not caps.requires_edges and n <= args.error_max_length:
        # Approximation quality on these very inputs: ||out - exact|| / ||exact||, exact in float64. Graph
        # attention on a random graph is a different operator, not an approximation, so it has none.
        with torch.no_grad():
            out = core(q, q if caps.shared_query_key else k, v, edges=edges).output.double()
            keys = q if caps.shared_query_key else k
            exact = build_attention("full", spec, {})(q.double(), keys.double(), v.double()).output
            rel_error = ((out - exact).norm() / exact.norm()).item()
    return {
        "type": args.type,
        "config": config,
        "length": n,
        "mode": args.mode,
        "status": "ok",
        "median_s": statistics.median(times),
        "times_s": times,
        "peak_mib": peak_mib,
        "rel_error": rel_error,
        "hf_efficient": hf_efficient.__version__,
    }


def launch_point(args: argparse.Namespace, attention_type: str, n: int, mode: str) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--type", attention_type, "--length", str(n), "--mode", mode]
    for name in (
        "batch",
        "heads",
        "head_dim",
        "threads",
        "warmup",
        "repeats",
        "memory_cap_gib",
        "graph_degree",
        "error_max_length",
    ):
        cmd += [f"--{name}", str(getattr(args, name))]
    if args.config:
        cmd += ["--config", args.config]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    base = {"type": attention_type, "length": n, "mode": mode}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**base, "status": f"timeout (> {args.timeout} s)"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        status = "out of memory" if "memory" in last.lower() or "alloc" in last.lower() else "error"
        return {**base, "status": f"{status}: {last[:200]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(records: list[dict], modes: list[str]) -> str:
    """Markdown table: time and memory per type and length, with ratios against full_sdpa."""
    ok = {(r["type"], r["length"], r["mode"]): r for r in records if r["status"] == "ok"}
    lines = []
    for mode in modes:
        lengths = sorted({r["length"] for r in records if r["mode"] == mode})
        types = sorted({r["type"] for r in records if r["mode"] == mode})
        lines += [f"\n### {mode}: seconds (x speed-up vs full_sdpa) / peak MiB", ""]
        lines.append("| type | " + " | ".join(f"n={n}" for n in lengths) + " |")
        lines.append("|---" * (len(lengths) + 1) + "|")
        for t in types:
            cells = []
            for n in lengths:
                r, ref = ok.get((t, n, mode)), ok.get(("full_sdpa", n, mode))
                if r is None:
                    failed = next(
                        (x for x in records if (x["type"], x["length"], x["mode"]) == (t, n, mode)), None
                    )
                    cells.append(failed["status"].split(":")[0] if failed else "-")
                    continue
                speed = f" (x{ref['median_s'] / r['median_s']:.1f})" if ref else ""
                cells.append(f"{r['median_s']:.3f}{speed} / {r['peak_mib']:.0f}")
            lines.append(f"| {t} | " + " | ".join(cells) + " |")
    errors = {(r["type"], r["length"]): r["rel_error"] for r in ok.values() if r.get("rel_error") is not None}
    if errors:
        lengths = sorted({n for _, n in errors})
        lines += ["\n### relative error ||out - exact|| / ||exact|| (same random inputs, untrained)", ""]
        lines.append("| type | " + " | ".join(f"n={n}" for n in lengths) + " |")
        lines.append("|---" * (len(lengths) + 1) + "|")
        for t in sorted({t for t, _ in errors}):
            cells = [f"{errors[(t, n)]:.3g}" if (t, n) in errors else "-" for n in lengths]
            lines.append(f"| {t} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(records: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for key, label, name in (("median_s", "seconds", "time.png"), ("peak_mib", "peak MiB", "memory.png")):
        modes = sorted({r["mode"] for r in records})
        fig, axes = plt.subplots(1, len(modes), figsize=(6.5 * len(modes), 5), squeeze=False)
        for ax, mode in zip(axes[0], modes, strict=True):
            types = sorted({r["type"] for r in records})
            colors = plt.cm.tab20(range(len(types)))  # tab10 would repeat colours beyond ten types
            for t, color in zip(types, colors, strict=True):
                pts = sorted(
                    (r["length"], r[key])
                    for r in records
                    if r["type"] == t and r["mode"] == mode and r["status"] == "ok"
                )
                if pts:
                    style = "--" if t.startswith("full") else "-"
                    ax.plot(*zip(*pts, strict=True), style, marker="o", color=color, label=t)
            ax.set(
                xscale="log", yscale="log", xlabel="sequence length n", ylabel=label, title=f"{label}, {mode}"
            )
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full")
    parser.add_argument(
        "--types", nargs="+", help="attention types (default: all registered + full_eager/sdpa)"
    )
    parser.add_argument("--lengths", nargs="+", type=int)
    parser.add_argument("--modes", nargs="+", choices=["fwd", "fwd_bwd"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--head_dim", type=int)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--config", help="JSON attention_config applied to the (single) benchmarked type")
    parser.add_argument("--graph_degree", type=int, default=16, help="in-degree of the graph for graph types")
    parser.add_argument(
        "--error_max_length",
        type=int,
        default=4096,
        help="report relative error against exact attention up to this length",
    )
    parser.add_argument(
        "--memory_cap_gib", type=float, default=16.0, help="address-space cap per point (0: none)"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per point")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/attention"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--type", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    for name in ("lengths", "modes", "repeats"):
        if getattr(args, name) is None:
            setattr(args, name, preset[name])
    args.heads = args.heads or preset.get("heads", 8)
    args.head_dim = args.head_dim or preset.get("head_dim", 64)
    if args.worker:
        print(json.dumps(run_point(args)))
        return

    from tqdm.auto import tqdm

    import hf_efficient

    types = args.types or ["full_eager", "full_sdpa"] + [
        t for t in hf_efficient.list_attention_types() if t != "full"
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    records, failed = [], set()
    points = [(t, n, m) for m in args.modes for t in types for n in sorted(args.lengths)]
    for t, n, m in (bar := tqdm(points, desc="attention benchmark")):
        bar.set_postfix_str(f"{t} n={n} {m}")
        if (t, m) in failed:  # a longer sequence cannot succeed where a shorter one failed
            records.append({"type": t, "length": n, "mode": m, "status": "skipped (failed at shorter n)"})
            continue
        record = launch_point(args, t, n, m)
        if record["status"] != "ok":
            failed.add((t, m))
        records.append(record)
    import torch

    meta = {
        "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "threads": args.threads,
        "batch": args.batch,
        "heads": args.heads,
        "head_dim": args.head_dim,
        "dtype": "float32",
        "device": "cpu",
        "bench_configs": BENCH_CONFIGS,
    }
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))
    plot(records, args.out)
    table = summarize(records, args.modes)
    (args.out / "summary.md").write_text(table + "\n")
    print(table)
    print(f"\nwrote {args.out}/results.json, summary.md, time.png, memory.png")


if __name__ == "__main__":
    main()
