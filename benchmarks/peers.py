"""Ours against peer implementations of the same mechanism, side by side in one run with the same sizes.

    python benchmarks/peers.py                                 # all mechanisms, n = 1k 4k 16k, fwd, fwd+bwd
    python benchmarks/peers.py --lengths 512 1024 --repeats 1  # quick
    python benchmarks/peers.py --mechanisms longformer bigbird --modes fwd_bwd

Peers (installed by the ``bench`` extra, after torch; a peer that is not installed is skipped with a message):
    performer      performer-pytorch ``FastAttention`` (FAVOR+, the same number of orthogonal features)
    linformer      linformer ``LinformerSelfAttention`` (the same k, E and F shared by the heads)
    nystromformer  nystrom-attention ``NystromAttention``; transformers ``NystromformerSelfAttention``
    longformer     local-attention ``LocalAttention`` (exact |i - j| <= w/2 window, no globals);
                   transformers ``LongformerSelfAttention`` (sliding chunks, no global tokens)
    bigbird        transformers ``BigBirdBlockSparseAttention`` (block_sparse: 3 window, 2 global, r random)
    reformer_lsh   reformer-pytorch ``LSHAttention``; transformers ``LSHSelfAttention``

What is measured: the attention core only, on both sides. Our core takes projected heads; where a peer is a
layer with its own q/k/v (and output) projections, those modules are replaced by pass-through modules that
hand it the same random q, k, v (and an identity output projection), so no projection GEMM is timed on
either side and nothing is added to ours. A pass-through returns the given tensor itself, or a copy where the
peer divides it in place (transformers' Longformer query), which costs one (n x h d) copy, not a GEMM.
Every (mechanism, implementation, length, mode) point runs in a fresh process with the timing and
peak-memory helpers of ``benchmarks/attention.py`` (ours through its very point runner): float32, median of
--repeats after --warmup, peak memory = peak RSS during the calls minus RSS before them (inputs allocated).
The settings of both sides come from our core's config (attention.py's BENCH_CONFIGS over the defaults);
where a peer cannot be set to the same thing, the record's ``note`` and the summary say what differs.

Writes ``<out>/results.json``, ``<out>/time.png`` (time vs n, ours solid, peers dashed, one panel per
mechanism and mode), ``<out>/memory.png`` and ``<out>/summary.md`` (ratios ours / peer of time and memory).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))  # attention.py, flops.py, also when imported
import flops  # noqa: E402
from attention import BENCH_CONFIGS, attention_meta, cap_address_space, measure, run_point, run_worker  # noqa: E402

MECHANISMS = ["performer", "linformer", "nystromformer", "longformer", "bigbird", "reformer_lsh"]
PROJECTIONS_NOTE = (
    "core only on both sides: the peers' q/k/v/output projections are replaced by pass-through modules fed "
    "the same q, k, v; nothing is added to ours"
)


def our_settings(mechanism: str) -> dict:
    """Our core's full config for the comparison: defaults with attention.py's BENCH_CONFIGS applied."""
    return flops.resolved_config(mechanism, BENCH_CONFIGS.get(mechanism, {}))


# ---- inputs -----------------------------------------------------------------------------------------------
def _leaf(t, grad: bool):
    return t.detach().contiguous().requires_grad_(grad)


def _heads(b, h, n, d, grad):
    """q, k, v as (b, h, n, d) leaves: what our core gets."""
    import torch

    return [_leaf(torch.randn(b, h, n, d), grad) for _ in range(3)]


def _tokens(b, h, n, d, grad, seq_first: bool = False):
    """q, k, v as (b, n, h d) leaves ((n, b, h d) if seq_first): what a projection Linear would return."""
    import torch

    shape = (n, b, h * d) if seq_first else (b, n, h * d)
    return [_leaf(torch.randn(*shape), grad) for _ in range(3)]


def _given(tensor, copy: bool = False):
    """A module standing in for a peer's projection: returns ``tensor`` (a copy if the peer edits it)."""
    from torch import nn

    class Given(nn.Module):
        def forward(self, hidden):
            return tensor.clone() if copy else tensor

    return Given()


