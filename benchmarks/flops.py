"""Forward FLOP models of the attention mechanisms, for the achieved GFLOP/s of ``benchmarks/attention.py``.

Convention (the same for every type, so the numbers compare):
    * count the matrix products only, 2 FLOPs per multiply-add; softmax, exp, normalisation, masking,
      sorting, gathers and LayerNorms are left out (they are O(n) or O(pairs) without the factor d).
    * count the mechanism as defined (the (query, key) pairs its pattern holds), not what a kernel
      executes: padding to a multiple of a chunk, masked-out keys inside a computed block and recomputation
      in backward are waste that lowers the achieved GFLOP/s, which is what the number should show.
    * per head, times heads and batch; forward + backward = 3 x forward (the usual convention: the
      backward of a product needs two products of the same size).

Every function takes the sequence length n, the head size d and the type's full ``attention_config`` (its
defaults with the benchmark's settings applied, see :func:`resolved_config`) and returns the forward FLOPs
of ONE head of ONE sequence. Its docstring's first line is the formula shown in the summary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

BACKWARD_FACTOR = 3.0  # forward + backward = 3 x forward
CONVENTION = (
    "matrix products only, 2 FLOPs per multiply-add, pairs in the mechanism's pattern (no padding or "
    "masked-block waste), forward + backward = 3 x forward"
)


def _band_pairs(n: int, half: int) -> int:
    """(i, j) pairs with |i - j| <= half in a sequence of n tokens."""
    half = min(half, n - 1)
    return n * (2 * half + 1) - half * (half + 1)


def full(n: int, d: int, config: dict) -> float:
    """4 n^2 d: Q K^T and P V over all n x n pairs."""
    return 4.0 * n * n * d


def longformer(n: int, d: int, config: dict) -> float:
    """4 d (band pairs + 2 G n): window |i - j| <= w/2 (per dilation residue), G global rows and columns."""
    half, r = config["attention_window"] // 2, config["attention_dilation"]
    pairs = 0
    for s in range(min(r, n)):  # residue s holds positions s, s + r, ...: an undilated band on each
        pairs += _band_pairs(len(range(s, n, r)), half)
    num_global = len({i for i in config["global_token_indices"] if i < n})
    return 4.0 * d * (pairs + 2 * num_global * n)


def bigbird(n: int, d: int, config: dict) -> float:
    """4 d B^2 (g nb + (nb - g) min(nb, w + g + r)): g global blocks dense, other rows w + g + r blocks."""
    bs = config["block_size"]
    nb = -(-n // bs)
    num_global = min(nb, config["num_global_blocks_start"] + config["num_global_blocks_end"])
    per_row = min(nb, config["num_window_blocks"] + num_global + config["num_random_blocks"])
    return 4.0 * d * bs * bs * (num_global * nb + (nb - num_global) * per_row)


def linformer(n: int, d: int, config: dict) -> float:
    """8 n k d: E K and F V (k x n times n x d, 4 n k d) and attention over the k projected keys (4 n k d)."""
    k = config["projected_length"]
    return 8.0 * n * k * d


def nystromformer(n: int, d: int, config: dict) -> float:
    """8 n m d + 4 m^2 d + 8 m^3 T (+ 2 n d c): B V and F (...), A, pinv(A) B V, T pinv steps, conv c."""
    m = min(config["num_landmarks"], n)
    flops = 8.0 * n * m * d + 2.0 * m * m * d + 2.0 * m * m * d + 8.0 * m**3 * config["pinv_iterations"]
    if config.get("conv_kernel_size"):
        flops += 2.0 * n * d * config["conv_kernel_size"]
    return flops


def linear(n: int, d: int, config: dict) -> float:
    """4 n d (d + 1): phi(K)^T [V, 1] and phi(Q) [S | z] with d features (elu + 1)."""
    return 4.0 * n * d * (d + 1)


def performer(n: int, d: int, config: dict) -> float:
    """4 n m d + 4 n m (d + 1): features W q, W k (m x d each) and the two products with [V, 1]."""
    m = config["num_features"]
    return 4.0 * n * m * d + 4.0 * n * m * (d + 1)


def rfa(n: int, d: int, config: dict) -> float:
    """4 n m d + 8 n m (d + 1): W q, W k, then 2m sin/cos features times [V, 1] (non-causal form)."""
    m = config["num_features"]
    return 4.0 * n * m * d + 8.0 * n * m * (d + 1)


def reformer_num_buckets(n: int, config: dict) -> int:
    """Buckets for n tokens, as ``ReformerLSHAttention.num_buckets_for`` (the test checks they agree)."""
    if config["num_buckets"] is not None:
        return config["num_buckets"]
    chunk = config["chunk_length"]
    return 1 if n <= chunk else 2 * max(1, (n + chunk // 2) // chunk)


def reformer_lsh(n: int, d: int, config: dict) -> float:
    """R (n d nb + 4 n min(n, 2c) d): per round, hashing x R (d x nb/2) and 2c keys (own + previous chunk)."""
    rounds, chunk = config["num_hashes"], config["chunk_length"]
    nb = reformer_num_buckets(n, config)
    hashing = 2.0 * n * d * (nb // 2) if nb > 1 else 0.0
    return rounds * (hashing + 4.0 * n * min(n, 2 * chunk) * d)


def long_short(n: int, d: int, config: dict) -> float:
    """4 n min(n, w + 2e) d + 6 n r d + 4 n r d: window w + 2 floor(w/2) keys, P = softmax(K W), P^T K,
    P^T V, and r landmark keys."""
    w, r = config["window_size"], config["num_landmarks"]
    window_keys = min(n, w + 2 * (w // 2))
    return 4.0 * n * window_keys * d + 6.0 * n * r * d + 4.0 * n * r * d


def swin_window(n: int, d: int, config: dict) -> float:
    """4 n min(n, M_w) d: without a patch grid (as benchmarked) the sequence is one row of 1-D windows."""
    size = config["window_size"]
    width = size[-1] if isinstance(size, list | tuple) else size
    return 4.0 * n * min(n, width) * d


def graph_sparse(n: int, d: int, config: dict, degree: int = 16) -> float:
    """4 E d, E = n x in-degree: a score and a weighted value per edge."""
    return 4.0 * n * degree * d


def multi_hop(n: int, d: int, config: dict, degree: int = 16) -> float:
    """2 E d + 2 K E d: one-hop scores, then K hops of A Z over the edges."""
    return 2.0 * n * degree * d + 2.0 * config["num_hops"] * n * degree * d


FLOP_MODELS: dict[str, Callable[..., float]] = {
    "full": full,
    "longformer": longformer,
    "bigbird": bigbird,
    "linformer": linformer,
    "nystromformer": nystromformer,
    "linear": linear,
    "performer": performer,
    "rfa": rfa,
    "reformer_lsh": reformer_lsh,
    "long_short": long_short,
    "swin_window": swin_window,
    "graph_sparse": graph_sparse,
    "multi_hop": multi_hop,
}
GRAPH_TYPES = ("graph_sparse", "multi_hop")


def base_type(benchmark_type: str) -> str:
    """``full_eager`` / ``full_sdpa`` -> ``full``; other names are the registry's."""
    return "full" if benchmark_type.startswith("full") else benchmark_type


