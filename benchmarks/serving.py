"""Serving latency of a MiniLM-sized text encoder: eager PyTorch, ``torch.compile`` and ONNX Runtime.

The model is an ``EfficientBertModel`` of all-MiniLM-L6-v2's sizes (6 layers, hidden 384, 12 heads of 32,
intermediate 1536, vocab 30,522) with ``max_position_embeddings`` = the longest length, random weights
(seed 0, the same in every engine), in eval mode. One call encodes a batch of one sequence of n random
token ids (no padding, as a served request; ``attention_mask`` all ones) and returns the last hidden state
and the pooled output. Engines:

* ``eager``: ``model(...)`` under ``torch.inference_mode()``;
* ``compile``: ``torch.compile(model)`` (inductor, static shapes; the first call compiles, untimed, and its
  time is recorded as ``compile_s``);
* ``onnxruntime``: the ONNX file ``hf_efficient.export`` writes (one per type, exported once into
  ``--onnx_dir``, a temporary folder by default, and reused for every length: the sequence length is
  dynamic), in an ONNX Runtime CPU session with ``--threads`` intra-op threads (``export_s`` records the
  export).

Each point runs in a fresh process (``benchmarks.harness``): peak memory is the process's peak resident
size during the timed calls minus its size before them. Outputs of ``compile`` and ``onnxruntime`` are
compared with eager on the point's own input up to 2048 tokens (``max_abs_diff``). At ``--profile_length``
the eager and ONNX Runtime points also record where their time goes (the torch profiler's and ONNX
Runtime's profile: the top operators by total time), which the summary lists. Speed-ups in the summary are
against eager at the same type and length, measured in the same run.

    python -m benchmarks.serving --threads 2                  # full + four efficient types, n = 512 .. 16384
    python -m benchmarks.serving --types longformer --engines eager onnxruntime --lengths 4096
    python -m benchmarks.serving --preset smoke               # tiny, for tests

Writes ``<out>/results.json``, ``<out>/summary.md``, ``<out>/latency.png`` and ``<out>/memory.png``.
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
from pathlib import Path

from benchmarks import mechanisms
from benchmarks.harness import (
    add_point_arguments,
    benchmark_parser,
    cpu_meta,
    fill_from_preset,
    launcher,
    measure,
    package_version,
    set_up_torch,
    sweep,
)
from benchmarks.plugins import parse_args_with_plugins
from benchmarks.report import length_panel, plot_loglog, status_cell, write_report
from hf_efficient.markdown import markdown_table

MINILM = dict(
    num_hidden_layers=6, hidden_size=384, num_attention_heads=12, intermediate_size=1536, vocab_size=30522
)
ENGINES = ("eager", "compile", "onnxruntime")
TYPES = ("full_sdpa", "longformer", "bigbird", "performer", "nystromformer")
PRESETS = {
    "full": dict(lengths=[512, 2048, 4096, 8192, 16384], repeats=3, model=MINILM, profile_length=4096),
    "smoke": dict(
        lengths=[32, 64],
        repeats=1,
        model=dict(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=512
        ),
        profile_length=64,
    ),
}
COMPARE_UP_TO = 2048  # compare outputs with eager up to this length (one more eager call per point)
PROFILE_TOP = 8  # operators listed per profile
POINT_SETTINGS = "threads warmup repeats model max_length onnx_dir profile_length".split()


def build_model(point: argparse.Namespace):
    """The point's encoder (seed 0 weights) and its attention settings."""
    import torch

    from hf_efficient import EfficientBertModel

    torch.manual_seed(0)
    sizes = dict(json.loads(point.model), max_position_embeddings=point.max_length)
    model, (attention_type, _, attention_config) = mechanisms.build_model(
        EfficientBertModel, point.type, **sizes
    )
    return model.eval(), attention_type, attention_config


def onnx_file(model, point: argparse.Namespace) -> tuple[Path, float | None]:
    """The type's ONNX file in ``point.onnx_dir``, exported now if absent: (path, seconds the export took or
    None when it was there). Weights are seed 0 in every process, so one file serves every length."""
    from hf_efficient.export import export_onnx, export_program

    path = Path(point.onnx_dir) / f"{point.type}.onnx"
    if path.exists():
        return path, None
    start = time.perf_counter()
    export_onnx(export_program(model), path)
    return path, time.perf_counter() - start