# ---- the peers --------------------------------------------------------------------------------------------
# A builder takes (settings, b, h, n, d, grad), returns (forward: () -> output tensor, leaves, output shape).
Built = tuple[Callable, list, tuple]


def build_performer_pytorch(s, b, h, n, d, grad) -> Built:
    from performer_pytorch import FastAttention
    from torch import nn

    relu = s["kernel"] == "relu"
    attn = FastAttention(
        dim_heads=d,
        nb_features=s["num_features"],
        ortho_scaling=0,  # rows with chi_d norms, as ours ("regular" scaling)
        causal=False,
        generalized_attention=relu,
        kernel_fn=nn.ReLU(),
    ).eval()
    q, k, v = _heads(b, h, n, d, grad)
    return (lambda: attn(q, k, v)), [q, k, v], (b, h, n, d)


def build_linformer(s, b, h, n, d, grad) -> Built:
    from linformer import LinformerSelfAttention
    from torch import nn

    attn = LinformerSelfAttention(
        dim=h * d, seq_len=n, k=s["projected_length"], heads=h, dim_head=d, share_kv=False
    ).eval()
    if s["sharing"] in ("key_value", "layerwise"):
        attn.proj_v = attn.proj_k  # E = F (its share_kv would also make the values equal the keys)
    q, k, v = _tokens(b, h, n, d, grad)
    attn.to_q, attn.to_k, attn.to_v, attn.to_out = _given(q), _given(k), _given(v), nn.Identity()
    hidden = q.new_zeros(b, n, h * d)
    return (lambda: attn(hidden)), [q, k, v], (b, n, h * d)


def build_nystrom_attention(s, b, h, n, d, grad) -> Built:
    import torch
    from nystrom_attention import NystromAttention
    from torch import nn

    conv = s["conv_kernel_size"]
    attn = NystromAttention(
        dim=h * d,
        dim_head=d,
        heads=h,
        num_landmarks=s["num_landmarks"],
        pinv_iterations=s["pinv_iterations"],
        residual=conv is not None,
        residual_conv_kernel=conv or 33,
    ).eval()
    attn.to_qkv, attn.to_out = nn.Identity(), nn.Identity()  # its input is then [q | k | v]
    qkv = _leaf(torch.randn(b, n, 3 * h * d), grad)
    return (lambda: attn(qkv)), [qkv], (b, n, h * d)


def build_hf_nystromformer(s, b, h, n, d, grad) -> Built:
    from transformers import NystromformerConfig
    from transformers.models.nystromformer.modeling_nystromformer import NystromformerSelfAttention

    config = NystromformerConfig(
        hidden_size=h * d,
        num_attention_heads=h,
        num_landmarks=s["num_landmarks"],
        segment_means_seq_len=n,
        conv_kernel_size=s["conv_kernel_size"] or 65,  # its config wants an int: the conv is dropped below
        attention_probs_dropout_prob=0.0,
    )
    attn = NystromformerSelfAttention(config).eval()
    if s["conv_kernel_size"] is None:
        attn.conv_kernel_size, attn.conv = None, None
    q, k, v = _tokens(b, h, n, d, grad)
    attn.query, attn.key, attn.value = _given(q), _given(k), _given(v)
    hidden = q.new_zeros(b, n, h * d)
    return (lambda: attn(hidden)[0]), [q, k, v], (b, n, h * d)


def build_local_attention(s, b, h, n, d, grad) -> Built:
    from local_attention import LocalAttention

    attn = LocalAttention(
        window_size=s["attention_window"] // 2,  # buckets of w/2; each sees itself and one on each side
        causal=False,
        look_backward=1,
        look_forward=1,
        exact_windowsize=True,  # masked to |i - j| <= w/2, our band
        autopad=True,
    ).eval()
    q, k, v = _heads(b, h, n, d, grad)
    return (lambda: attn(q, k, v)), [q, k, v], (b, h, n, d)


