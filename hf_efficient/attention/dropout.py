"""Dropout drawn fast on CPU, for the attention probabilities and the encoders' hidden states.

torch's CPU dropout draws one float per element (``bernoulli_``) and keeps a float noise tensor for backward
(4 bytes per element); inside ``scaled_dot_product_attention`` training takes the same draws on its
(b, h, n, n) probabilities. Here one 64-bit draw gives four 16-bit lanes, each compared with a threshold, and
autograd keeps only the bool mask (1 byte per element). An element is kept with probability 1 - p', p' being
p rounded to a multiple of 1/65536 (within 7.7e-6 of p: 0.1 becomes 0.100006), and the kept values are
scaled by 1 / (1 - p'): the output's expectation is the input's, exactly as dropout's. Forward +
backward on a (8, 12, 128, 128) float32 tensor: 1.4x as fast as ``F.dropout`` on one thread, 1.9x on two
(benchmarks/docs/performance.md).

Off CPU (one fused CUDA kernel keeps a bool mask already), while tracing, and for a p that rounds to 0 or 1,
``F.dropout`` itself runs. The masks come from torch's default CPU generator: ``torch.manual_seed`` repeats
them.

:func:`sdpa` with dropout on CPU is torch's math path written out, and that path keeps the (B, h, L, S)
probabilities, their dropout mask and the dropped probabilities for backward: 9 bytes per query-key pair,
8.4 GB for one 12-head layer over 16 sequences of 2,210 tokens. Over at least ``RECOMPUTE_MIN_KEYS`` keys,
when autograd records, it keeps only its inputs instead: the queries go through in chunks of rows, each under
``torch.utils.checkpoint``, which saves the generator's state with them, and backward recomputes one chunk's
probabilities and mask at a time, the same draws, as FlashAttention recomputes its probabilities.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..compat import safe_softmax
from .inputs import is_tracing
from .utils import chunk_bounds, rows_per_chunk

LANES = 1 << 16  # the values of one 16-bit lane: p is rounded to a multiple of 1 / LANES
MASK_CHUNK = 1 << 20  # mask elements drawn per step: the 64-bit draws take a quarter of a chunk's bytes
# From this many keys on, sdpa's dropout path recomputes its probabilities in backward instead of keeping
# them: there a query's saved pairs (9 bytes x heads x keys: 110 KB for 12 heads) outweigh what a BERT layer
# keeps per token elsewhere, and the chunked recomputation measured faster, not slower, than keeping them
# (benchmarks/docs/performance.md, the table of kernel settings).
RECOMPUTE_MIN_KEYS = 1024
SAVED_BYTES_PER_PAIR = 9  # float32 probabilities, the bool mask, the float32 dropped probabilities


def _dropped_lanes(p: float) -> int:
    """How many of the LANES lane values drop an element: round(p * LANES)."""
    return round(p * LANES)


def keep_mask(shape: torch.Size | tuple[int, ...], p: float) -> torch.Tensor:
    """A CPU bool tensor of ``shape``, each element True with probability 1 - round(p * 65536) / 65536.

    Drawn ``MASK_CHUNK`` elements at a time into the mask itself: 64-bit integers uniform over their whole
    range, read as four signed 16-bit lanes (uniform over [-32768, 32767]) and kept where a lane is at least
    -32768 + round(p * 65536)."""
    dropped = _dropped_lanes(p)
    if not 0 < dropped < LANES:  # every lane value keeps, or none (a threshold outside int16)
        return torch.full(shape, dropped <= 0, dtype=torch.bool)
    threshold = -(LANES // 2) + dropped
    keep = torch.empty(shape, dtype=torch.bool)
    flat = keep.view(-1)
    for start in range(0, flat.numel(), MASK_CHUNK):
        part = flat[start : start + MASK_CHUNK]
        draws = torch.empty(math.ceil(part.numel() / 4), dtype=torch.int64).random_(-(2**63), 2**63 - 1)
        torch.ge(draws.view(torch.int16)[: part.numel()], threshold, out=part)
    return keep


def fast_dropout(input: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``F.dropout(input, p, training)`` with the mask of :func:`keep_mask` on CPU (p rounded to a multiple
    of 1/65536), keeping that bool mask for backward; ``F.dropout`` elsewhere (see the module's docstring)."""
    if not training or p == 0.0:
        return input
    dropped = _dropped_lanes(p)
    if input.device.type != "cpu" or is_tracing() or not 0 < dropped < LANES:
        return F.dropout(input, p, training)
    scale = LANES / (LANES - dropped)  # 1 / (1 - p')
    return _MaskedScale.apply(input, keep_mask(input.shape, p), scale)


