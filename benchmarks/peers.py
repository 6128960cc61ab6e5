"""Ours against peer implementations of the same mechanism, side by side in one run with the same sizes.

    python -m benchmarks.peers                                 # all mechanisms, n = 1k 4k 16k, fwd, fwd+bwd
    python -m benchmarks.peers --lengths 512 1024 --repeats 1  # quick
    python -m benchmarks.peers --mechanisms longformer bigbird --modes fwd_bwd

Peers (installed by the ``bench`` extra, after torch; a peer that is not installed is skipped with a message):
    performer      performer-pytorch ``FastAttention`` (FAVOR+, the same number of orthogonal features)
    linformer      linformer ``LinformerSelfAttention`` (the same k, E and F shared by the heads)
    nystromformer  nystrom-attention ``NystromAttention``; transformers ``NystromformerSelfAttention``
    longformer     local-attention ``LocalAttention`` (exact |i - j| <= w/2 window, no globals);
                   transformers ``LongformerSelfAttention`` (sliding chunks, no global tokens)
    bigbird        transformers ``BigBirdBlockSparseAttention`` (block_sparse: 3 window, 2 global, r random)
    reformer_lsh   reformer-pytorch ``LSHAttention``; transformers ``LSHSelfAttention``
The mechanisms compared are those of our registered types that have a peer in this table (``PEERS``).

What is measured: the attention core only, on both sides. Our core takes projected heads; where a peer is a
layer with its own q/k/v (and output) projections, those modules are replaced by pass-through modules that
hand it the same random q, k, v (and an identity output projection), so no projection GEMM is timed on
either side and nothing is added to ours. A pass-through returns the given tensor itself, or a copy where the
peer divides it in place (transformers' Longformer query), which costs one (n x h d) copy, not a GEMM.
Every (mechanism, implementation, length, mode) point runs in a fresh process (``benchmarks.harness``) with
the timing of ``benchmarks.attention`` (ours through its very point function): float32, median of
--repeats after --warmup, peak memory = peak RSS during the calls minus RSS before them (inputs allocated).
The settings of both sides come from our core's config (its benchmark settings over the defaults); where a
peer cannot be set to the same thing, the record's ``note`` and the summary say what differs.

Writes ``<out>/results.json``, ``<out>/time.png`` (time vs n, ours solid, peers dashed, one panel per
mechanism and mode), ``<out>/memory.png`` and ``<out>/summary.md`` (ratios ours / peer of time and memory).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from benchmarks import attention, flops
from benchmarks.harness import (
    ProcessOptions,
    add_point_arguments,
    benchmark_parser,
    launch,
    package_version,
    set_up_torch,
    sweep,
)
from benchmarks.mechanisms import benchmark_config
from benchmarks.report import (
    Panel,
    ok_points,
    plot_loglog,
    status_cell,
    time_and_memory_plots,
    write_report,
)
from hf_efficient.markdown import markdown_table

PROJECTIONS_NOTE = (
    "core only on both sides: the peers' q/k/v/output projections are replaced by pass-through modules fed "
    "the same q, k, v; nothing is added to ours"
)


def our_settings(mechanism: str) -> dict:
    """Our core's full config for the comparison: its defaults with its benchmark settings applied."""
    return flops.resolved_config(mechanism, benchmark_config(mechanism))


# ---- inputs -----------------------------------------------------------------------------------------------
def _leaf(t, grad: bool):
    return t.detach().contiguous().requires_grad_(grad)


def _heads(b, h, n, d, grad):
    """q, k, v as (b, h, n, d) leaves: what our core gets."""
    import torch

    return [_leaf(torch.randn(b, h, n, d), grad) for _ in range(3)]