def build_hf_longformer(s, b, h, n, d, grad) -> Built:
    import torch
    from transformers import LongformerConfig
    from transformers.models.longformer.modeling_longformer import LongformerSelfAttention

    config = LongformerConfig(
        hidden_size=h * d,
        num_attention_heads=h,
        attention_window=[s["attention_window"]],
        attention_probs_dropout_prob=0.0,
    )
    attn = LongformerSelfAttention(config, layer_id=0).eval()
    q, k, v = _tokens(b, h, n, d, grad, seq_first=True)  # it projects hidden_states.transpose(0, 1)
    attn.query, attn.key, attn.value = _given(q, copy=True), _given(k), _given(v)  # query /= sqrt(d) in place
    hidden = q.new_zeros(b, n, h * d)
    local = torch.zeros(b, n)  # LongformerModel's mask: 0 = local attention
    no = torch.zeros(b, n, dtype=torch.bool)

    def forward():
        return attn(
            hidden, attention_mask=local, is_index_masked=no, is_index_global_attn=no, is_global_attn=False
        )[0]

    return forward, [q, k, v], (b, n, h * d)


def build_hf_bigbird(s, b, h, n, d, grad) -> Built:
    import torch
    from transformers import BigBirdConfig
    from transformers.models.big_bird.modeling_big_bird import BigBirdBlockSparseAttention, BigBirdModel

    bs = s["block_size"]
    config = BigBirdConfig(
        hidden_size=h * d,
        num_attention_heads=h,
        attention_type="block_sparse",
        block_size=bs,
        num_random_blocks=s["num_random_blocks"],
        max_position_embeddings=n,
        attention_probs_dropout_prob=0.0,
    )
    attn = BigBirdBlockSparseAttention(config, seed=0).eval()
    q, k, v = _tokens(b, h, n, d, grad)
    attn.query, attn.key, attn.value = _given(q), _given(k), _given(v)
    hidden = q.new_zeros(b, n, h * d)
    blocked, band, from_mask, to_mask = BigBirdModel.create_masks_for_block_sparse_attn(torch.ones(b, n), bs)

    def forward():
        return attn(
            hidden,
            band_mask=band,
            from_mask=from_mask,
            to_mask=to_mask,
            from_blocked_mask=blocked,
            to_blocked_mask=blocked,
        )[0]

    return forward, [q, k, v], (b, n, h * d)


def build_reformer_pytorch(s, b, h, n, d, grad) -> Built:
    import torch
    from reformer_pytorch import LSHAttention

    attn = LSHAttention(
        bucket_size=s["chunk_length"],
        n_hashes=s["num_hashes"],
        causal=False,
        allow_duplicate_attention=False,  # de-duplicate pairs seen in several rounds, as ours
        attend_across_buckets=False,  # mask keys of other buckets, as ours
    ).eval()
    qk, v = (_leaf(torch.randn(b * h, n, d), grad) for _ in range(2))  # heads folded into the batch
    return (lambda: attn(qk, v)[0]), [qk, v], (b * h, n, d)


def build_hf_reformer(s, b, h, n, d, grad) -> Built:
    from transformers import ReformerConfig
    from transformers.models.reformer.modeling_reformer import LSHSelfAttention

    from hf_efficient.attention import validate_attention_config
    from hf_efficient.attention.reformer_lsh import num_buckets

    config = ReformerConfig(
        hidden_size=h * d,
        num_attention_heads=h,
        attention_head_size=d,
        attn_layers=["lsh"],
        lsh_attn_chunk_length=s["chunk_length"],
        num_hashes=s["num_hashes"],
        num_buckets=num_buckets(n, validate_attention_config("reformer_lsh", s)),
        lsh_num_chunks_before=1,
        lsh_num_chunks_after=0,
        is_decoder=False,
        max_position_embeddings=n,
        lsh_attention_probs_dropout_prob=0.0,
    )
    attn = LSHSelfAttention(config).eval()
    qk, _, v = _tokens(b, h, n, d, grad)
    attn.query_key, attn.value = _given(qk), _given(v)
    hidden = qk.new_zeros(b, n, h * d)
    return (lambda: attn(hidden).hidden_states), [qk, v], (b, n, h * d)


# ---- what each peer can and cannot match -------------------------------------------------------------
def _needs(condition: bool, reason: str) -> str | None:
    return None if condition else reason


