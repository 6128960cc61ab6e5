"""Shared maths of kernelised (linear-time) attention: out_i = phi(q_i)^T S / (phi(q_i)^T z + eps).

With feature maps phi_q, phi_k mapping a head vector to m non-negative features,

    non-causal:  S = sum_j phi_k(k_j) v_j^T  (m x d),   z = sum_j phi_k(k_j)  (m)
    causal:      S_i, z_i as above but summed over j <= i only

and out_i = phi_q(q_i)^T S / (phi_q(q_i)^T z + eps). Cost O(n m d) time, O(n (m + d)) memory. Used by
``linear`` (Katharopoulos et al. 2020) and ``performer`` (Choromanski et al. 2021); the leading underscore
keeps this module out of the registry's auto-import.

Half precision: with bfloat16 inputs, features and per-chunk products run in bfloat16 (one rounding per
chunk), while the running sums S, z, the query-side products and the division run in float32 (over n
tokens they lose bfloat16's 8-bit precision); the output is cast back. The cores run float16 inputs in
float32 (``AttentionCore.float32_for``): the normaliser phi(q_i)^T z can be tiny at early causal
positions, and gradients through 1 / (phi(q_i)^T z) then leave float16's range although they are moderate
in float32.

Two implementation choices keep it fast on CPU:
- z rides along as an extra value column: values are extended to [v, 1] (d + 1 columns), so one matmul
  gives numerator and denominator together.
- features are computed by the core's feature maps on chunks of the sequence, so no (n x m) feature tensor
  is ever built in one piece (glibc returns allocations over 32 MiB to the OS; see ``utils.CHUNK_BYTES``).

The causal form is computed in parallel: the sequence is cut into blocks of ``block_size`` tokens; within
a block the masked quadratic form phi_q phi_k^T (lower triangle) is used, across blocks an exclusive prefix
sum of the per-block states S, z; groups of blocks are processed in turn carrying the running state, so
every intermediate stays under the chunk budget and memory is linear in n.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .inputs import is_tracing
from .utils import CHUNK_BYTES, rows_per_chunk

# Chunk budget for (chunk x m) feature tensors. Well below utils.CHUNK_BYTES: forward+backward of the
# performer at n=4096..16384 ran ~20% faster with 4-8 MiB chunks than with 24 MiB ones (cache reuse), and
# 512+ rows per chunk keep the matmuls large.
FEATURE_CHUNK_BYTES = 8 * 2**20

QueryFeatureFn = Callable[[torch.Tensor], torch.Tensor]  # (b, h, c, d) -> (b, h, c, m)
# (keys (b, h, c, d), keep (b, 1, c, 1) bool or None) -> (b, h, c, m), exactly 0 where keep is False
KeyFeatureFn = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]


def append_ones(value: torch.Tensor) -> torch.Tensor:
    """(b, h, n, d) -> (b, h, n, d + 1): the extra column of ones accumulates the normaliser z."""
    return F.pad(value, (0, 1), value=1.0)


def normalise(result: torch.Tensor, eps: float) -> torch.Tensor:
    """(..., d + 1) numerator and denominator side by side -> (..., d) attention output."""
    numerator, denominator = result.split([result.shape[-1] - 1, 1], dim=-1)  # split: one cat in backward
    return numerator / (denominator + eps)


def kernelized_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    query_features: QueryFeatureFn,
    key_features: KeyFeatureFn,
    num_features: int,
    *,
    causal: bool,
    eps: float,
    block_size: int = 64,
    budget: int | None = None,
) -> torch.Tensor:
    """Linear attention with feature maps applied chunk by chunk; see the module docstring.

    Args:
        query, key, value: (b, h, n, d).
        attention_mask: (b, n) bool, True = real token, or None.
        query_features: phi_q on a chunk of queries.
        key_features: phi_k on a chunk of keys and its padding mask; padded rows must come out exactly 0.
        num_features: m, the feature dimension (for chunk sizing).
        causal: query i sees keys j <= i only.
        eps: added to the denominator.
        block_size: causal block length (the masked quadratic form works on blocks of this size).
        budget: bytes allowed for the largest intermediate of one chunk (default: FEATURE_CHUNK_BYTES,
            or utils.CHUNK_BYTES for the causal form, which prefers larger groups).

    Returns:
        (b, h, n, d) output.
    """
    b, h, n, _ = value.shape
    keep = None if attention_mask is None else attention_mask[:, None, :, None]  # (b, 1, n, 1)
    if keep is not None:
        value = value.masked_fill(~keep, 0.0)
    value = append_ones(value)  # (b, h, n, d + 1)
    itemsize = value.element_size()
    if causal:
        block = min(block_size, n)
        # Larger groups pay off here (fewer, bigger batched ops): size them by the largest single
        # intermediate per token (features, block scores or a share of the block states), under CHUNK_BYTES.
        widest = max(num_features, block, num_features * value.shape[-1] // block)
        rows = rows_per_chunk(b * h * itemsize * widest, n, budget or CHUNK_BYTES)
        rows = max(block, rows // block * block)
    else:
        rows = rows_per_chunk(b * h * num_features * itemsize, n, budget or FEATURE_CHUNK_BYTES)
    if is_tracing():  # one chunk: a traced graph (torch.export / torch.compile) has no loop over chunks
        chunks = [(query, key, value, keep)]
        if causal:  # blocks of block_size even for shorter inputs (min(block_size, n) would guard on n)
            return _causal(chunks, query_features, key_features, block_size, eps)
        return _non_causal(chunks, query_features, key_features, eps, query.dtype)
    # split (not slicing per chunk): backward concatenates once instead of zero-filling a full-size
    # gradient per slice.
    chunks = zip(
        query.split(rows, dim=2),
        key.split(rows, dim=2),
        value.split(rows, dim=2),
        itertools.repeat(None) if keep is None else keep.split(rows, dim=2),
        strict=False,
    )
    if causal:
        return _causal(chunks, query_features, key_features, block, eps)
    return _non_causal(list(chunks), query_features, key_features, eps, query.dtype)


def _non_causal(chunks, query_features: QueryFeatureFn, key_features: KeyFeatureFn, eps: float, dtype):
    """Non-causal form over chunks of (queries, keys, [values, 1], keep): the state [S | z] summed over the
    key chunks, then every query chunk against it."""
    state = None  # (b, h, m, d + 1): [S | z]
    for _, k, v, kp in chunks:
        part = (key_features(k, kp).transpose(-1, -2) @ v).to(accumulate_dtype(v))  # (b, h, m, d + 1)
        state = part if state is None else state + part
    outputs = [  # (b, h, c, d) each
        normalise(query_features(q).to(state.dtype) @ state, eps).to(dtype) for q, _, _, _ in chunks
    ]
    return torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]


def accumulate_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 for half-precision tensors (running sums, normalisers), else the tensor's own dtype."""
    return torch.promote_types(x.dtype, torch.float32)


