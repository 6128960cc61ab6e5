"""Draw which keys each query draws on, for every registered attention type, as one PNG grid.

Most efficient cores never form the attention matrix, so the picture is measured rather than read off:
entry (i, j) is |d out_i / d v_j| (the Frobenius norm of the Jacobian block), which equals the attention
weight p_ij times a constant for every mechanism that is linear in the values, and shows the exact sparsity
pattern for all of them. Each core uses its ``small_config``; graph types get a ring graph plus chords.

    python -m benchmarks.patterns --length 64 --out benchmarks/results/patterns.png
    python -m benchmarks.patterns --plugin my_attention.py     # types registered there too
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

import hf_efficient
from benchmarks.plugins import add_plugin_argument, parse_args_with_plugins
from benchmarks.report import pyplot
from hf_efficient.attention import AttentionSpec, GraphEdges, build_attention, get_attention_class


def ring_with_chords(n: int) -> GraphEdges:
    """Self loops, both ring neighbours and a chord to the opposite node: a small readable graph."""
    nodes = torch.arange(n)
    sources = torch.cat([nodes, (nodes - 1) % n, (nodes + 1) % n, (nodes + n // 2) % n])
    targets = nodes.repeat(4)
    return GraphEdges(torch.stack([sources, targets]))


def effective_weights(attention_type: str, n: int, head_dim: int = 16, seed: int = 0) -> torch.Tensor:
    """(n, n) map of |d out_i / d v_j| for one head of ``attention_type`` on random inputs."""
    cls = get_attention_class(attention_type)
    spec = AttentionSpec(num_heads=1, head_dim=head_dim, max_seq_len=n)
    torch.manual_seed(seed)
    core = build_attention(attention_type, spec, cls.small_config).eval()
    q, k, v = torch.randn(3, 1, 1, n, head_dim).unbind(0)
    k = q if cls.capabilities.shared_query_key else k
    edges = ring_with_chords(n) if cls.capabilities.requires_edges else None

    def out_of_values(values: torch.Tensor) -> torch.Tensor:
        return core(q, k, values, edges=edges).output[0, 0]  # (n, d)

    jac = torch.autograd.functional.jacobian(out_of_values, v)  # (n, d, 1, 1, n, d)
    return jac[:, :, 0, 0].pow(2).sum(dim=(1, 3)).sqrt()  # (n, n): query i, key j


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--types", nargs="+", default=None)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/patterns.png"))
    add_plugin_argument(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = parse_args_with_plugins(make_parser, argv)
    plt = pyplot()
    types = args.types or hf_efficient.list_attention_types()
    cols = min(4, len(types))
    rows = math.ceil(len(types) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.4 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, attention_type in zip(axes.flat, types, strict=False):
        weights = effective_weights(attention_type, args.length)
        ax.imshow(weights / weights.max(), cmap="viridis", interpolation="nearest")
        config = get_attention_class(attention_type).small_config
        ax.set_title(f"{attention_type}\n{config}" if config else attention_type, fontsize=7)
        ax.set_xlabel("key j", fontsize=7)
        ax.set_ylabel("query i", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.axis("on")
    fig.suptitle(f"|d out_i / d v_j| at n = {args.length} (one head, random inputs)", fontsize=10)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
