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
when autograd records, it keeps only its inputs and the generator's state instead: forward computes blocks of
(sequences, heads, query rows) of at most ``CHUNK_BYTES`` of pairs, and backward recomputes one block's
probabilities and mask at a time, the same draws, as FlashAttention recomputes its probabilities.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ..compat import safe_softmax
from .inputs import is_tracing
from .utils import row_slices, rows_per_chunk

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
    if _recomputes(query, key, value, attn_mask, dropout_p):
        scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
        if attn_mask is not None and attn_mask.dim() < 4:  # (S,), (L, S), (h, L, S): as 4 dimensions
            attn_mask = attn_mask.view((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
        return _RecomputedDropoutAttention.apply(query, key, value, attn_mask, dropout_p, scale)
    return _math_with_dropout(query, key, value, attn_mask, dropout_p, scale)


def _recomputes(query, key, value, attn_mask, dropout_p) -> bool:
    """Whether this call recomputes its probabilities in backward: autograd records, over at least
    ``RECOMPUTE_MIN_KEYS`` keys, 4-dimensional (B, h, L, d) inputs with a key per query head, and a p that
    drops some elements and keeps some."""
    return (
        torch.is_grad_enabled()
        and key.shape[-2] >= RECOMPUTE_MIN_KEYS
        and query.dim() == key.dim() == value.dim() == 4
        and query.shape[:2] == key.shape[:2] == value.shape[:2]
        and (attn_mask is None or attn_mask.dim() <= 4)
        and 0 < _dropped_lanes(dropout_p) < LANES
    )


def _blocks(shape: torch.Size, keys: int) -> list[tuple[slice, slice, slice]]:
    """(batch, heads, query rows) slices that cover queries of ``shape`` (B, h, L, d) in blocks of at most
    ``CHUNK_BYTES`` of a block's pairs (``SAVED_BYTES_PER_PAIR`` each over ``keys`` keys): rows of one
    sequence's head when a head's (L, S) pairs are too many, else whole heads, else whole sequences."""
    b, h, length = shape[:3]
    per_row = SAVED_BYTES_PER_PAIR * keys  # one query row of one head
    rows = rows_per_chunk(per_row, length)
    heads = rows_per_chunk(per_row * length, h) if rows == length else 1
    items = rows_per_chunk(per_row * length * h, b) if heads == h else 1
    return [
        (items_, heads_, rows_)
        for items_ in row_slices(b, items)
        for heads_ in row_slices(h, heads)
        for rows_ in row_slices(length, rows)
    ]


def _cut(mask: torch.Tensor, items: slice, heads: slice, rows: slice) -> torch.Tensor:
    """The block of a (B|1, h|1, L|1, S) mask (a view): a broadcast dimension is kept whole."""
    parts = zip((items, heads, rows), mask.shape[:3], strict=True)
    return mask[tuple(part if size > 1 else slice(None) for part, size in parts)]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the math runs in: float32 for half-precision inputs (as torch's math path), else their own."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _block_probabilities(query, key, mask, scale) -> torch.Tensor:
    """softmax(q k^T scale + mask) in the inputs' dtype, a row without an allowed key zeros."""
    scores = (query * scale) @ key.transpose(-1, -2)  # (b, h, rows, S)
    if mask is not None:
        scores = scores.masked_fill_(~mask, float("-inf")) if mask.dtype == torch.bool else scores.add_(mask)
    return safe_softmax(scores, -1)


class _RecomputedDropoutAttention(torch.autograd.Function):
    """sdpa's math path with the fast dropout mask, FlashAttention's way round: forward computes block after
    block of (:func:`_blocks`) and keeps only its inputs and the CPU generator's state; backward draws the
    same masks again from that state, block after block, and writes each block's gradients into gradients
    allocated once (dq by block, dk, dv and an additive mask's gradient summed over the blocks).

    Why not ``torch.utils.checkpoint`` over chunks of rows: every chunk's backward gave a whole (B, h, S, d)
    gradient of the keys and of the values to add up and a whole one of the queries (a slice's backward), and
    each chunk's small output pinned the arena between the freed intermediates: at 16 x 2,210 tokens one
    layer's forward held 6.7 GB of freed memory (resident), and the training step ran out of 20 GB."""

    @staticmethod
    def forward(ctx, query, key, value, attn_mask, dropout_p: float, scale: float):
        ctx.rng_state = torch.get_rng_state()
        dropped = _dropped_lanes(dropout_p)
        keep_scale = LANES / (LANES - dropped)  # 1 / (1 - p')
        out = torch.empty((*query.shape[:-1], value.shape[-1]), dtype=query.dtype)  # (B, h, L, dv)
        dtype = _compute_dtype(query.dtype)
        for items, heads, rows in _blocks(query.shape, key.shape[-2]):
            mask = None if attn_mask is None else _cut(attn_mask, items, heads, rows)
            q, k = query[items, heads, rows].to(dtype), key[items, heads].to(dtype)
            probs = _block_probabilities(q, k, mask, scale)  # (b, h, rows, S)
            probs.mul_(keep_mask(probs.shape, dropout_p)).mul_(keep_scale)
            out[items, heads, rows] = probs @ value[items, heads].to(dtype)
        ctx.save_for_backward(query, key, value, attn_mask)
        ctx.dropout_p, ctx.scale, ctx.keep_scale = dropout_p, scale, keep_scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        query, key, value, attn_mask = ctx.saved_tensors
        scale, keep_scale = ctx.scale, ctx.keep_scale
        dtype = _compute_dtype(query.dtype)
        grad_query = torch.empty(query.shape, dtype=dtype)
        grad_key = torch.zeros(key.shape, dtype=dtype)
        grad_value = torch.zeros(value.shape, dtype=dtype)
        grad_mask = torch.zeros(attn_mask.shape, dtype=dtype) if ctx.needs_input_grad[3] else None
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(ctx.rng_state)  # the forward's masks, drawn again in the same order
            for items, heads, rows in _blocks(query.shape, key.shape[-2]):
                q, k = query[items, heads, rows].to(dtype), key[items, heads].to(dtype)
                v = value[items, heads].to(dtype)
                mask = None if attn_mask is None else _cut(attn_mask, items, heads, rows)
                probs = _block_probabilities(q, k, mask, scale)  # (b, h, rows, S)
                keep = keep_mask(probs.shape, ctx.dropout_p)
                grad = grad_out[items, heads, rows].to(dtype)  # (b, h, rows, dv)
                grad_value[items, heads] += (probs * keep).mul_(keep_scale).transpose(-1, -2) @ grad
                grad_probs = (grad @ v.transpose(-1, -2)).mul_(keep).mul_(keep_scale)
                # softmax's backward: P * (dP - sum(dP * P))
                grad_scores = grad_probs.sub_((grad_probs * probs).sum(-1, keepdim=True)).mul_(probs)
                grad_query[items, heads, rows] = (grad_scores @ k).mul_(scale)
                grad_key[items, heads] += (grad_scores.transpose(-1, -2) @ q).mul_(scale)
                if grad_mask is not None:
                    block = _cut(grad_mask, items, heads, rows)
                    block += grad_scores.sum_to_size(block.shape)
        grads = (grad_query.to(query.dtype), grad_key.to(key.dtype), grad_value.to(value.dtype))
        return *grads, None if grad_mask is None else grad_mask.to(attn_mask.dtype), None, None


def _math_with_dropout(query, key, value, attn_mask, dropout_p, scale) -> torch.Tensor:
    """torch's math path of sdpa with :func:`fast_dropout`'s mask (see :func:`sdpa`)."""
    dtype, compute = query.dtype, _compute_dtype(query.dtype)
    query, key, value = query.to(compute), key.to(compute), value.to(compute)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    probs = fast_dropout(_block_probabilities(query, key, attn_mask, scale), dropout_p)  # (B, h, L, S)
    return (probs @ value).to(dtype)