def run_point(point: argparse.Namespace) -> dict:
    """Point function: one (type, engine, length) in this process."""
    import numpy as np
    import torch

    set_up_torch(point.threads)
    model, attention_type, attention_config = build_model(point)
    n = point.length
    inputs = {
        "input_ids": torch.randint(5, model.config.vocab_size, (1, n)),
        "attention_mask": torch.ones(1, n, dtype=torch.long),
        "token_type_ids": torch.zeros(1, n, dtype=torch.long),
    }
    extra, profile = {}, None
    if point.engine == "onnxruntime":
        from hf_efficient.onnx_runtime import OnnxRuntimeModel

        path, extra["export_s"] = onnx_file(model, point)
        session = OnnxRuntimeModel(path, threads=point.threads)

        def call():
            return session.run(**inputs)

        if n == point.profile_length:
            profile = onnxruntime_profile(path, inputs, point.threads)
    else:
        forward = model
        if point.engine == "compile":
            forward = torch.compile(model)
            start = time.perf_counter()
            with torch.inference_mode():
                forward(**inputs)
            extra["compile_s"] = time.perf_counter() - start

        def call():
            with torch.inference_mode():
                outputs = forward(**inputs)
            return {"last_hidden_state": outputs.last_hidden_state, "pooler_output": outputs.pooler_output}

        if point.engine == "eager" and n == point.profile_length:
            profile = torch_profile(call)
    timing = measure(call, point.warmup, point.repeats)
    if point.engine != "eager" and n <= COMPARE_UP_TO:
        got = call()
        with torch.inference_mode():
            want = model(**inputs)
        extra["max_abs_diff"] = max(
            float(np.abs(np.asarray(got[name]) - want[name].numpy()).max()) for name in got
        )
    return {
        "type": point.type,
        "engine": point.engine,
        "length": n,
        "attention_type": attention_type,
        "config": attention_config,
        **timing.fields(),
        "tokens_per_s": n / timing.median_s,
        "base_rss_mib": timing.base_mib,
        **extra,
        "profile": profile,
    }


def torch_profile(call) -> list[dict]:
    """The top operators of one eager call by total CPU time (the torch profiler, self time)."""
    from torch.profiler import profile

    call()  # warm
    with profile() as prof:
        call()
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in rows) or 1.0
    return [
        {
            "op": e.key,
            "ms": e.self_cpu_time_total / 1e3,
            "share": e.self_cpu_time_total / total,
            "calls": e.count,
        }
        for e in rows[:PROFILE_TOP]
    ]


