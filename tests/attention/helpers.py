"""Shared test utilities: a plain-maths reference attention and input builders."""

from __future__ import annotations

import torch

from hf_efficient.attention import AttentionSpec, GraphEdges, build_attention, get_attention_class


def reference_attention(q, k, v, mask=None, bias=None, causal=False, allowed=None):
    """softmax(Q K^T / sqrt(d) + bias, over allowed keys) V in float64, written out by hand.

    Args:
        q, k, v: (b, h, n, d).
        mask: (b, n) bool key padding mask, True = real.
        bias: additive, broadcastable to (b, h, n, n).
        causal: forbid keys after the query.
        allowed: (b|1, h|1, n, n) bool pattern of permitted (query, key) pairs.
    Returns:
        (b, h, n, d) float64, rows with no allowed key set to 0.
    """
    q, k, v = (t.double() for t in (q, k, v))
    n = q.shape[-2]
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5  # (b, h, n, n)
    if bias is not None:
        scores = scores + bias.double()
    keep = torch.ones_like(scores, dtype=torch.bool)
    if mask is not None:
        keep = keep & mask[:, None, None, :].bool()
    if causal:
        keep = keep & torch.ones(n, n, dtype=torch.bool).tril()
    if allowed is not None:
        keep = keep & allowed
    scores = scores.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(scores, -1).nan_to_num(0.0)
    return probs @ v


def make_core(attention_type, heads=2, head_dim=8, max_seq_len=128, layer_idx=0, **config):
    cls = get_attention_class(attention_type)
    cfg = {**cls.small_config, **config}
    spec = AttentionSpec(num_heads=heads, head_dim=head_dim, max_seq_len=max_seq_len, layer_idx=layer_idx)
    return build_attention(attention_type, spec, cfg).eval()


def make_qkv(b=2, h=2, n=37, d=8, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=g) for _ in range(3))
    if requires_grad:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    return q, k, v


def random_graph_edges(b, n, mask=None, p=0.2, seed=0, self_loops=True):
    """GraphEdges of a random directed graph per batch item (plus self loops) over real nodes only."""
    g = torch.Generator().manual_seed(seed)
    adj = torch.rand(b, n, n, generator=g) < p  # adj[g, target, source]
    if self_loops:
        adj = adj | torch.eye(n, dtype=torch.bool)
    if mask is not None:
        adj = adj & mask[:, :, None] & mask[:, None, :]
    return adjacency_to_edges(adj)


def adjacency_to_edges(adj):
    """(b, n, n) bool adjacency [graph, target, source] -> GraphEdges over flattened positions."""
    b, n, _ = adj.shape
    gi, tgt, src = adj.nonzero(as_tuple=True)
    return GraphEdges(edge_index=torch.stack([gi * n + src, gi * n + tgt]))


def call_core(core, q, k, v, mask=None, edges=None, **kwargs):
    """Call a core honouring its declared needs (shared query/key, edges) so generic tests can run it."""
    caps = core.capabilities
    if caps.shared_query_key:
        k = q
    if caps.requires_edges and edges is None:
        edges = random_graph_edges(q.shape[0], q.shape[2], None if mask is None else mask.bool())
    return core(q, k, v, attention_mask=mask, edges=edges, **kwargs)
