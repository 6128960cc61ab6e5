"""GPU benchmark: every text attention type against exact sdpa (FlashAttention backend) on one CUDA GPU.

Forward + backward of the attention core alone, bfloat16, batch 1, 8 heads x 64, n = 4k .. 64k tokens,
every type with its benchmark settings (``benchmarks.mechanisms``; ``implementation="auto"``, so the
structured types run on FlexAttention). All points run in one process (the CUDA caching allocator's peak
counter is reset per point, so no fresh process is needed for memory) with CUDA events for time:

    python -m benchmarks.gpu --out benchmarks/results/reference/gpu
    python -m benchmarks.gpu --causal --out benchmarks/results/reference/gpu/causal
    python -m benchmarks.gpu --model_step --out benchmarks/results/reference/gpu/model_step
    python -m benchmarks.gpu --generation --out benchmarks/results/reference/gpu/generation
    python -m benchmarks.gpu --dry-run --out /tmp/gpu_dry   # CPU, tiny sizes: the same code paths
    python -m benchmarks.gpu --dry-run --every_kind --out /tmp/gpu_dry   # the four kinds, one process

``--causal`` measures the causal forms (every type with one, exact attention through sdpa's causal kernel)
beside flash-linear-attention's chunked Triton kernels, the peers the causal kernelised types are held to
(``fla_*``, where the ``fla`` package imports; same sizes: elu + 1 features of 64 dimensions for ``linear``,
256 for ``performer``, and RFA's 2 x 128 sin/cos features with a per-token gate, fla's ``chunk_simple_gla``).
On CUDA the first length of every type also runs once under ``torch.cuda.set_sync_debug_mode("warn")``:
``host_syncs`` counts the host-device synchronisations of one forward + backward (0: none).

``--generation`` times one decoding step of ``benchmarks.generation``'s causal LM (cast to bfloat16) after
prompts of 1k-64k tokens: the per-token latency a recurrent cache keeps flat.

``--model_step`` times a whole training step of the text model instead (``benchmarks.step_models``: the
4-layer, hidden-256 MLM encoder, 4 heads of 64, BERT's vocabulary; forward under bfloat16 autocast, backward,
``torch.optim.AdamW``): tokens/s, the ratio to exact attention's (``full_sdpa``) and the model FLOPs
utilisation against the GPU's dense bfloat16 peak (``DENSE_BF16_PEAK_TFLOPS``; none for an unknown GPU).

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
import sys
import time
from pathlib import Path

import torch

import hf_efficient
from hf_efficient.attention import AttentionSpec, build_attention, get_attention_class
from hf_efficient.markdown import markdown_table

from . import harness
from .mechanisms import benchmark_config
from .report import (
    length_panel,
    plot_loglog,
    status_cell,
    time_and_memory_plots,
    write_report,
)

BASELINE = "full"  # exact attention through transformers' sdpa, FlashAttention on CUDA in bfloat16
BIASED = ("full_bias_sdpa", "full_bias_flex")  # exact attention with a dense per-head bias (Graphormer)
# Other settings of a registered type, measured beside its benchmark settings: BigBird with blocks of
# FlexAttention's 128 tokens (the layout's blocks are then whole flex blocks, no token-level mask).
# And the kernelised types on their chunked CPU engine (what "auto" took on CUDA before the parallel one);
# the types whose CPU kernels lose on the GPU (host-bound tiles and chunks) through their plain-ops reference,
# a candidate GPU path (whole-sequence tensors; it may run out of memory at the longest lengths).
VARIANTS = {
    "bigbird_block128": ("bigbird", {"block_size": 128}),
    "linear_chunked": ("linear", {"implementation": "chunked"}),
    "performer_chunked": ("performer", {"implementation": "chunked"}),
    "reformer_lsh_reference": ("reformer_lsh", {"implementation": "reference"}),
    "long_short_reference": ("long_short", {"implementation": "reference"}),
}
# The causal kernelised types forced onto the `gpu` extra's fla kernel (attention/kernels/fla.py), measured in
# the causal run beside their own engine and fla's bare ops (FLA_PEERS): should "auto" take it on CUDA?
CAUSAL_VARIANTS = {
    "linear_fla": ("linear", {"implementation": "fla"}),
    "performer_fla": ("performer", {"implementation": "fla"}),
    "rfa_fla": ("rfa", {"implementation": "fla"}),
}
# flash-linear-attention's kernels at our causal kernelised types' sizes: (our type, feature dims, gated)
FLA_PEERS = {
    "fla_linear_attn": ("linear", 64, False),
    "fla_linear_attn_256": ("performer", 256, False),
    "fla_simple_gla_256": ("rfa", 256, True),
}
MODEL_STEP_TYPES = ["full_sdpa", "linear", "performer", "rfa", "linformer", "nystromformer", "longformer"]
# lengths of the model-level kinds (the core and causal runs: GPU_SETTINGS')
KIND_LENGTHS = {"model_step": [4096, 16384, 65536], "generation": [1024, 4096, 16384, 65536]}
GENERATION_REPEATS = 20  # timed decoding steps per context
# dense (no sparsity) bfloat16 tensor-core peaks of the SXM parts, TFLOP/s, from NVIDIA's data sheets
DENSE_BF16_PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0}
GPU_SETTINGS = dict(lengths=[4096, 8192, 16384, 32768, 65536], heads=8, head_dim=64, warmup=2, repeats=5)
# the dry run checks the code paths: one length, the smallest that spans several blocks / chunks; two for
# generation, whose summary compares the cache across context lengths
DRY_SETTINGS = dict(lengths=[256], heads=2, head_dim=16, warmup=1, repeats=1)
DRY_KIND_LENGTHS = {"generation": [256, 512]}


def default_types(kind: str = "core") -> list[str]:
    """Every registered type that runs on a plain sequence, exact attention first, then the biased pair; for
    the ``causal`` kind the types with a causal form, then flash-linear-attention's peers; for
    ``model_step`` ``MODEL_STEP_TYPES``; for ``generation`` the causal types, exact attention (sdpa) first."""
    usable = [t for t in hf_efficient.list_attention_types("text") if t != BASELINE]
    if kind == "model_step":
        return list(MODEL_STEP_TYPES)
    if kind == "generation":
        from .generation import causal_benchmark_types

        return causal_benchmark_types()
    if kind == "causal":
        causal_types = [t for t in usable if get_attention_class(t).capabilities.causal]
        variants = [
            name for name, (base, _) in {**VARIANTS, **CAUSAL_VARIANTS}.items() if base in causal_types
        ]
        return [BASELINE, *causal_types, *variants, *FLA_PEERS]
    return [BASELINE, *usable, *VARIANTS, *BIASED]


def fla_point(name: str, n: int, heads: int, head_dim: int, device: str, dtype: torch.dtype):
    """(call, None, mode) for flash-linear-attention's chunked causal kernel at one of ``FLA_PEERS``' sizes:
    features made inside the call as ours are (elu + 1 of the inputs; the gate's log-sigmoid), so the time
    covers the same work. Raises ImportError where fla is not installed (recorded, the sweep goes on)."""
    from fla.ops.linear_attn import chunk_linear_attn  # optional: the device check carries it
    from fla.ops.simple_gla import chunk_simple_gla

    _, features, gated = FLA_PEERS[name]
    q, k = (torch.randn(1, n, heads, features, device=device, dtype=dtype, requires_grad=True) for _ in "qk")
    v = torch.randn(1, n, heads, head_dim, device=device, dtype=dtype, requires_grad=True)
    gate = torch.randn(1, n, heads, device=device, dtype=torch.float32, requires_grad=True)
    grad = torch.randn(1, n, heads, head_dim, device=device, dtype=dtype)

    def call():
        phi_q, phi_k = (torch.nn.functional.elu(t) + 1 for t in (q, k))
        if gated:  # RFA: S_t = g_t S_{t-1} + (1 - g_t) phi(k_t) v_t^T, normalised by fla's z in ours
            log_gate = torch.nn.functional.logsigmoid(gate)
            out, _ = chunk_simple_gla(
                phi_q, phi_k * (1 - log_gate.exp())[..., None].to(dtype), v, g=log_gate, scale=1.0
            )
        else:
            out, _ = chunk_linear_attn(phi_q, phi_k, v, scale=1.0, normalize=True)
        out.backward(grad)

    return call, None, "fwd_bwd", {}


def model_step_point(name: str, n: int, device: str, dtype: torch.dtype, dry_run: bool):
    """(call, the step's model FLOPs or None, mode) for one training step of the text model (module
    docstring); the dry run takes ``benchmarks.model_step``'s smoke sizes."""
    import argparse

    from . import step_models
    from .model_step import SMOKE_MODEL

    sizes = SMOKE_MODEL if dry_run else step_models.MODEL
    point = argparse.Namespace(
        encoder="text", type=name, config=None, model=json.dumps(sizes), batch=1, length=n, hidden_dropout=0.1
    )
    model, batch, (_, _, attention_config) = step_models.model_and_batch(point)
    flops = step_models.step_flops(model, batch, point, attention_config)  # forward + backward
    model, batch = model.to(device), {key: value.to(device) for key, value in batch.items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def call():
        with torch.autocast(device, dtype=dtype):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return call, None if None in flops.values() else sum(flops.values()), "train_step", {}


def generation_point(name: str, n: int, device: str, dtype: torch.dtype, dry_run: bool):
    """(call, None, mode, fields) for one decoding step of ``benchmarks.generation``'s causal LM (cast to
    ``dtype``) after a prompt of n random tokens: ``call`` decodes one greedy token from the cache the
    prompt left; ``fields`` hold the prompt's time and the cache's size, as ``benchmarks.generation``
    reports them."""
    from hf_efficient import EfficientBertForCausalLM

    from . import generation
    from .mechanisms import build_model

    sizes = generation.PRESETS["smoke" if dry_run else "full"]["model"]
    model, (_, _, attention_config) = build_model(
        EfficientBertForCausalLM, name, None, **sizes, is_decoder=True, max_position_embeddings=n + 64
    )
    model = model.to(device=device, dtype=dtype).eval()
    prompt = torch.randint(5, model.config.vocab_size, (1, n), device=device)  # clear of the special ids
    with torch.inference_mode():
        start = time.perf_counter()
        out = model(prompt, logits_to_keep=1)  # generate()'s prefill: builds the cache
        if device == "cuda":
            torch.cuda.synchronize()
        prefill_s = time.perf_counter() - start
    cache, token = out.cache, out.logits[:, -1:].argmax(-1)  # token: (1, 1)
    fields = dict(prefill_s=prefill_s, cache_mib=cache.nbytes / 2**20, config=attention_config)

    def call():
        nonlocal token
        with torch.inference_mode():
            token = model(token, cache=cache).logits[:, -1:].argmax(-1)

    return call, None, "decode_step", fields


def build_point(
    name: str, n: int, heads: int, head_dim: int, device: str, dtype: torch.dtype, kind: str = "core"
):
    """(call, FLOPs of one call or None, mode) for one (type, length) point of the ``kind`` of run:
    ``core``, ``causal`` (the causal form) or ``model_step``.

    On CUDA every point is forward + backward. On the CPU (dry run) the FlexAttention paths run forward
    only (FlexAttention has no CPU backward): forced with ``implementation="flex"``, so the dry run goes
    through the same code as the GPU run."""
    if kind == "model_step":
        return model_step_point(name, n, device, dtype, dry_run=device == "cpu")
    if kind == "generation":
        return generation_point(name, n, device, dtype, dry_run=device == "cpu")
    if name in FLA_PEERS:
        return fla_point(name, n, heads, head_dim, device, dtype)
    causal = kind == "causal"
    base, overrides = {**VARIANTS, **CAUSAL_VARIANTS}.get(name, (BASELINE if name in BIASED else name, {}))
    cls = get_attention_class(base)
    kernel = "flex_attention" if name == "full_bias_flex" else "sdpa"
    spec = AttentionSpec(heads, head_dim, attn_implementation=kernel, max_seq_len=n, causal=causal)
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
            out = core(q, q if shared else k, v, attention_bias=bias, is_causal=causal).output
        if not forward_only:
            out.backward(grad)

    flops = cls.forward_flops(n, head_dim, core.config)
    factor = 1.0 if forward_only else 3.0
    mode = "fwd" if forward_only else "fwd_bwd"
    return call, None if flops is None else factor * heads * flops, mode, {}


def measure(call, device: str, warmup: int, repeats: int) -> tuple[list[float], float | None, list[float]]:
    """Seconds of each timed call (CUDA events on a GPU; on the CPU :func:`benchmarks.harness.measure`'s
    times), the peak memory above the inputs, MiB (None on the CPU), and on a GPU the host's seconds to
    issue each call (its Python and launches, and any wait for the device inside it): close to the call's
    time, the call is bound by the host, not by the GPU."""
    if device != "cuda":
        return harness.measure(call, warmup, repeats).times_s, None, []
    for _ in range(warmup):  # first calls compile FlexAttention kernels
        call()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    times, host = [], []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        issued = time.perf_counter()
        call()
        host.append(time.perf_counter() - issued)
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return times, (torch.cuda.max_memory_allocated() - before) / 2**20, host


def run(
    meta, lengths, heads, head_dim, warmup, repeats, device, dtype, slow_s, budget_s, out, kind="core"
) -> list[dict]:
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
                sync_check = device == "cuda" and n == lengths[0]
                point = (name, n, heads, head_dim, warmup, repeats, device, dtype, kind, sync_check)
                record.update(measure_point(*point))
                if record["status"] != "ok":
                    stopped[name] = f"{record['status']} at n={n}"
                elif record["median_s"] > slow_s:
                    stopped[name] = f"slower than {slow_s} s at n={n}"
            records.append(record)
            print(json.dumps(record), flush=True)
            save_partial(out, meta, records)
    return records


def measure_point(name, n, heads, head_dim, warmup, repeats, device, dtype, kind, sync_check) -> dict:
    syncs = {}
    try:
        call, flops, mode, fields = build_point(name, n, heads, head_dim, device, dtype, kind)
        times, peak, host = measure(call, device, warmup, repeats)
        if host:
            fields = dict(fields, host_s=statistics.median(host))
        if sync_check:
            syncs = count_host_syncs(call)
    except torch.cuda.OutOfMemoryError:
        return dict(status="oom")
    except Exception as error:  # recorded, and the sweep goes on with the other types
        return dict(status="error", error=f"{type(error).__name__}: {str(error)[:300]}")
    finally:
        if device == "cuda":
            torch.cuda.empty_cache()
    median = statistics.median(times)
    flops = None if kind == "causal" else flops  # the FLOP models count the non-causal form
    tflops = None if flops is None else flops / median / 1e12
    return dict(
        status="ok", mode=mode, median_s=median, times_s=times, peak_mib=peak, flops=flops, tflops=tflops,
        **syncs, **fields,
    )  # fmt: skip


def count_host_syncs(call) -> dict:
    """host_syncs: how many host-device synchronisations one call makes (CUDA's sync debug mode warns at
    each), and where the first one came from."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        except Exception as error:  # the timing stands; say why the count is missing
            return dict(host_syncs=None, first_sync=f"check failed: {type(error).__name__}: {error}"[:200])
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    first = f"{syncs[0].filename}:{syncs[0].lineno}" if syncs else None
    return dict(host_syncs=len(syncs), first_sync=first)


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
                f"{1e3 * r['host_s']:.2f}" if r.get("host_s") is not None else "-",
                str(r.get("host_syncs", "")),
                note,
            ]
        )
    header = [
        "type",
        "n",
        "time (ms)",
        "x sdpa",
        "TFLOP/s",
        "sdpa TFLOP/s",
        "peak MiB",
        "host ms",
        "host syncs",
    ]
    header.append("note")
    intro = [
        f"# GPU benchmark: {meta.get('gpu') or meta.get('cpu')}",
        "",
        f"forward + backward of the core, {first.get('dtype', '')}, batch 1, {first.get('heads', '')} heads "
        f"x {first.get('head_dim', '')}; x sdpa = sdpa's time / this type's (above 1: faster than exact "
        "attention); TFLOP/s per useful FLOP (the registry's FLOP model: the pairs of the mechanism's "
        "pattern, fwd + bwd = 3 x fwd); host ms: the host's time to issue the call (near the call's time: "
        "bound by the host's per-op work, not the GPU).",
        "",
    ]
    return "\n".join(intro + markdown_table(header, rows) + peer_table(records))


def peer_table(records: list[dict]) -> list[str]:
    """Each of ``FLA_PEERS`` against our type of its sizes: fla's time / ours (1 or more: ours is as fast)."""
    ok = {(r["type"], r["length"]): r["median_s"] for r in records if r["status"] == "ok"}
    rows = [
        [
            ours,
            peer,
            str(n),
            f"{1e3 * ok[ours, n]:.2f}",
            f"{1e3 * ok[peer, n]:.2f}",
            f"{ok[peer, n] / ok[ours, n]:.2f}",
        ]
        for peer, (ours, _, _) in FLA_PEERS.items()
        for n in sorted({r["length"] for r in records})
        if (ours, n) in ok and (peer, n) in ok
    ]
    if not rows:
        return []
    header = ["ours", "flash-linear-attention", "n", "ours (ms)", "fla (ms)", "fla time / ours"]
    return ["", "## Against flash-linear-attention's kernels", "", *markdown_table(header, rows)]


def summarize_model_step(records: list[dict], meta: dict) -> str:
    """Markdown: per type and length, the step's time, tokens/s and its ratio to exact attention's, MFU
    against the GPU's dense bfloat16 peak and peak memory."""
    baseline = MODEL_STEP_TYPES[0]
    base = {r["length"]: r for r in records if r["type"] == baseline and r["status"] == "ok"}
    gpu = meta.get("gpu") or ""
    peak = next((tflops for name, tflops in DENSE_BF16_PEAK_TFLOPS.items() if name in gpu), None)
    rows = []
    for r in sorted(records, key=lambda r: (r["type"] != baseline, r["type"], r["length"])):
        ref = base.get(r["length"])
        mfu = None if peak is None or r.get("tflops") is None else 100 * r["tflops"] / peak
        rows.append(
            [
                r["type"],
                str(r["length"]),
                status_cell(r, lambda r: f"{1e3 * r['median_s']:.1f}"),
                status_cell(r, lambda r: f"{r['length'] / r['median_s']:,.0f}"),
                status_cell(r, lambda r, ref=ref: f"{ref['median_s'] / r['median_s']:.2f}" if ref else "-"),
                status_cell(r, lambda r, mfu=mfu: "-" if mfu is None else f"{mfu:.1f}"),
                status_cell(r, lambda r: f"{r['peak_mib']:.0f}" if r.get("peak_mib") is not None else "-"),
                r.get("reason") or r.get("error") or "",
            ]
        )
    header = ["type", "n", "step (ms)", "tokens/s", f"x {baseline}", "MFU %", "peak MiB", "note"]
    intro = [
        f"# GPU training step of the text model: {gpu or meta.get('cpu')}",
        "",
        "4 layers, hidden 256, 4 heads of 64, BERT's vocabulary, batch 1; forward under bfloat16 autocast, "
        f"backward, AdamW. MFU: model FLOPs per second over the dense bfloat16 peak ({peak or '-'} TFLOP/s).",
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
    kinds = parser.add_mutually_exclusive_group()
    kinds.add_argument("--causal", action="store_true", help="The causal forms, beside fla's kernels.")
    kinds.add_argument("--model_step", action="store_true", help="Whole training steps of the text model.")
    kinds.add_argument(
        "--generation", action="store_true", help="Per-token decoding latency against context."
    )
    parser.add_argument("--slow_s", type=float, default=2.0, help="A point slower than this ends its type.")
    parser.add_argument("--budget_s", type=float, default=300.0, help="No new point after this many seconds.")
    parser.add_argument(
        "--every_kind",
        action="store_true",
        help="With --dry-run: the four kinds one after another in this process, into --out and its causal/, "
        "model_step/ and generation/ folders, as gpu_check.sh lays them out (on a GPU it runs each kind in "
        "its own process under its own time limit).",
    )
    args = parser.parse_args(argv)
    if args.every_kind:
        if not args.dry_run:
            parser.error("--every_kind is the dry run's: add --dry-run (a GPU run is one kind a process)")
        if args.causal or args.model_step or args.generation:
            parser.error("--every_kind runs every kind: drop --causal / --model_step / --generation")
        rest = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--every_kind"]
        kinds = {"core": [], "causal": ["--causal"], "model_step": ["--model_step"]}
        kinds["generation"] = ["--generation"]
        results = {}
        for kind, flag in kinds.items():  # the last --out given wins: each kind's folder
            out = args.out if kind == "core" else args.out / kind
            results[kind] = main([*rest, "--out", str(out), *flag])
        return results
    settings = dict(DRY_SETTINGS if args.dry_run else GPU_SETTINGS)
    if args.lengths:
        settings["lengths"] = args.lengths
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("benchmarks.gpu needs a CUDA GPU; use --dry-run on a CPU.")
    kinds = {"causal": args.causal, "model_step": args.model_step, "generation": args.generation}
    kind = next((name for name, chosen in kinds.items() if chosen), "core")
    if kind in KIND_LENGTHS and not args.lengths and not args.dry_run:
        settings["lengths"] = KIND_LENGTHS[kind]
    if kind in DRY_KIND_LENGTHS and not args.lengths and args.dry_run:
        settings["lengths"] = DRY_KIND_LENGTHS[kind]
    if kind == "generation" and not args.dry_run:
        settings["repeats"] = GENERATION_REPEATS
    meta = dict(machine(device), settings=settings, kind=kind)
    meta["types"] = args.types or default_types(kind)
    records = run(
        meta,
        device=device,
        dtype=torch.bfloat16,
        slow_s=args.slow_s,
        budget_s=args.budget_s,
        out=args.out,
        kind=kind,
        **settings,
    )
    if kind == "generation":
        from . import generation

        model = generation.PRESETS["smoke" if args.dry_run else "full"]["model"]
        threads = torch.get_num_threads()
        summary = generation.summarize(
            records, dict(meta, model=model, repeats=settings["repeats"], threads=threads)
        )
    else:
        summary = (summarize_model_step if kind == "model_step" else summarize)(records, meta)
    return write_report(args.out, {"meta": meta, "records": records}, summary, plots(records))


if __name__ == "__main__":
    main()