def onnxruntime_profile(path: Path, inputs: dict, threads: int) -> list[dict]:
    """The top ONNX operator types of one call by total time (ONNX Runtime's own profile)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.enable_profiling = True
    options.profile_file_prefix = str(path.with_suffix("")) + "_profile"
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = {i.name: inputs[i.name].numpy() for i in session.get_inputs()}
    session.run(None, feeds)  # warm
    session.run(None, feeds)
    trace = Path(session.end_profiling())
    events = json.loads(trace.read_text())
    trace.unlink()
    times: dict[str, list] = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            op = event["args"]["op_name"]
            times.setdefault(op, [0.0, 0])
            times[op][0] += event["dur"] / 1e3  # microseconds -> ms (both calls)
            times[op][1] += 1
    total = sum(t for t, _ in times.values()) or 1.0
    ranked = sorted(times.items(), key=lambda item: item[1][0], reverse=True)
    return [
        {"op": op, "ms": t / 2, "share": t / total, "calls": count // 2}
        for op, (t, count) in ranked[:PROFILE_TOP]
    ]


def summarize(records: list[dict], meta: dict) -> str:
    """Markdown: latency per (type, engine) and length, speed-up against eager, peak memory; profiles."""
    by_point = {(r["type"], r["engine"], r["length"]): r for r in records}
    lengths = sorted({r["length"] for r in records})
    types = list(dict.fromkeys(r["type"] for r in records))
    engines = [e for e in ENGINES if any(r["engine"] == e for r in records)]

    def latency(r: dict) -> str:
        eager = by_point.get((r["type"], "eager", r["length"]))
        speed = ""
        if r["engine"] != "eager" and eager and eager["status"] == "ok":
            speed = f" (x{eager['median_s'] / r['median_s']:.2f})"
        return f"{r['median_s'] * 1e3:,.0f} ms{speed} / {r['peak_mib']:,.0f}"

    model = meta["model"]
    lines = [
        f"### inference, batch 1, {model['num_hidden_layers']} layers, hidden {model['hidden_size']}, "
        f"{model['num_attention_heads']} heads, {meta['threads']} threads: median latency (x speed-up vs "
        "eager) / peak MiB",
        "",
    ]
    rows = [
        [t, e, *(status_cell(by_point.get((t, e, n)), latency) for n in lengths)]
        for t in types
        for e in engines
    ]
    lines += markdown_table(["type", "engine", *(f"n={n}" for n in lengths)], rows)
    diffs = [r for r in records if r.get("max_abs_diff") is not None]
    if diffs:
        worst = max(diffs, key=lambda r: r["max_abs_diff"])
        lines += [
            "",
            f"Outputs against eager (up to n={COMPARE_UP_TO}): largest absolute difference "
            f"{worst['max_abs_diff']:.2e} ({worst['type']}, {worst['engine']}, n={worst['length']}).",
        ]
    extras = [(r, key) for r in records for key in ("compile_s", "export_s") if r.get(key)]
    if extras:
        lines += ["", "One-off costs: " + "; ".join(f"{r['type']} {key} {r[key]:.0f} s" for r, key in extras)]
    profiled = [r for r in records if r.get("profile")]
    for r in profiled:
        lines += [
            "",
            f"#### profile: {r['type']}, {r['engine']}, n={r['length']} (top operators by time)",
            "",
        ]
        cells = [[p["op"], f"{p['ms']:,.1f}", f"{p['share']:.0%}", str(p["calls"])] for p in r["profile"]]
        lines += markdown_table(["operator", "ms per call", "share", "calls"], cells)
    return "\n".join(lines)


def plot(records: list[dict], metric: str, label: str, path: Path) -> None:
    """``metric`` against n: one panel per engine, a line per type (exact attention dashed)."""
    types = list(dict.fromkeys(r["type"] for r in records))
    engines = [e for e in ENGINES if any(r["engine"] == e for r in records)]
    exact = {t for t in types if t.startswith("full")}
    series = {engine: {t: {"type": t, "engine": engine} for t in types} for engine in engines}
    panels = [length_panel(records, metric, engine, label, series[engine], exact) for engine in engines]
    plot_loglog(path, [panels], panel_size=(5, 4))


def make_parser() -> argparse.ArgumentParser:
    parser = benchmark_parser(__doc__, "serving", PRESETS)
    parser.add_argument("--types", nargs="+", default=list(TYPES), help="benchmark names (full_sdpa, ...)")
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--lengths", nargs="+", type=int)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--profile_length", type=int, help="length whose eager / ONNX Runtime points profile")
    parser.add_argument("--onnx_dir", type=Path, help="where the ONNX files go (default: a temporary folder)")
    add_point_arguments(parser, threads=2, memory_cap_gib=16.0, timeout=1800.0, plugins=False)
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = parse_args_with_plugins(make_parser, argv)
    preset = PRESETS[args.preset]
    fill_from_preset(args, {name: preset[name] for name in ("lengths", "repeats", "profile_length")})
    lengths, model = sorted(args.lengths), preset["model"]
    args.model, args.max_length = json.dumps(model), max(lengths)  # what every point builds
    # Every (type, engine, length) point in its own process, in order; a series stops at its first failure.
    bases = [{"type": t, "engine": e, "length": n} for t in args.types for e in args.engines for n in lengths]
    with tempfile.TemporaryDirectory(prefix="serving_onnx_") as scratch:  # ONNX files: large, not results
        onnx_dir = Path(args.onnx_dir or scratch)
        onnx_dir.mkdir(parents=True, exist_ok=True)
        args.onnx_dir = str(onnx_dir)
        run = launcher(run_point, args, POINT_SETTINGS)
        records = sweep(bases, run, lambda p: (p["type"], p["engine"]), desc="serving benchmark")
    meta = {
        **cpu_meta(args),
        "model": model,
        "max_position_embeddings": max(lengths),
        "batch": 1,
        "onnxruntime": package_version("onnxruntime"),
        "profile_length": args.profile_length,
    }
    plots = {
        "latency.png": functools.partial(plot, records, "median_s", "seconds per call"),
        "memory.png": functools.partial(plot, records, "peak_mib", "peak MiB"),
    }
    return write_report(args.out, {"meta": meta, "records": records}, summarize(records, meta), plots)


if __name__ == "__main__":
    main()
