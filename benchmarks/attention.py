"""Attention alone: time and peak memory against sequence length for every registered mechanism.

Each (mechanism, length, mode) point runs in a fresh Python process (``benchmarks.harness``), so its peak
memory is its own and no allocator state leaks between points. Exact attention is measured with two
kernels, ``full_eager`` and ``full_sdpa``; ratios in the summary are against ``full_sdpa`` at the same
length, measured in the same run. The types are the registry's (``benchmarks.mechanisms``), each with its
benchmark settings; ``--plugin`` adds types registered outside the package.

    python -m benchmarks.attention                           # every type, 1k..16k, fwd and fwd+bwd
    python -m benchmarks.attention --preset demo             # small and quick
    python -m benchmarks.attention --types longformer bigbird --lengths 4096 16384 --modes fwd_bwd
    python -m benchmarks.attention --preset smoke --plugin my_attention.py   # its types run too

Writes ``<out>/results.json``, ``<out>/summary.md``, ``<out>/time.png``, ``<out>/memory.png`` (and
``<out>/roofline.png`` when the roofline was counted) and prints the tables. Peak memory is the process's
peak resident set size (VmHWM, reset just before the first call) minus its size at that moment (inputs and
parameters already allocated), i.e. what the mechanism itself needs on top of its inputs.

Throughput: once per run the machine's float32 matmul peak is measured (an S x S sgemm, S = --sgemm_size,
the points' thread count, in its own process); every point gets its FLOPs from the mechanism's FLOP model
(``benchmarks.flops``), its achieved GFLOP/s and that as a fraction of the peak (null without a model).
Roofline (``benchmarks.roofline``, with the copy bandwidth measured once per run, ``--bandwidth_gib``; 0
skips both): each point's ``roofline_fraction`` and ``memory_bound_share``. Allocator (``--allocator``):
glibc's defaults, as in a user's process, or the settings of ``benchmarks.harness.ALLOCATORS``.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from pathlib import Path

from benchmarks import flops, roofline
from benchmarks.harness import (
    Measurement,
    ProcessOptions,
    add_allocator_argument,
    add_point_arguments,
    benchmark_parser,
    fill_from_preset,
    launcher,
    machine_meta,
    measure,
    measure_bandwidth,
    measure_sgemm_peak,
    set_up_torch,
    sweep,
    use_allocator,
)
from benchmarks.mechanisms import BASELINE, EXACT, bench_configs, benchmark_types, is_exact, resolve
from benchmarks.plugins import parse_args_with_plugins
from benchmarks.report import (
    length_panel,
    plot_loglog,
    status_cell,
    time_and_memory_plots,
    write_report,
)
from hf_efficient.markdown import markdown_table

PRESETS = {
    "full": dict(lengths=[1024, 2048, 4096, 8192, 16384], modes=["fwd", "fwd_bwd"], repeats=3),
    "demo": dict(lengths=[256, 1024, 2048], modes=["fwd_bwd"], repeats=2),
    "smoke": dict(
        lengths=[64, 128],
        modes=["fwd_bwd"],
        repeats=1,
        heads=2,
        head_dim=16,
        sgemm_size=512,
        bandwidth_gib=1 / 32,
    ),
}
# What a point process needs besides its (type, length, mode).
POINT_SETTINGS = (
    "batch heads head_dim threads warmup repeats graph_degree error_max_length count_ops allocator".split()
)


def timed_call(forward: Callable, leaves: list, upstream, grad: bool) -> Callable[[], None]:
    """The call a point times: ``forward()``, and when ``grad`` its output times ``upstream`` summed and
    back-propagated, the leaves' gradients dropped after."""

    def call():
        out = forward()
        if grad:
            (out * upstream).sum().backward()
            for t in leaves:
                t.grad = None

    return call


def time_forward(
    forward: Callable, leaves: list, upstream, grad: bool, warmup: int, repeats: int
) -> Measurement:
    """Time :func:`timed_call` with autograd enabled iff ``grad``."""
    import torch

    with torch.set_grad_enabled(grad):
        return measure(timed_call(forward, leaves, upstream, grad), warmup, repeats)


