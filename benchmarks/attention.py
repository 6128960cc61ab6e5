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

Throughput: once per run the machine's float32 matmul peak is measured (an S x S sgemm, S = --sgemm_size,
with the points' thread count, median of a few after a warm-up, in its own process). Every point gets its
FLOPs from the mechanism's FLOP model (``benchmarks/flops.py``: matrix products only, the pattern's pairs,
forward + backward = 3 x forward), its achieved GFLOP/s (FLOPs / median time) and that as a fraction of the
sgemm peak; a type without a model records null.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # flops.py, also when this file is imported
import flops  # noqa: E402


def bench_configs() -> dict[str, dict]:
    """Each registered type's benchmark settings (its core's ``benchmark_config``; defaults otherwise)."""
    from hf_efficient.attention import ATTENTION_REGISTRY

    registry = ATTENTION_REGISTRY.items()
    return {name: dict(cls.benchmark_config) for name, cls in registry if cls.benchmark_config}


BENCH_CONFIGS = bench_configs()
PRESETS = {
    "full": dict(lengths=[1024, 2048, 4096, 8192, 16384], modes=["fwd", "fwd_bwd"], repeats=3),
    "demo": dict(lengths=[256, 1024, 2048], modes=["fwd_bwd"], repeats=2),
    "smoke": dict(lengths=[64, 128], modes=["fwd_bwd"], repeats=1, heads=2, head_dim=16, sgemm_size=512),
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


def measure(call, grad: bool, warmup: int, repeats: int) -> tuple[list[float], float]:
    """Time ``call()`` (``warmup`` untimed calls, then ``repeats`` timed) and its peak memory in MiB.

    Peak memory: the peak RSS during the calls minus the RSS just before them (inputs already allocated).
    ``call`` does the whole step, backward included when ``grad``; autograd is enabled iff ``grad``.
    """
    import torch

    rss_before = current_rss_bytes()
    reset_peak_rss()  # so an earlier peak in this process (imports, set-up) cannot hide the call's own
    times = []
    with torch.set_grad_enabled(grad):
        for i in range(warmup + repeats):
            start = time.perf_counter()
            call()
            if i >= warmup:
                times.append(time.perf_counter() - start)
    return times, (peak_rss_bytes() - rss_before) / 2**20


def run_sgemm(size: int, threads: int, warmup: int = 1, repeats: int = 5) -> dict:
    """This process's float32 matmul throughput: median GFLOP/s of a size x size x size product."""
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    a, b = torch.randn(size, size), torch.randn(size, size)
    out = torch.empty(size, size)
    times = []
    for i in range(warmup + repeats):
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    flop = 2.0 * size**3
    return {
        "size": size,
        "threads": threads,
        "median_s": statistics.median(times),
        "times_s": times,
        "gflops": flop / statistics.median(times) / 1e9,
    }


def run_worker(cmd: list[str], threads: int, timeout: float, base: dict) -> dict:
    """Run one worker process (OMP_NUM_THREADS = threads) and parse the JSON record on its last line.

    A failure becomes ``{**base, "status": ...}`` ("timeout", "out of memory" or "error" with the last
    line of stderr) instead of an exception.
    """
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**base, "status": f"timeout (> {timeout} s)"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        status = "out of memory" if "memory" in last.lower() or "alloc" in last.lower() else "error"
        return {**base, "status": f"{status}: {last[:200]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_sgemm_peak(args: argparse.Namespace) -> dict | None:
    """The sgemm peak in a fresh process with the points' thread count, or None (--sgemm_size 0, failure)."""
    if args.sgemm_size <= 0:
        return None
    cmd = [sys.executable, __file__, "--sgemm_worker", "--sgemm_size", str(args.sgemm_size)]
    cmd += ["--threads", str(args.threads)]
    record = run_worker(cmd, args.threads, args.timeout, {"size": args.sgemm_size})
    return record if "gflops" in record else None


def add_throughput(record: dict, args: argparse.Namespace, sgemm: dict | None) -> dict:
    """Add FLOPs (its FLOP model), achieved GFLOP/s and the fraction of the sgemm peak; null when unknown."""
    fields = {"flops": None, "gflops": None, "peak_fraction": None}
    if record.get("status") == "ok":
        try:
            fields["flops"] = flops.point_flops(
                record["type"],
                record["length"],
                record["mode"],
                heads=args.heads,
                head_dim=args.head_dim,
                config=record.get("config"),
                batch=args.batch,
                graph_degree=args.graph_degree,
            )
        except Exception as error:  # a FLOP model must never cost the measurement
            fields["flops_error"] = f"{type(error).__name__}: {error}"
        if fields["flops"] is not None and record["median_s"] > 0:
            fields["gflops"] = fields["flops"] / record["median_s"] / 1e9
            if sgemm is not None:
                fields["peak_fraction"] = fields["gflops"] / sgemm["gflops"]
    return {**record, **fields}


def machine_meta(threads: int) -> dict:
    """What every benchmark's results.json records about where it ran."""
    import torch

    return {
        "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "threads": threads,
    }


def attention_meta(args: argparse.Namespace) -> dict:
    """machine_meta plus the shape every attention point shares (batch, heads, head_dim; float32 on CPU)."""
    shape = {"batch": args.batch, "heads": args.heads, "head_dim": args.head_dim}
    return {**machine_meta(args.threads), **shape, "dtype": "float32", "device": "cpu"}


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

    times, peak_mib = measure(call, grad, args.warmup, args.repeats)  # before the error check's n x n
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
    return run_worker(cmd, args.threads, args.timeout, {"type": attention_type, "length": n, "mode": mode})


def summarize(records: list[dict], modes: list[str], sgemm: dict | None = None) -> str:
    """Markdown tables: time and memory per type and length (ratios against full_sdpa), achieved GFLOP/s."""
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
    lines += throughput_tables(records, modes, sgemm)
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


def throughput_tables(records: list[dict], modes: list[str], sgemm: dict | None) -> list[str]:
    """Per mode: achieved GFLOP/s (% of the sgemm peak) per type and length, and each type's FLOP model."""
    ok = {
        (r["type"], r["length"], r["mode"]): r
        for r in records
        if r["status"] == "ok" and r.get("gflops") is not None
    }
    if not ok:
        return []
    peak = f"sgemm peak {sgemm['gflops']:.1f} GFLOP/s" if sgemm else "sgemm peak not measured"
    lines = []
    for mode in modes:
        lengths = sorted({r["length"] for r in records if r["mode"] == mode})
        types = sorted({r["type"] for r in records if r["mode"] == mode})
        lines += [f"\n### {mode}: achieved GFLOP/s (% of the {peak}), FLOPs from benchmarks/flops.py", ""]
        lines.append("| type | " + " | ".join(f"n={n}" for n in lengths) + " | FLOP model (fwd, per head) |")
        lines.append("|---" * (len(lengths) + 2) + "|")
        for t in types:
            cells = []
            for n in lengths:
                r = ok.get((t, n, mode))
                if r is None:
                    cells.append("-")
                elif r.get("peak_fraction") is None:
                    cells.append(f"{r['gflops']:.1f}")
                else:
                    cells.append(f"{r['gflops']:.1f} ({100 * r['peak_fraction']:.0f}%)")
            model = flops.formula(t) or "none (null)"
            lines.append(f"| {t} | " + " | ".join(cells) + f" | {model.split(':')[0]} |")
    return lines


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
    parser.add_argument(
        "--sgemm_size",
        type=int,
        help="side of the float32 matmul that measures the peak GFLOP/s (0: skip; default 4096, smoke 512)",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/attention"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--type", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--sgemm_worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sgemm_worker:
        print(json.dumps(run_sgemm(args.sgemm_size, args.threads)))
        return
    preset = PRESETS[args.preset]
    for name in ("lengths", "modes", "repeats"):
        if getattr(args, name) is None:
            setattr(args, name, preset[name])
    args.heads = args.heads or preset.get("heads", 8)
    args.head_dim = args.head_dim or preset.get("head_dim", 64)
    if args.sgemm_size is None:
        args.sgemm_size = preset.get("sgemm_size", 4096)
    if args.worker:
        print(json.dumps(run_point(args)))
        return

    from tqdm.auto import tqdm

    import hf_efficient

    types = args.types or ["full_eager", "full_sdpa"] + [
        t for t in hf_efficient.list_attention_types() if t != "full"
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    sgemm = measure_sgemm_peak(args)
    if sgemm is not None:
        print(f"sgemm peak ({sgemm['size']}^3, {sgemm['threads']} threads): {sgemm['gflops']:.1f} GFLOP/s")
    records, failed = [], set()
    points = [(t, n, m) for m in args.modes for t in types for n in sorted(args.lengths)]
    for t, n, m in (bar := tqdm(points, desc="attention benchmark")):
        bar.set_postfix_str(f"{t} n={n} {m}")
        if (t, m) in failed:  # a longer sequence cannot succeed where a shorter one failed
            records.append({"type": t, "length": n, "mode": m, "status": "skipped (failed at shorter n)"})
            continue
        record = add_throughput(launch_point(args, t, n, m), args, sgemm)
        if record["status"] != "ok":
            failed.add((t, m))
        records.append(record)
    meta = {
        **attention_meta(args),
        "bench_configs": BENCH_CONFIGS,
        "sgemm": sgemm,
        "flop_convention": flops.CONVENTION,
        "graph_degree": args.graph_degree,
    }
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))
    plot(records, args.out)
    table = summarize(records, args.modes, sgemm)
    (args.out / "summary.md").write_text(table + "\n")
    print(table)
    print(f"\nwrote {args.out}/results.json, summary.md, time.png, memory.png")


if __name__ == "__main__":
    main()
