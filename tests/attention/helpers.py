"""What attention tests build from: a plain-maths reference attention, cores at their small sizes, q/k/v,
padding masks, random graphs, and the checks several mechanisms' tests share."""

from __future__ import annotations

import torch

from hf_efficient.attention import (
    AttentionSpec,
    GraphEdges,
    build_attention,
    get_attention_class,
    list_attention_types,
)
from hf_efficient.attention.rotary import RotaryPositions, default_inverse_frequencies


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


def relative_table(max_positions: int = 64, head_dim: int = 8, seed: int = 1) -> torch.Tensor:
    """A (2 max_positions - 1, head_dim) distance table (BERT's ``distance_embedding.weight``), with grad."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2 * max_positions - 1, head_dim, generator=g).requires_grad_()


def relative_bias(table, q, k, keys_too: bool, positions=None) -> torch.Tensor:
    """BERT's relative position scores written out as transformers 4's eager BERT forms them, in float64:
    (q_i . e_{i-j} [+ k_j . e_{i-j}]) / sqrt(d), (b, h, n, n), e_r = table[r + L - 1]; query and key i at
    ``positions[i]`` (default 0..n-1)."""
    n, d = q.shape[-2], q.shape[-1]
    positions = torch.arange(n) if positions is None else positions
    distance = positions[:, None] - positions[None, :]  # (n, n)
    embedded = table.double()[distance + (table.shape[0] - 1) // 2]  # (n, n, d)
    bias = torch.einsum("bhld,lrd->bhlr", q.double(), embedded)
    if keys_too:
        bias = bias + torch.einsum("bhrd,lrd->bhlr", k.double(), embedded)
    return bias / d**0.5


def kernel_quadratic_form(phi_q, phi_k, v, mask=None, causal=False, eps=0.0):
    """phi(Q) phi(K)^T V / (phi(Q) phi(K)^T 1 + eps) in float64, with an explicit (n x n) kernel matrix: the
    O(n^2) form every kernelized (linear-time) attention must equal.

    Args:
        phi_q, phi_k: (b, h, n, m) feature maps of the queries and keys.
        v: (b, h, n, d).
        mask: (b, n) key padding mask, True/1 = real: padded keys leave the sums.
        causal: query i sums over keys j <= i only.
    """
    kernel = phi_q.double() @ phi_k.double().transpose(-1, -2)  # (b, h, n, n)
    if mask is not None:
        kernel = kernel.masked_fill(~mask[:, None, None, :].bool(), 0.0)
    if causal:
        n = kernel.shape[-1]
        kernel = kernel.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), 0.0)
    return (kernel @ v.double()) / (kernel.sum(-1, keepdim=True) + eps)


def rotary_positions(positions: torch.Tensor, head_dim: int = 8, theta: float = 10.0) -> RotaryPositions:
    """RoPE's rotation of tokens at ``positions`` (b | 1, n), frequencies theta^(-2f / d) (a small theta:
    every angle turns within a few tokens at head size 8)."""
    return RotaryPositions.at(positions, default_inverse_frequencies(head_dim, theta))


def rotary_kernel_quadratic_form(phi_q, phi_k, v, rotary, mask=None):
    """RoFormer's eq. 19 in float64 with explicit (n x n) kernel matrices: its numerator (R phi(Q))
    (R phi(K))^T V, (b, h, n, d), and denominator phi(Q) phi(K)^T 1, (b, h, n, 1), padded keys (mask False)
    left out of both; phi_q, phi_k (b, h, n, m)."""
    keep = None if mask is None else mask[:, None, None, :].bool()
    rotated = rotary.rotate_features(phi_q.double()) @ rotary.rotate_features(phi_k.double()).transpose(
        -1, -2
    )
    plain = phi_q.double() @ phi_k.double().transpose(-1, -2)  # (b, h, n, n)
    if keep is not None:
        rotated, plain = rotated.masked_fill(~keep, 0.0), plain.masked_fill(~keep, 0.0)
    return rotated @ v.double(), plain.sum(-1, keepdim=True)


def small_config(attention_type: str, causal: bool = False, **extra) -> dict:
    """A copy of the type's ``small_config`` (hyperparameters for tiny models; with ``causal``, its
    ``causal_small_config`` where it has one), updated with ``extra``."""
    cls = get_attention_class(attention_type)
    base = cls.causal_small_config if causal and cls.causal_small_config is not None else cls.small_config
    return {**base, **extra}


def make_core(attention_type, heads=2, head_dim=8, max_seq_len=128, layer_idx=0, causal=False, **config):
    """The core in eval mode at its ``small_config``, updated with ``config``; ``causal``: built for a causal
    model (``AttentionSpec.causal``)."""
    spec = AttentionSpec(
        num_heads=heads, head_dim=head_dim, max_seq_len=max_seq_len, layer_idx=layer_idx, causal=causal
    )
    return build_attention(attention_type, spec, small_config(attention_type, causal, **config)).eval()


def make_qkv(b=2, h=2, n=37, d=8, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=g) for _ in range(3))
    if requires_grad:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    return q, k, v


def padding_mask(lengths, n: int) -> torch.Tensor:
    """(b, n) bool, True on the first ``lengths[i]`` positions of row i (right padding)."""
    return torch.arange(n)[None] < torch.tensor(lengths)[:, None]


def random_adjacency(b, n, p=0.25, seed=0, mask=None, self_loops=True, isolate_first=False) -> torch.Tensor:
    """(b, n, n) bool adjacency [graph, target, source] of a random directed graph per batch item.

    Args:
        p: probability of each edge.
        mask: (b, n) bool real nodes; edges touching padding are dropped.
        self_loops: add the loop of every node.
        isolate_first: node 0 of each graph gets no incoming edge (its output row is empty).
    """
    g = torch.Generator().manual_seed(seed)
    adj = torch.rand(b, n, n, generator=g) < p
    if self_loops:
        adj = adj | torch.eye(n, dtype=torch.bool)
    if isolate_first:
        adj[:, 0, :] = False
    if mask is not None:
        adj = adj & mask[:, :, None] & mask[:, None, :]
    return adj


def adjacency_to_edges(adj):
    """(b, n, n) bool adjacency [graph, target, source] -> GraphEdges over flattened positions."""
    b, n, _ = adj.shape
    gi, tgt, src = adj.nonzero(as_tuple=True)
    return GraphEdges(edge_index=torch.stack([gi * n + src, gi * n + tgt]))


def assert_dropout_only_in_training(core, q, k, v, **inputs) -> None:
    """A core built with attention dropout: two training calls differ, two eval calls are identical."""
    core.train()
    assert not torch.allclose(core(q, k, v, **inputs).output, core(q, k, v, **inputs).output)
    core.eval()
    assert torch.equal(core(q, k, v, **inputs).output, core(q, k, v, **inputs).output)


def assert_bfloat16_keeps_dtype(core, q, k, v, **inputs) -> None:
    """bfloat16 q/k/v give a bfloat16 output within bfloat16 precision of the float32 one."""
    out = core(q.bfloat16(), k.bfloat16(), v.bfloat16(), **inputs).output
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), core(q, k, v, **inputs).output, atol=5e-2, rtol=5e-2)


def assert_close_with_gradients(out, expected, inputs, atol, rtol):
    """``out`` == ``expected``, and so are their gradients with respect to ``inputs`` (random upstream)."""
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)
    upstream = torch.randn(out.shape, dtype=out.dtype, device=out.device)
    grads = torch.autograd.grad((out * upstream).sum(), inputs)
    expected_grads = torch.autograd.grad((expected * upstream).sum(), inputs)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, atol=atol, rtol=rtol)


def script_settings(family: str, modality: str = "text") -> dict[str, dict]:
    """attention_type -> what the scripts of config ``family`` set for it (its core's ``script_configs``
    entry), for the types of ``modality`` that have one."""
    entries = {
        name: get_attention_class(name).script_configs.get(family) for name in list_attention_types(modality)
    }
    return {name: entry for name, entry in entries.items() if entry is not None}