def _feed(attn, names: tuple[str, ...], b, h, n, d, grad, seq_first: bool = False, copied: str = ""):
    """Replace the projections ``names`` of a peer layer (its q, k, v modules, in that order) by
    pass-throughs of fresh (b, n, h d) leaves ((n, b, h d) if seq_first: what a projection Linear would
    return; a copy for the one named ``copied``); (the leaves, the zero hidden states to call it with)."""
    import torch

    shape = (n, b, h * d) if seq_first else (b, n, h * d)
    leaves = [_leaf(torch.randn(*shape), grad) for _ in names]
    for name, leaf in zip(names, leaves, strict=True):
        setattr(attn, name, _given(leaf, copy=name == copied))
    return leaves, leaves[0].new_zeros(b, n, h * d)


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
    leaves, hidden = _feed(attn, ("to_q", "to_k", "to_v"), b, h, n, d, grad)
    attn.to_out = nn.Identity()
    return (lambda: attn(hidden)), leaves, (b, n, h * d)


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
    leaves, hidden = _feed(attn, ("query", "key", "value"), b, h, n, d, grad)
    return (lambda: attn(hidden)[0]), leaves, (b, n, h * d)


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
    # It projects hidden_states.transpose(0, 1), and divides the query by sqrt(d) in place.
    leaves, hidden = _feed(attn, ("query", "key", "value"), b, h, n, d, grad, seq_first=True, copied="query")
    local = torch.zeros(b, n)  # LongformerModel's mask: 0 = local attention
    no = torch.zeros(b, n, dtype=torch.bool)

    def forward():
        return attn(
            hidden, attention_mask=local, is_index_masked=no, is_index_global_attn=no, is_global_attn=False
        )[0]

    return forward, leaves, (b, n, h * d)


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
    leaves, hidden = _feed(attn, ("query", "key", "value"), b, h, n, d, grad)
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

    return forward, leaves, (b, n, h * d)


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
    leaves, hidden = _feed(attn, ("query_key", "value"), b, h, n, d, grad)
    return (lambda: attn(hidden).hidden_states), leaves, (b, n, h * d)


# ---- what each peer can and cannot match -------------------------------------------------------------
def _needs(condition: bool, reason: str) -> str | None:
    return None if condition else reason


class Peer(NamedTuple):
    """A peer implementation of one of our mechanisms."""

    name: str
    mechanism: str
    modules: tuple[str, ...]  # importable modules it needs (checked before launching); the first one's
    # distribution (its PyPI name: the module's with "-" for "_") gives the version
    build: Callable[..., Built]
    note: Callable[[dict], str]  # what differs from ours at these settings
    unsupported: Callable[[dict, int], str | None] = lambda s, n: None  # why length n cannot run, or None