def count_ops(call: Callable[[], None], grad: bool) -> dict:
    """Every aten op ``call`` runs, counted (``benchmarks.roofline.count_ops``) with autograd iff ``grad``."""
    import torch

    with torch.set_grad_enabled(grad):
        return roofline.count_ops(call)


def run_point(point: argparse.Namespace) -> dict:
    """Point function: one (type, length, mode) point of attention alone, in this process."""
    import torch

    import hf_efficient
    from hf_efficient.attention import AttentionSpec, GraphEdges, build_attention, get_attention_class

    use_allocator(point)
    set_up_torch(point.threads)
    b, h, n, d = point.batch, point.heads, point.length, point.head_dim
    attention_type, implementation, config = resolve(point.type, point.config)
    spec = AttentionSpec(num_heads=h, head_dim=d, attn_implementation=implementation, max_seq_len=n)
    core = build_attention(attention_type, spec, config).train(False)
    caps = get_attention_class(attention_type).capabilities
    grad = point.mode == "fwd_bwd"
    q, k, v = (torch.randn(b, h, n, d, requires_grad=grad) for _ in range(3))  # each (b, h, n, d)
    keys = q if caps.shared_query_key else k
    edges = None
    if caps.requires_edges:  # a random graph of fixed in-degree over the "sequence"
        targets = torch.arange(b * n).repeat_interleave(point.graph_degree)
        sources = (targets // n) * n + torch.randint(0, n, (b * n * point.graph_degree,))
        edges = GraphEdges(torch.stack([sources, targets]))
    upstream = torch.randn(b, h, n, d)

    def forward():
        return core(q, keys, v, edges=edges).output

    timing = time_forward(forward, [q, k, v], upstream, grad, point.warmup, point.repeats)
    counts = {"op_counts": None}
    if getattr(point, "count_ops", False):  # callers that time a core without a roofline (peers) omit it
        counts = count_ops(timed_call(forward, [q, k, v], upstream, grad), grad)
    rel_error = None  # measured after the timing: its n x n reference must not count in the peak
    if attention_type != EXACT and not caps.requires_edges and n <= point.error_max_length:
        # Approximation quality on these very inputs: ||out - exact|| / ||exact||, exact in float64. Graph
        # attention on a random graph is a different operator, not an approximation, so it has none.
        with torch.no_grad():
            exact = build_attention(EXACT, spec, {})(q.double(), keys.double(), v.double()).output
            rel_error = ((forward().double() - exact).norm() / exact.norm()).item()
    return {
        "type": point.type,
        "config": config,
        "length": n,
        "mode": point.mode,
        **timing.fields(),
        **counts,
        "rel_error": rel_error,
        "hf_efficient": hf_efficient.__version__,
    }


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


def attention_meta(args: argparse.Namespace) -> dict:
    """machine_meta plus the shape every attention point shares (batch, heads, head_dim; float32 on CPU)."""
    shape = {"batch": args.batch, "heads": args.heads, "head_dim": args.head_dim}
    return {**machine_meta(args.threads), **shape, "dtype": "float32", "device": "cpu"}


def _mode_tables(records, modes, title: str, show, axes=None, last=None) -> list[str]:
    """Per mode, a table of ``show(record)`` for every type (rows) and length (columns) of ``axes`` (default
    ``records``), titled "<mode>: <title>"; ``last``: (its header given the longest length, its cell given
    the type and the type's record at that length) of one more column."""
    by_point = {(r["type"], r["length"], r["mode"]): r for r in records}
    lines = []
    for mode in modes:
        of_mode = [r for r in (records if axes is None else axes) if r["mode"] == mode]
        lengths, types = sorted({r["length"] for r in of_mode}), sorted({r["type"] for r in of_mode})
        if not lengths:
            continue
        header = ["type", *(f"n={n}" for n in lengths), *([last[0](lengths[-1])] if last else [])]
        rows = [
            [t, *(status_cell(by_point.get((t, n, mode)), show) for n in lengths)]
            + ([last[1](t, by_point.get((t, lengths[-1], mode)))] if last else [])
            for t in types
        ]
        lines += [f"\n### {mode}: {title}", "", *markdown_table(header, rows)]
    return lines


def summarize(
    records: list[dict], modes: list[str], sgemm: dict | None = None, bandwidth: dict | None = None
) -> str:
    """Markdown tables: time and memory per type and length (ratios against full_sdpa), achieved GFLOP/s,
    the roofline, relative error against exact attention."""
    by_point = {(r["type"], r["length"], r["mode"]): r for r in records}

    def time_and_memory(r: dict) -> str:
        ref = by_point.get((BASELINE, r["length"], r["mode"]))
        speed = f" (x{ref['median_s'] / r['median_s']:.1f})" if ref and ref["status"] == "ok" else ""
        return f"{r['median_s']:.3f}{speed} / {r['peak_mib']:.0f}"

    lines = _mode_tables(records, modes, f"seconds (x speed-up vs {BASELINE}) / peak MiB", time_and_memory)
    lines += throughput_tables(records, modes, sgemm)
    lines += roofline_tables(records, modes, sgemm, bandwidth)
    errors = {
        (r["type"], r["length"]): r["rel_error"]
        for r in records
        if r["status"] == "ok" and r.get("rel_error") is not None
    }
    if errors:
        lengths = sorted({n for _, n in errors})
        rows = [
            [t, *(f"{errors[(t, n)]:.3g}" if (t, n) in errors else "-" for n in lengths)]
            for t in sorted({t for t, _ in errors})
        ]
        lines += ["\n### relative error ||out - exact|| / ||exact|| (same random inputs, untrained)", ""]
        lines += markdown_table(["type", *(f"n={n}" for n in lengths)], rows)
    return "\n".join(lines)


def throughput_tables(records: list[dict], modes: list[str], sgemm: dict | None) -> list[str]:
    """Per mode: achieved GFLOP/s (% of the sgemm peak) per type and length, and each type's FLOP model."""
    measured = [r for r in records if r["status"] == "ok" and r.get("gflops") is not None]
    if not measured:
        return []
    peak = f"sgemm peak {sgemm['gflops']:.1f} GFLOP/s" if sgemm else "sgemm peak not measured"

    def throughput(r: dict) -> str:
        share = f" ({100 * r['peak_fraction']:.0f}%)" if r.get("peak_fraction") is not None else ""
        return f"{r['gflops']:.1f}{share}"

    title = f"achieved GFLOP/s (% of the {peak}), FLOPs from benchmarks.flops"
    model = (
        lambda n: "FLOP model (fwd, per head)",
        lambda t, r: (flops.formula(t) or "none (null)").split(":")[0],
    )
    return _mode_tables(measured, modes, title, throughput, axes=records, last=model)


def roofline_tables(
    records: list[dict], modes: list[str], sgemm: dict | None, bandwidth: dict | None
) -> list[str]:
    """Per mode: each point's roofline fraction and memory-bound share, and at the longest length the ops
    that take most of each type's roofline time."""
    counted = [r for r in records if r["status"] == "ok" and r.get("roofline")]
    if not counted:
        return []
    limits = f"sgemm {sgemm['gflops']:.1f} GFLOP/s, copy {bandwidth['copy_gbps']:.1f} GB/s, same run"

    def fraction(r: dict) -> str:
        return (
            f"{100 * r['roofline_fraction']:.0f}% (memory {100 * r['roofline']['memory_bound_share']:.0f}%)"
        )

    largest = (
        lambda n: f"largest ops at n={n} (share of roofline time)",
        lambda t, r: status_cell(r, lambda r: roofline.largest_ops(r["roofline"], 3)),
    )
    title = f"roofline time / measured time (share of the roofline time bound by memory); limits: {limits}"
    return _mode_tables(counted, modes, title, fraction, last=largest)


def plot_roofline(records: list[dict], path: Path) -> None:
    """Each type's roofline fraction at the longest length counted, per mode (``roofline.plot_fractions``)."""
    longest = max(r["length"] for r in records)
    points = [
        (f"{r['type']} ({r['mode']})", r["roofline"], r["median_s"])
        for r in sorted(records, key=lambda r: (r["mode"], r["type"]))
        if r["length"] == longest
    ]
    roofline.plot_fractions(points, f"attention cores at n={longest}: how close to the machine", path)


def plot_metric(records: list[dict], key: str, label: str, path: Path) -> None:
    """``records[key]`` against n for every type, log-log, a panel per mode; exact attention dashed."""
    types = sorted({r["type"] for r in records})
    exact = {t for t in types if is_exact(t)}
    panels = [
        length_panel(
            records, key, f"{label}, {mode}", label, {t: {"type": t, "mode": mode} for t in types}, exact
        )
        for mode in sorted({r["mode"] for r in records})
    ]
    plot_loglog(path, [panels], panel_size=(6.5, 5))


def make_parser() -> argparse.ArgumentParser:
    parser = benchmark_parser(__doc__, "attention", PRESETS)
    parser.add_argument(
        "--types",
        nargs="+",
        help="attention types (default: every registered one, full as full_eager and full_sdpa)",
    )
    parser.add_argument("--lengths", nargs="+", type=int)
    parser.add_argument("--modes", nargs="+", choices=["fwd", "fwd_bwd"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--head_dim", type=int)
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
        "--sgemm_size",
        type=int,
        help="side of the float32 matmul that measures the peak GFLOP/s (0: skip; default 4096, smoke 512)",
    )
    parser.add_argument(
        "--bandwidth_gib",
        type=float,
        help="GiB copied to measure the memory bandwidth for the roofline (0: no roofline; default 1)",
    )
    add_allocator_argument(parser)
    add_point_arguments(parser, threads=2, memory_cap_gib=16.0, timeout=300.0)
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = parse_args_with_plugins(make_parser, argv)
    fill_from_preset(args, PRESETS[args.preset], heads=8, head_dim=64, sgemm_size=4096, bandwidth_gib=1.0)

    options = ProcessOptions.from_args(args)
    sgemm = measure_sgemm_peak(args.sgemm_size, options)
    if sgemm is not None:
        print(f"sgemm peak ({sgemm['size']}^3, {sgemm['threads']} threads): {sgemm['gflops']:.1f} GFLOP/s")
    bandwidth = measure_bandwidth(args.bandwidth_gib, options, allocator=args.allocator)
    if bandwidth is not None:
        print(
            f"copy bandwidth ({bandwidth['copy_gib']:g} GiB, {bandwidth['threads']} threads): "
            f"{bandwidth['copy_gbps']:.1f} GB/s"
        )
    args.count_ops = sgemm is not None and bandwidth is not None
    launch_point = launcher(run_point, args, [*POINT_SETTINGS, "config"])

    def run(base: dict) -> dict:
        return roofline.add_roofline(add_throughput(launch_point(base), args, sgemm), sgemm, bandwidth)

    types = args.types or benchmark_types()
    points = [
        {"type": t, "length": n, "mode": m} for m in args.modes for t in types for n in sorted(args.lengths)
    ]
    records = sweep(points, run, lambda p: (p["type"], p["mode"]), desc="attention benchmark")
    meta = {
        **attention_meta(args),
        "bench_configs": bench_configs(),
        "sgemm": sgemm,
        "bandwidth": bandwidth,
        "allocator": args.allocator,
        "flop_convention": flops.CONVENTION,
        "graph_degree": args.graph_degree,
        "plugins": args.plugin,
    }
    plots = time_and_memory_plots(functools.partial(plot_metric, records))
    counted = [r for r in records if r["status"] == "ok" and r.get("roofline")]
    if counted:
        plots["roofline.png"] = functools.partial(plot_roofline, counted)
    return write_report(
        args.out, {"meta": meta, "records": records}, summarize(records, args.modes, sgemm, bandwidth), plots
    )


if __name__ == "__main__":
    main()