class Peer(NamedTuple):  # not a dataclass: this file is also loaded by path, outside sys.modules
    """A peer implementation of one of our mechanisms."""

    name: str
    mechanism: str
    modules: tuple[str, ...]  # importable modules it needs (checked before launching)
    distribution: str  # PyPI name, for the version
    build: Callable[..., Built]
    note: Callable[[dict], str]  # what differs from ours at these settings
    unsupported: Callable[[dict, int], str | None] = lambda s, n: None  # why length n cannot run, or None


PEERS = [
    Peer(
        "performer-pytorch",
        "performer",
        ("performer_pytorch", "einops"),
        "performer-pytorch",
        build_performer_pytorch,
        lambda s: f"FastAttention, {s['num_features']} orthogonal features, {s['kernel']} kernel; matches",
    ),
    Peer(
        "linformer",
        "linformer",
        ("linformer",),
        "linformer",
        build_linformer,
        lambda s: (
            f"LinformerSelfAttention, k={s['projected_length']}, E and F shared by the heads"
            + (
                "; per-head E, F ('none') not available in the peer"
                if s["sharing"] == "none"
                else "; matches"
            )
        ),
    ),
    Peer(
        "nystrom-attention",
        "nystromformer",
        ("nystrom_attention", "einops"),
        "nystrom-attention",
        build_nystrom_attention,
        lambda s: (
            f"NystromAttention, {s['num_landmarks']} landmarks, {s['pinv_iterations']} pinv steps, "
            + ("no residual conv; matches" if s["conv_kernel_size"] is None else "residual conv")
        ),
    ),
    Peer(
        "transformers NystromformerSelfAttention",
        "nystromformer",
        ("transformers",),
        "transformers",
        build_hf_nystromformer,
        lambda s: (
            f"{s['num_landmarks']} landmarks, pinv steps fixed at 6"
            + ("" if s["pinv_iterations"] == 6 else f" (ours {s['pinv_iterations']})")
            + "; Z0 scaled over the whole batch ('original')"
        ),
        lambda s, n: _needs(n % s["num_landmarks"] == 0, "needs n divisible by num_landmarks"),
    ),
    Peer(
        "local-attention",
        "longformer",
        ("local_attention", "einops"),
        "local-attention",
        build_local_attention,
        lambda s: (
            f"LocalAttention, exact window |i - j| <= {s['attention_window'] // 2}, no global tokens"
            + ("" if s["attention_dilation"] == 1 else "; no dilation in the peer")
            + ("; ours has no global tokens here either" if not s["global_token_indices"] else "")
        ),
        lambda s, n: _needs(s["attention_dilation"] == 1, "the peer has no dilation"),
    ),
    Peer(
        "transformers LongformerSelfAttention",
        "longformer",
        ("transformers",),
        "transformers",
        build_hf_longformer,
        lambda s: f"sliding chunks, attention_window={s['attention_window']}, no global tokens",
        lambda s, n: _needs(
            n % s["attention_window"] == 0 and s["attention_dilation"] == 1,
            "needs n to be a multiple of attention_window (LongformerModel pads, the layer does not) and no "
            "dilation",
        ),
    ),
    Peer(
        "transformers BigBirdBlockSparseAttention",
        "bigbird",
        ("transformers",),
        "transformers",
        build_hf_bigbird,
        lambda s: (
            f"block_size={s['block_size']}, 3 window + 2 global blocks, {s['num_random_blocks']} random"
            + (
                ""
                if (s["num_window_blocks"], s["num_global_blocks_start"], s["num_global_blocks_end"])
                == (3, 1, 1)
                else " (ours differs: the peer's layout is fixed)"
            )
            + "; in eval transformers uses no randomness (random slots point at block 0, same work)"
        ),
        lambda s, n: _needs(
            n % s["block_size"] == 0 and n > (5 + 2 * s["num_random_blocks"]) * s["block_size"],
            "needs n a multiple of block_size and > (5 + 2 r) block_size = "
            f"{(5 + 2 * s['num_random_blocks']) * s['block_size']} (BigBirdModel then runs full attention)",
        ),
    ),
    Peer(
        "reformer-pytorch",
        "reformer_lsh",
        ("reformer_pytorch", "einops", "local_attention", "axial_positional_embedding", "product_key_memory"),
        "reformer-pytorch",
        build_reformer_pytorch,
        lambda s: (
            f"LSHAttention, {s['num_hashes']} rounds, chunks of {s['chunk_length']}, buckets masked, "
            "pairs de-duplicated; its bucket count is n / chunk (not settable; ours "
            f"{'2 n / chunk' if s['num_buckets'] is None else s['num_buckets']})"
        ),
        lambda s, n: _needs(n % (2 * s["chunk_length"]) == 0, "needs n divisible by 2 x chunk_length"),
    ),
    Peer(
        "transformers LSHSelfAttention",
        "reformer_lsh",
        ("transformers",),
        "transformers",
        build_hf_reformer,
        lambda s: (
            f"{s['num_hashes']} rounds, chunks of {s['chunk_length']}, 1 chunk before, the same bucket "
            "count; attends to its whole 2-chunk window (keys of other buckets are not masked)"
        ),
        lambda s, n: _needs(
            n % s["chunk_length"] == 0 and n > s["chunk_length"],
            "needs n a multiple of chunk_length and longer than one chunk",
        ),
    ),
]
PEERS_BY_NAME = {p.name: p for p in PEERS}