def _causal(chunks, query_features: QueryFeatureFn, key_features: KeyFeatureFn, block: int, eps: float):
    """Causal form over chunks of whole blocks (the last may be short), carrying the running [S | z]."""
    state = None  # (b, h, m, d + 1): running [S | z] of all earlier chunks
    outputs = []
    causal_mask = None
    for q, k, v, kp in chunks:
        c, extra = q.shape[2], (-q.shape[2]) % block  # zero rows: no key contribution, cut below
        phi_q = F.pad(query_features(q), (0, 0, 0, extra))  # (b, h, r, m)
        phi_k = F.pad(key_features(k, kp), (0, 0, 0, extra))  # (b, h, r, m)
        v = F.pad(v, (0, 0, 0, extra))  # (b, h, r, d + 1)
        b, h, r, m = phi_q.shape
        d1, g = v.shape[-1], r // block
        phi_q = phi_q.reshape(b, h, g, block, m)  # (b, h, g, block, m)
        phi_k = phi_k.reshape(b, h, g, block, m)  # (b, h, g, block, m)
        v = v.reshape(b, h, g, block, d1)  # (b, h, g, block, d + 1)
        work = accumulate_dtype(v)
        local = (phi_k.transpose(-1, -2) @ v).to(work)  # (b, h, g, m, d + 1): each block's own state
        inclusive = local.cumsum(dim=2)  # (b, h, g, m, d + 1)
        before = F.pad(inclusive[:, :, :-1], (0, 0, 0, 0, 1, 0))  # exclusive prefix sum
        if state is not None:
            inclusive, before = inclusive + state[:, :, None], before + state[:, :, None]
        if causal_mask is None:
            causal_mask = torch.ones(block, block, dtype=torch.bool, device=v.device).tril()
        scores = (phi_q @ phi_k.transpose(-1, -2)).masked_fill_(~causal_mask, 0.0)  # (b, h, g, block, block)
        result = phi_q.to(work) @ before + (scores @ v).to(work)  # (b, h, g, block, d + 1)
        result = result.reshape(b, h, r, d1)[:, :, :c]  # (b, h, c, d + 1), zero rows cut before dividing
        outputs.append(normalise(result, eps).to(v.dtype))
        state = inclusive[:, :, -1]
    return torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]


def recurrent_step(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    value: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor] | None,
    eps: float,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One token of the causal (RNN) form: S += phi_k v^T, z += phi_k, out = phi_q^T S / (phi_q^T z + eps).

    Args:
        phi_q, phi_k: (b, h, m) features of the current query and key.
        value: (b, h, d) current value.
        state: (S (b, h, m, d), z (b, h, m)) after the previous token, or None at the start.

    Returns:
        (out (b, h, d), new state).
    """
    if state is None:
        state = (phi_k.new_zeros(*phi_k.shape, value.shape[-1]), torch.zeros_like(phi_k))
    s, z = state
    s = s + phi_k[..., :, None] * value[..., None, :]  # (b, h, m, d) outer product
    z = z + phi_k
    numerator = (phi_q[..., None, :] @ s).squeeze(-2)  # (b, h, d)
    denominator = (phi_q * z).sum(-1, keepdim=True)  # (b, h, 1)
    return numerator / (denominator + eps), (s, z)