def resolved_config(attention_type: str, config: dict | None) -> dict:
    """The type's full attention_config: its dataclass defaults with ``config`` applied (validated)."""
    from hf_efficient.attention import validate_attention_config

    return validate_attention_config(attention_type, config or {}).to_dict()


def formula(benchmark_type: str) -> str | None:
    """The formula of a type's model (its function's docstring), or None without one."""
    model = FLOP_MODELS.get(base_type(benchmark_type))
    return " ".join(model.__doc__.split()) if model is not None and model.__doc__ else None


def forward_flops(
    benchmark_type: str,
    n: int,
    heads: int,
    head_dim: int,
    config: dict | None = None,
    batch: int = 1,
    graph_degree: int = 16,
) -> float | None:
    """Forward FLOPs of one call on (batch, heads, n, head_dim) inputs, or None for a type with no model.

    ``config`` is what the benchmark point passed (BENCH_CONFIGS and --config); defaults fill the rest.
    """
    attention_type = base_type(benchmark_type)
    model = FLOP_MODELS.get(attention_type)
    if model is None:
        return None
    settings: dict[str, Any] = {} if attention_type == "full" else resolved_config(attention_type, config)
    extra = {"degree": graph_degree} if attention_type in GRAPH_TYPES else {}
    return batch * heads * model(n, head_dim, settings, **extra)


def point_flops(benchmark_type: str, n: int, mode: str, **kwargs) -> float | None:
    """FLOPs of one timed call of a benchmark point: forward, or forward + backward (3 x forward)."""
    flops = forward_flops(benchmark_type, n, **kwargs)
    if flops is None:
        return None
    return flops * (BACKWARD_FACTOR if mode == "fwd_bwd" else 1.0)
