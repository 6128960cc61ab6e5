"""FLOPs of benchmark points, from each core's own FLOP model (``AttentionCore.forward_flops``).

The convention is the registry's (see ``AttentionCore.forward_flops``): matrix products only, 2 FLOPs per
multiply-add, the pairs of the mechanism's pattern; forward + backward = 3 x forward (the usual
convention: the backward of a product needs two products of the same size). A type whose core has no model
records null.
"""

from __future__ import annotations

from benchmarks.mechanisms import split_name

BACKWARD_FACTOR = 3.0  # forward + backward = 3 x forward
CONVENTION = (
    "matrix products only, 2 FLOPs per multiply-add, pairs in the mechanism's pattern (no padding or "
    "masked-block waste), forward + backward = 3 x forward"
)


def resolved_config(attention_type: str, config: dict | None) -> dict:
    """The type's full attention_config: its dataclass defaults with ``config`` applied (validated)."""
    from hf_efficient.attention import validate_attention_config

    return validate_attention_config(attention_type, config or {}).to_dict()


def _core_class(benchmark_type: str):
    from hf_efficient.attention import ATTENTION_REGISTRY

    return ATTENTION_REGISTRY.get(split_name(benchmark_type)[0])


def formula(benchmark_type: str) -> str | None:
    """The formula of a type's FLOP model (the first paragraph of its docstring), or None without one."""
    from hf_efficient.attention import AttentionCore

    cls = _core_class(benchmark_type)
    if cls is None or cls.forward_flops.__func__ is AttentionCore.forward_flops.__func__:
        return None
    doc = cls.forward_flops.__doc__ or ""
    return " ".join(doc.split("\n\n")[0].split()) or None


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

    ``config`` is what the benchmark point passed (the type's benchmark settings and --config); defaults
    fill the rest. Graph attention runs on graphs of ``graph_degree`` in-edges per node (E = degree n).
    """
    from hf_efficient.attention import validate_attention_config

    cls = _core_class(benchmark_type)
    if cls is None:
        return None
    settings = validate_attention_config(cls.attention_type, config or {})
    flops = cls.forward_flops(n, head_dim, settings, num_edges=graph_degree * n)
    return None if flops is None else batch * heads * flops


def point_flops(benchmark_type: str, n: int, mode: str, **kwargs) -> float | None:
    """FLOPs of one timed call of a benchmark point: forward, or forward + backward (3 x forward)."""
    flops = forward_flops(benchmark_type, n, **kwargs)
    if flops is None:
        return None
    return flops * (BACKWARD_FACTOR if mode == "fwd_bwd" else 1.0)