class _MaskedScale(torch.autograd.Function):
    """input * keep * scale, keeping only the bool ``keep`` for backward, whose gradient is
    ``native_dropout``'s own backward op: one pass and one new tensor. Written as ``mul`` then ``mul_``,
    autograd's backward makes two, and the training step's peak memory rose above ``native_dropout``'s;
    with this Function it does not."""

    @staticmethod
    def forward(ctx, input: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return input.mul(keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return torch.ops.aten.native_dropout_backward(grad, keep, ctx.scale), None, None


def sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` (no causal flag), its attention dropout from :func:`fast_dropout`.

    With dropout on CPU torch takes its math path anyway (the fused CPU kernel has no dropout), so this writes
    that path out: softmax(q k^T scale + mask) over the keys, a row without an allowed key giving zeros as
    torch's does, then the dropout, then the values; half-precision inputs computed in float32 as there.
    Query (B, h, L, d), key and value (B, h, S, d), ``attn_mask`` bool (True: attend) or additive,
    broadcast to (B, h, L, S). Without dropout, off CPU or while tracing: torch's function."""
    if dropout_p == 0.0 or query.device.type != "cpu" or is_tracing():
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale
        )
    if key.shape[-2] >= RECOMPUTE_MIN_KEYS and torch.is_grad_enabled():
        return _recomputed_in_backward(query, key, value, attn_mask, dropout_p, scale)
    return _math_with_dropout(query, key, value, attn_mask, dropout_p, scale)


def _recomputed_in_backward(query, key, value, attn_mask, dropout_p, scale) -> torch.Tensor:
    """:func:`_math_with_dropout` over chunks of query rows, each chunk's intermediates recomputed in backward
    (``checkpoint`` restores the CPU generator's state first, so the dropout masks are drawn again exactly):
    autograd keeps the inputs only, and backward holds one chunk's (B, h, rows, S) pairs at a time."""
    b, h, length, _ = query.shape
    per_row = SAVED_BYTES_PER_PAIR * b * h * key.shape[-2]
    rows = rows_per_chunk(per_row, length)
    per_query = attn_mask is not None and attn_mask.dim() >= 2 and attn_mask.shape[-2] == length
    outputs = []
    for start, stop in chunk_bounds(length, rows):
        mask = attn_mask[..., start:stop, :] if per_query else attn_mask  # a (.., 1, S) mask serves every row
        outputs.append(
            checkpoint(
                _math_with_dropout,
                query[..., start:stop, :],
                key,
                value,
                mask,
                dropout_p,
                scale,
                use_reentrant=False,
            )
        )
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-2)


def _math_with_dropout(query, key, value, attn_mask, dropout_p, scale) -> torch.Tensor:
    """torch's math path of sdpa with :func:`fast_dropout`'s mask (see :func:`sdpa`)."""
    dtype = query.dtype
    if dtype in (torch.float16, torch.bfloat16):
        query, key, value = query.float(), key.float(), value.float()
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = (query * scale) @ key.transpose(-1, -2)  # (B, h, L, S)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    probs = fast_dropout(safe_softmax(scores, -1), dropout_p)
    return (probs @ value).to(dtype)