def missing_modules(peer: Peer) -> list[str]:
    return [m for m in peer.modules if importlib.util.find_spec(m) is None]


def peer_version(peer: Peer) -> str | None:
    try:
        return importlib.metadata.version(peer.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


# ---- one point --------------------------------------------------------------------------------------------
def run_peer_point(args: argparse.Namespace) -> dict:
    """Measure one point of a peer in this process (called in a fresh subprocess)."""
    cap_address_space(args.memory_cap_gib)
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    peer = PEERS_BY_NAME[args.impl]
    # The parent passes the settings, so a peer's process need not import hf_efficient (seconds, under load).
    settings = json.loads(args.settings) if getattr(args, "settings", None) else our_settings(peer.mechanism)
    b, h, n, d = args.batch, args.heads, args.length, args.head_dim
    grad = args.mode == "fwd_bwd"
    forward, leaves, out_shape = peer.build(settings, b, h, n, d, grad)
    upstream = torch.randn(out_shape)

    def call():
        out = forward()
        if grad:
            (out * upstream).sum().backward()
            for t in leaves:
                t.grad = None

    times, peak_mib = measure(call, grad, args.warmup, args.repeats)
    return {
        "mechanism": peer.mechanism,
        "impl": peer.name,
        "length": n,
        "mode": args.mode,
        "status": "ok",
        "median_s": statistics.median(times),
        "times_s": times,
        "peak_mib": peak_mib,
    }


def run_ours_point(args: argparse.Namespace) -> dict:
    """Our core through attention.py's point runner, with the settings the peers get."""
    point = argparse.Namespace(**vars(args))
    point.type, point.config = args.mechanism, json.dumps(our_settings(args.mechanism))
    point.graph_degree, point.error_max_length = 1, 0
    record = run_point(point)
    return {
        "mechanism": args.mechanism,
        "impl": "ours",
        "length": args.length,
        "mode": args.mode,
        "status": record["status"],
        "median_s": record["median_s"],
        "times_s": record["times_s"],
        "peak_mib": record["peak_mib"],
    }


def worker(args: argparse.Namespace) -> dict:
    return run_ours_point(args) if args.impl == "ours" else run_peer_point(args)


def launch(args: argparse.Namespace, mechanism: str, impl: str, n: int, mode: str) -> dict:
    base = {"mechanism": mechanism, "impl": impl, "length": n, "mode": mode}
    if args.in_process:  # tests and debugging: no isolation of the peak memory
        point = argparse.Namespace(**{**vars(args), **base, "memory_cap_gib": 0})  # never cap the caller
        try:
            return worker(point)
        except Exception as error:
            return {**base, "status": f"error: {type(error).__name__}: {error}"[:200]}
    cmd = [sys.executable, __file__, "--worker", "--mechanism", mechanism, "--impl", impl]
    cmd += ["--length", str(n), "--mode", mode]
    for name in ("batch", "heads", "head_dim", "threads", "warmup", "repeats", "memory_cap_gib"):
        cmd += [f"--{name}", str(getattr(args, name))]
    cmd += ["--settings", json.dumps(our_settings(mechanism))]
    return run_worker(cmd, args.threads, args.timeout, base)


# ---- summary and plots ------------------------------------------------------------------------------------
def _cell(r: dict | None, key: str, fmt: str) -> str:
    return format(r[key], fmt) if r is not None and r["status"] == "ok" else "-"


def summarize(records: list[dict], modes: list[str], notes: dict[str, str]) -> str:
    """Markdown: ratios ours / peer (time and memory) per mechanism, peer and length, then the raw numbers."""
    ok = {(r["impl"], r["mechanism"], r["length"], r["mode"]): r for r in records if r["status"] == "ok"}
    lengths = sorted({r["length"] for r in records})
    header = "| mechanism | peer | " + " | ".join(f"n={n}" for n in lengths) + " |"
    rule = "|---" * (len(lengths) + 2) + "|"
    lines = [f"Compared: {PROJECTIONS_NOTE}."]
    for mode in modes:
        lines += [f"\n### {mode}: ours / peer, time x (memory x); < 1 means ours is faster (smaller)", ""]
        lines += [header, rule]
        for peer in PEERS:
            rows = [r for r in records if r["impl"] == peer.name and r["mode"] == mode]
            if not rows:
                continue
            cells = []
            for n in lengths:
                ours, theirs = (ok.get((i, peer.mechanism, n, mode)) for i in ("ours", peer.name))
                if ours and theirs:
                    memory = (
                        f"{ours['peak_mib'] / theirs['peak_mib']:.2f}" if theirs["peak_mib"] > 0.5 else "n/a"
                    )
                    cells.append(f"{ours['median_s'] / theirs['median_s']:.2f} ({memory})")
                else:
                    status = next((r["status"] for r in rows if r["length"] == n), "-")
                    cells.append("-" if ours and status == "ok" else status.split(":")[0])
            lines.append(f"| {peer.mechanism} | {peer.name} | " + " | ".join(cells) + " |")
        lines += [f"\n### {mode}: seconds / peak MiB", "", header.replace("| peer |", "| implementation |")]
        lines.append(rule)
        impls = [("ours", m) for m in MECHANISMS] + [(p.name, p.mechanism) for p in PEERS]
        for impl, mechanism in impls:
            rows = [r for r in records if (r["impl"], r["mechanism"], r["mode"]) == (impl, mechanism, mode)]
            if not rows:
                continue
            cells = []
            for n in lengths:
                r = next((x for x in rows if x["length"] == n), None)
                if r is None:
                    cells.append("-")
                elif r["status"] != "ok":
                    cells.append(r["status"].split(":")[0])
                else:
                    cells.append(f"{r['median_s']:.3f} / {r['peak_mib']:.0f}")
            lines.append(f"| {mechanism} | {impl} | " + " | ".join(cells) + " |")
    lines += ["\n### settings and differences", ""]
    lines += [f"- {name}: {note}" for name, note in notes.items()]
    return "\n".join(lines)


def plot(records: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = sorted({r["mode"] for r in records})
    mechanisms = [m for m in MECHANISMS if any(r["mechanism"] == m for r in records)]
    if not mechanisms:
        return
    for key, label, name in (("median_s", "seconds", "time.png"), ("peak_mib", "peak MiB", "memory.png")):
        fig, axes = plt.subplots(
            len(modes), len(mechanisms), figsize=(4.2 * len(mechanisms), 3.6 * len(modes)), squeeze=False
        )
        for row, mode in zip(axes, modes, strict=True):
            for ax, mechanism in zip(row, mechanisms, strict=True):
                impls = ["ours"] + [p.name for p in PEERS if p.mechanism == mechanism]
                for i, impl in enumerate(impls):
                    pts = sorted(
                        (r["length"], r[key])
                        for r in records
                        if (r["impl"], r["mechanism"], r["mode"]) == (impl, mechanism, mode)
                        and r["status"] == "ok"
                        and r[key] > 0
                    )
                    if pts:
                        style = "-" if impl == "ours" else "--"
                        ax.plot(*zip(*pts, strict=True), style, marker="o", color=f"C{i}", label=impl)
                ax.set(xscale="log", yscale="log", xlabel="n", ylabel=label, title=f"{mechanism}, {mode}")
                ax.grid(True, which="both", alpha=0.3)
                if ax.get_legend_handles_labels()[0]:
                    ax.legend(fontsize=7)
                else:  # every point failed or was skipped (see the summary's status column)
                    ax.text(0.5, 0.5, "no measured points", transform=ax.transAxes, ha="center")
        fig.tight_layout()
        fig.savefig(out / name, dpi=100)
        plt.close(fig)


# ---- main -------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mechanisms", nargs="+", choices=MECHANISMS, default=MECHANISMS)
    parser.add_argument("--peers", nargs="+", help="only these peers (names as in the tables; default all)")
    parser.add_argument("--lengths", nargs="+", type=int, default=[1024, 4096, 16384])
    parser.add_argument("--modes", nargs="+", choices=["fwd", "fwd_bwd"], default=["fwd", "fwd_bwd"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head_dim", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--memory_cap_gib", type=float, default=16.0, help="address-space cap per point (0: none)"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per point")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/peers"))
    parser.add_argument(
        "--in_process",
        action="store_true",
        help="run every point in this process (tests; memory not isolated)",
    )
    parser.add_argument("--no_plot", action="store_true", help="skip the PNGs")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mechanism", help=argparse.SUPPRESS)
    parser.add_argument("--impl", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.worker:
        record = worker(args)
        print(json.dumps(record))
        return record

    unknown = sorted(set(args.peers or []) - set(PEERS_BY_NAME))
    if unknown:
        raise SystemExit(f"unknown peer(s) {unknown}; peers: {', '.join(PEERS_BY_NAME)}")
    args.out.mkdir(parents=True, exist_ok=True)
    records, notes, versions, failed = [], {}, {}, set()
    plan = []  # (mechanism, impl), ours first
    for mechanism in args.mechanisms:
        settings = our_settings(mechanism)
        notes[f"ours {mechanism}"] = json.dumps(settings)
        plan.append((mechanism, "ours", None))
        for peer in PEERS:
            if peer.mechanism != mechanism or (args.peers and peer.name not in args.peers):
                continue
            notes[peer.name] = peer.note(settings)
            missing = missing_modules(peer)
            versions[peer.name] = peer_version(peer) if not missing else None
            if missing:
                message = (
                    f"skipped: not installed (no module {', '.join(missing)}; "
                    "pip install -e '.[bench]' after torch)"
                )
                print(f"{peer.name}: {message}")
            plan.append((mechanism, peer.name, None if not missing else message))
    for mode in args.modes:
        for mechanism, impl, skip in plan:
            for n in sorted(args.lengths):
                base = {"mechanism": mechanism, "impl": impl, "length": n, "mode": mode}
                reason = skip
                if reason is None and impl != "ours":
                    why = PEERS_BY_NAME[impl].unsupported(our_settings(mechanism), n)
                    reason = f"skipped: {why}" if why else None
                if reason is None and (impl, mechanism, mode) in failed:
                    reason = "skipped (failed at shorter n)"
                if reason is not None:
                    records.append({**base, "status": reason})
                    continue
                print(f"{mode} {mechanism} {impl} n={n} ...", flush=True)
                record = launch(args, mechanism, impl, n, mode)
                if record["status"] != "ok":
                    failed.add((impl, mechanism, mode))
                    print(f"  {record['status']}")
                records.append(record)

    meta = {
        **attention_meta(args),
        "warmup": args.warmup,
        "repeats": args.repeats,
        "in_process": args.in_process,
        "compared": PROJECTIONS_NOTE,
        "peer_versions": versions,
        "settings_and_differences": notes,
    }
    results = {"meta": meta, "records": records}
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    table = summarize(records, args.modes, notes)
    (args.out / "summary.md").write_text(table + "\n")
    if not args.no_plot:
        plot(records, args.out)
    print(table)
    print(f"\nwrote {args.out}/results.json, summary.md" + ("" if args.no_plot else ", time.png, memory.png"))
    return results


if __name__ == "__main__":
    main()