PEERS = [
    Peer(
        "performer-pytorch",
        "performer",
        ("performer_pytorch", "einops"),
        build_performer_pytorch,
        lambda s: f"FastAttention, {s['num_features']} orthogonal features, {s['kernel']} kernel; matches",
    ),
    Peer(
        "linformer",
        "linformer",
        ("linformer",),
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


def mechanisms() -> list[str]:
    """Our registered types that have a peer, in the order of ``PEERS``."""
    from hf_efficient.attention import ATTENTION_REGISTRY

    return [m for m in dict.fromkeys(p.mechanism for p in PEERS) if m in ATTENTION_REGISTRY]


def missing_modules(peer: Peer) -> list[str]:
    return [m for m in peer.modules if importlib.util.find_spec(m) is None]


# ---- one point --------------------------------------------------------------------------------------------
def run_peer_point(point: argparse.Namespace) -> dict:
    """Point function: one point of a peer, in this process."""
    import torch

    set_up_torch(point.threads)
    peer = PEERS_BY_NAME[point.impl]
    # The parent passes the settings, so a peer's process need not import hf_efficient (seconds, under load).
    settings = (
        json.loads(point.settings) if getattr(point, "settings", None) else our_settings(peer.mechanism)
    )
    b, h, n, d = point.batch, point.heads, point.length, point.head_dim
    grad = point.mode == "fwd_bwd"
    forward, leaves, out_shape = peer.build(settings, b, h, n, d, grad)
    upstream = torch.randn(out_shape)
    timing = attention.time_forward(forward, leaves, upstream, grad, point.warmup, point.repeats)
    identity = {"mechanism": peer.mechanism, "impl": peer.name, "length": n, "mode": point.mode}
    return {**identity, **timing.fields()}


def run_ours_point(point: argparse.Namespace) -> dict:
    """Our core through the attention benchmark's point function, with the settings the peers get."""
    ours = argparse.Namespace(**vars(point))
    ours.type, ours.config = point.mechanism, json.dumps(our_settings(point.mechanism))
    ours.graph_degree, ours.error_max_length = 1, 0
    record = attention.run_point(ours)
    identity = {"mechanism": point.mechanism, "impl": "ours", "length": point.length, "mode": point.mode}
    return {**identity, **{key: record[key] for key in ("status", "median_s", "times_s", "peak_mib")}}


def run_comparison_point(point: argparse.Namespace) -> dict:
    """Point function: ours or a peer, as ``point.impl`` says."""
    return run_ours_point(point) if point.impl == "ours" else run_peer_point(point)


# ---- summary and plots ------------------------------------------------------------------------------------
def _ratio_cell(ours: dict | None, theirs: dict | None) -> str:
    """Time ratio ours / peer (memory ratio in brackets), or the status of the side that did not run."""
    for record in (theirs, ours):
        if record is None or record["status"] != "ok":
            return status_cell(record, str)
    memory = f"{ours['peak_mib'] / theirs['peak_mib']:.2f}" if theirs["peak_mib"] > 0.5 else "n/a"
    return f"{ours['median_s'] / theirs['median_s']:.2f} ({memory})"


def _seconds_and_memory(record: dict) -> str:
    return f"{record['median_s']:.3f} / {record['peak_mib']:.0f}"


def summarize(records: list[dict], modes: list[str], notes: dict[str, str]) -> str:
    """Markdown: ratios ours / peer (time and memory) per mechanism, peer and length, then the raw numbers."""
    by_point = {(r["impl"], r["mechanism"], r["length"], r["mode"]): r for r in records}
    lengths = sorted({r["length"] for r in records})
    columns = [f"n={n}" for n in lengths]
    present = {(r["impl"], r["mechanism"], r["mode"]) for r in records}
    lines = [f"Compared: {PROJECTIONS_NOTE}."]
    peers = [(p.name, p.mechanism) for p in PEERS]
    implementations = [("ours", m) for m in mechanisms()] + peers

    def ratio(impl: str, mechanism: str, n: int, mode: str) -> str:
        return _ratio_cell(
            by_point.get(("ours", mechanism, n, mode)), by_point.get((impl, mechanism, n, mode))
        )

    def measured(impl: str, mechanism: str, n: int, mode: str) -> str:
        return status_cell(by_point.get((impl, mechanism, n, mode)), _seconds_and_memory)

    def rows(pairs: list[tuple[str, str]], cell, mode: str) -> list[list[str]]:
        """[mechanism, implementation, its cell per length] of each (implementation, mechanism) that ran."""
        return [[m, i, *(cell(i, m, n, mode) for n in lengths)] for i, m in pairs if (i, m, mode) in present]

    for mode in modes:
        lines += [f"\n### {mode}: ours / peer, time x (memory x); < 1 means ours is faster (smaller)", ""]
        lines += markdown_table(["mechanism", "peer", *columns], rows(peers, ratio, mode))
        lines += [f"\n### {mode}: seconds / peak MiB", ""]
        lines += markdown_table(
            ["mechanism", "implementation", *columns], rows(implementations, measured, mode)
        )
    lines += ["\n### settings and differences", ""]
    lines += [f"- {name}: {note}" for name, note in notes.items()]
    return "\n".join(lines)


def plot(records: list[dict], key: str, label: str, path: Path) -> None:
    """``records[key]`` against n, log-log: a row of panels per mode, a panel per mechanism, ours solid."""
    modes = sorted({r["mode"] for r in records})
    compared = [m for m in mechanisms() if any(r["mechanism"] == m for r in records)]
    if not compared:
        return
    grid = []
    for mode in modes:
        row = []
        for mechanism in compared:
            impls = ["ours"] + [p.name for p in PEERS if p.mechanism == mechanism]
            lines = {
                i: ok_points(records, "length", key, impl=i, mechanism=mechanism, mode=mode) for i in impls
            }
            row.append(Panel(f"{mechanism}, {mode}", "n", label, lines, dashed=set(impls[1:])))
        grid.append(row)
    plot_loglog(path, grid, panel_size=(4.2, 3.6), dpi=100)


# ---- main -------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__, "peers")
    ours = mechanisms()
    parser.add_argument("--mechanisms", nargs="+", choices=ours, default=ours)
    parser.add_argument("--peers", nargs="+", help="only these peers (names as in the tables; default all)")
    parser.add_argument("--lengths", nargs="+", type=int, default=[1024, 4096, 16384])
    parser.add_argument("--modes", nargs="+", choices=["fwd", "fwd_bwd"], default=["fwd", "fwd_bwd"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head_dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no_plot", action="store_true", help="skip the PNGs")
    add_point_arguments(parser, threads=2, memory_cap_gib=16.0, timeout=300.0, plugins=False)
    return parser.parse_args(argv)


def plan(args: argparse.Namespace) -> tuple[list[tuple[str, str, str | None]], dict, dict]:
    """(mechanism, implementation, why it is skipped or None) in run order, ours first; the settings and
    differences of each side; the installed peers' versions."""
    steps, notes, versions = [], {}, {}
    for mechanism in args.mechanisms:
        settings = our_settings(mechanism)
        notes[f"ours {mechanism}"] = json.dumps(settings)
        steps.append((mechanism, "ours", None))
        for peer in PEERS:
            if peer.mechanism != mechanism or (args.peers and peer.name not in args.peers):
                continue
            notes[peer.name] = peer.note(settings)
            missing = missing_modules(peer)
            versions[peer.name] = package_version(peer.modules[0].replace("_", "-")) if not missing else None
            message = None
            if missing:
                message = (
                    f"skipped: not installed (no module {', '.join(missing)}; "
                    "pip install -e '.[bench]' after torch)"
                )
                print(f"{peer.name}: {message}")
            steps.append((mechanism, peer.name, message))
    return steps, notes, versions


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    unknown = sorted(set(args.peers or []) - set(PEERS_BY_NAME))
    if unknown:
        raise SystemExit(f"unknown peer(s) {unknown}; peers: {', '.join(PEERS_BY_NAME)}")
    steps, notes, versions = plan(args)
    skips = {(mechanism, impl): message for mechanism, impl, message in steps}

    def reason(base: dict) -> str | None:
        """Not installed, or a length the peer cannot run; None when the point runs."""
        mechanism, impl = base["mechanism"], base["impl"]
        if skips[(mechanism, impl)] is not None or impl == "ours":
            return skips[(mechanism, impl)]
        why = PEERS_BY_NAME[impl].unsupported(our_settings(mechanism), base["length"])
        return f"skipped: {why}" if why else None

    options = ProcessOptions.from_args(args)
    shape = {
        name: getattr(args, name) for name in ("batch", "heads", "head_dim", "threads", "warmup", "repeats")
    }

    def run(base: dict) -> dict:
        settings = json.dumps(our_settings(base["mechanism"]))
        return launch(run_comparison_point, {**shape, **base, "settings": settings}, base, options)

    bases = [
        {"mechanism": mechanism, "impl": impl, "length": n, "mode": mode}
        for mode in args.modes
        for mechanism, impl, _ in steps
        for n in sorted(args.lengths)
    ]
    records = sweep(bases, run, lambda p: (p["impl"], p["mechanism"], p["mode"]), desc="peers", reason=reason)
    meta = {
        **attention.attention_meta(args),
        "warmup": args.warmup,
        "repeats": args.repeats,
        "in_process": args.in_process,
        "compared": PROJECTIONS_NOTE,
        "peer_versions": versions,
        "settings_and_differences": notes,
    }
    plots = {} if args.no_plot else time_and_memory_plots(functools.partial(plot, records))
    return write_report(
        args.out, {"meta": meta, "records": records}, summarize(records, args.modes, notes), plots
    )


if __name__ == "__main__":
    main()
