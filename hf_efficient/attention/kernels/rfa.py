"""The chunked kernel of Random Feature Attention (``rfa``): its reference's maths in O(n d + m d) memory.

- Non-causal (:class:`_NonCausalRFA`): the state [S | z] is summed over chunks of the keys, then every
  chunk of queries is computed against it; a hand-written backward recomputes the features chunk by chunk,
  so no (n x 2m) feature tensor is stored or built in one piece. The state is kept as two halves, S_sin and
  S_cos = (1/m) sum_j {sin, cos}(W k^_j) [v_j, 1]^T, each (b * h, m, d + 1);
  phi(q)^T [S | z] = sin(W q^) S_sin + cos(W q^) S_cos.
- Causal (:func:`causal_in_blocks`): blocks of ``causal_chunk`` tokens, the masked quadratic form inside a
  block with decays in log space (exp(L_t - L_j) <= 1 with L the cumulative log gate within the block, so no
  overflow however small the gates), the state carried across blocks; groups of blocks are recomputed in
  backward (activation checkpointing). Starting from a state, it is the prefill of incremental decoding.

The kernel does not trace (its loops follow n): while tracing, ``"auto"`` takes the reference.
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..base import AttentionOutput, Kernel
from ..utils import (
    CHUNK_BYTES,
    device_chunk_budget,
    extend_padding_mask,
    pad_to_multiple,
    row_slices,
    rows_per_chunk,
)

_FEATURE_CHUNK_BYTES = 4 * 2**20  # per-chunk (b, h, rows, 2m) features


def _unit(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., d) -> (x / |x|, |x| floored) with the floor of F.normalize."""
    norm = x.norm(dim=-1, keepdim=True).clamp_min(1e-12)  # (..., 1)
    return x / norm, norm


def _sin_cos(unit: torch.Tensor, weight_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sin(W x), cos(W x)) without the sqrt(1/m), each (b, h, c, m) and contiguous.

    Kept as two tensors rather than one [sin, cos] row: writing halves of rows in place was slower with
    several threads, and a concatenation costs a copy.
    """
    u = torch.matmul(unit, weight_t)  # (b, h, c, d) @ (h, d, m) -> (b, h, c, m)
    return u.sin(), u.cos_()


def _flat(x: torch.Tensor) -> torch.Tensor:
    """(b, h, c, f) -> (b * h, c, f) for batched matmuls."""
    return x.reshape(-1, *x.shape[2:])


def _values_and_ones(value, mask, piece):
    """[v, 1] of keys in ``piece``, (b * h, c, d + 1); zero rows (ones column included) where padded.

    The column of ones accumulates z beside S, so one matmul gives numerator and denominator, and zero
    rows remove padded keys from both without masking the features.
    """
    v_one = F.pad(value[:, :, piece], (0, 1), value=1.0)  # (b, h, c, d + 1)
    return _flat(v_one if mask is None else v_one.masked_fill(~mask[:, None, piece, None], 0.0))


class _NonCausalRFA(torch.autograd.Function):
    """Chunked non-causal RFA; backward recomputes the features chunk by chunk (memory O(n d))."""

    @staticmethod
    def forward(ctx, query, key, value, base, sigma, mask, eps: float):
        b, h, n, d = query.shape
        m = base.shape[1]
        weight_t = (sigma * base).transpose(1, 2)  # (h, d, m): W^T with W = sigma * W~
        budget = device_chunk_budget(_FEATURE_CHUNK_BYTES, query.device)
        rows = rows_per_chunk(b * h * 2 * m * query.element_size(), n, budget)
        state_sin, state_cos = (query.new_zeros(b * h, m, d + 1) for _ in range(2))
        for piece in row_slices(n, rows):
            sin_k, cos_k = _sin_cos(_unit(key[:, :, piece])[0], weight_t)  # (b, h, c, m) each
            v_one = _values_and_ones(value, mask, piece)  # (b * h, c, d + 1)
            state_sin.baddbmm_(_flat(sin_k).transpose(1, 2), v_one)
            state_cos.baddbmm_(_flat(cos_k).transpose(1, 2), v_one)
        state_sin.div_(m), state_cos.div_(m)
        # same memory layout as the query: with heads split off (b, n, h, d) projections, merging heads
        # back afterwards is a free view, and the gradients below need no copy either
        out, den = torch.empty_like(query), query.new_empty(b, h, n)
        for piece in row_slices(n, rows):
            sin_q, cos_q = _sin_cos(_unit(query[:, :, piece])[0], weight_t)
            result = torch.bmm(_flat(sin_q), state_sin).baddbmm_(_flat(cos_q), state_cos)  # (b*h, c, d+1)
            result = result.view(b, h, -1, d + 1)  # (b, h, c, d + 1)
            den[:, :, piece] = result[..., d]
            torch.div(result[..., :d], result[..., d:].abs().clamp_min(eps), out=out[:, :, piece])
        ctx.save_for_backward(query, key, value, base, sigma, mask, state_sin, state_cos, out, den)
        ctx.eps, ctx.rows = eps, rows
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, base, sigma, mask, state_sin, state_cos, out, den = ctx.saved_tensors
        b, h, n, d = query.shape
        m, rows, eps = base.shape[1], ctx.rows, ctx.eps
        weight_t = (sigma * base).transpose(1, 2)  # (h, d, m)
        grad_q, grad_k, grad_v = torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)
        grad_sigma = sigma.new_zeros(b, h, 1, d) if ctx.needs_input_grad[4] else None
        grad_sin, grad_cos = (query.new_zeros(b * h, m, d + 1) for _ in range(2))  # d loss / d (m * state)

        def through_features(grad_of_sin, grad_of_cos, sin, cos, unit, norm):
            # d sin(u) / du = cos(u), d cos(u) / du = -sin(u)
            grad_u = grad_of_sin.view_as(sin).mul_(cos).addcmul_(grad_of_cos.view_as(sin), sin, value=-1.0)
            # u = (x^ * sigma) @ W~^T: with t = grad_u @ W~, d/dx^ = t * sigma and d/dsigma = sum x^ * t
            grad_unit = grad_u @ base  # (b, h, c, d)
            if grad_sigma is not None:
                grad_sigma.add_((grad_unit * unit).sum(2, keepdim=True))
            grad_unit.mul_(sigma)  # through x -> x / |x|: (g - x^ (x^ . g)) / |x|
            return grad_unit.sub_(unit * (unit * grad_unit).sum(-1, keepdim=True)).div_(norm)

        for piece in row_slices(n, rows):
            unit, norm = _unit(query[:, :, piece])  # (b, h, c, d), (b, h, c, 1)
            sin_q, cos_q = _sin_cos(unit, weight_t)  # (b, h, c, m) each
            den_c = den[:, :, piece, None]  # (b, h, c, 1)
            grad_result = grad_out.new_empty(*unit.shape[:-1], d + 1)  # d loss / d [numerator, denominator]
            torch.div(grad_out[:, :, piece], den_c.abs().clamp_min(eps), out=grad_result[..., :d])
            grad_den = (grad_result[..., :d] * out[:, :, piece]).sum(-1, keepdim=True)  # (b, h, c, 1)
            grad_result[..., d:] = grad_den.mul_(-den_c.sign() * (den_c.abs() > eps))
            grad_result = _flat(grad_result)  # (b * h, c, d + 1)
            grad_sin.baddbmm_(_flat(sin_q).transpose(1, 2), grad_result)
            grad_cos.baddbmm_(_flat(cos_q).transpose(1, 2), grad_result)
            grad_of_sin = grad_result @ state_sin.transpose(1, 2)  # (b * h, c, m)
            grad_of_cos = grad_result @ state_cos.transpose(1, 2)
            grad_q[:, :, piece] = through_features(grad_of_sin, grad_of_cos, sin_q, cos_q, unit, norm)
        grad_sin.div_(m), grad_cos.div_(m)
        for piece in row_slices(n, rows):
            unit, norm = _unit(key[:, :, piece])
            sin_k, cos_k = _sin_cos(unit, weight_t)
            grad_value = torch.bmm(_flat(sin_k), grad_sin[..., :d]).baddbmm_(_flat(cos_k), grad_cos[..., :d])
            grad_v[:, :, piece] = grad_value.view(b, h, -1, d)
            v_one = _values_and_ones(value, mask, piece)  # zero rows where padded: no key gradient there
            grad_of_sin, grad_of_cos = v_one @ grad_sin.transpose(1, 2), v_one @ grad_cos.transpose(1, 2)
            grad_k[:, :, piece] = through_features(grad_of_sin, grad_of_cos, sin_k, cos_k, unit, norm)
        if mask is not None:
            grad_v.masked_fill_(~mask[:, None, :, None], 0.0)
        return grad_q, grad_k, grad_v, None, None if grad_sigma is None else grad_sigma.sum(0), None, None


def causal_in_blocks(core, query, key, value, mask, state=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The core's causal form in blocks of ``causal_chunk`` tokens, batched over a group of blocks; state
    carried across blocks, starting from ``state`` ([S | z] (b, h, 2m, d + 1) of earlier tokens, or None).
    Returns (output, the [S | z] after the last token)."""
    b, h, n, d = query.shape
    size, m2 = min(core.config.causal_chunk, n), 2 * core.config.num_features
    mask = extend_padding_mask(mask, b, n, size, query.device)
    query, key, value = (pad_to_multiple(t, size) for t in (query, key, value))  # (b, h, N, d)
    value = F.pad(value, (0, 1), value=1.0)  # (b, h, N, d + 1): ones accumulate z beside S
    if mask is not None:
        keep = mask[:, None, :, None]  # (b, 1, N, 1)
        key, value = key.masked_fill(~keep, 0.0), value.masked_fill(~keep, 0.0)  # padded: no contribution
    log_g, log_keep = core.log_gates(key, mask)  # (b, h, N); padded steps (the block's tail too): g = 1
    tril = torch.ones(size, size, dtype=torch.bool, device=query.device).tril()
    per_token = b * h * query.element_size() * (4 * m2 + 4 * size + 2 * m2 * (d + 1) // size)
    # blocks per group: on CUDA 16x more (each group is a fixed number of launches, see utils)
    budget = device_chunk_budget(CHUNK_BYTES, query.device)
    blocks = max(1, rows_per_chunk(per_token, query.shape[2], budget) // size)
    if state is None:
        state = query.new_zeros(b, h, m2, d + 1)  # [S | z] before the current group
    state = state.to(query.dtype)
    # split (not slice): in backward each piece's gradient is joined once, not zero-padded per group
    pieces = zip(*(t.split(blocks * size, dim=2) for t in (query, key, value, log_g, log_keep)), strict=True)
    # each group is recomputed in backward (checkpoint): autograd keeps O(n d) instead of all features
    recompute = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value, log_g))
    group = partial(_causal_group, core)
    outputs = []
    for part in pieces:
        if recompute:
            out, state = checkpoint(group, state, *part, tril, use_reentrant=False)
        else:
            out, state = group(state, *part, tril)
        outputs.append(out)
    return torch.cat(outputs, dim=2)[:, :, :n], state


def _causal_group(core, state, q_part, k_part, v_part, log_g_part, log_keep_part, tril):
    """One group of g blocks of c tokens: outputs (b, h, g * c, d) and the [S | z] state after it."""
    (b, h, rows, d), size = q_part.shape, tril.shape[0]
    g, m2 = rows // size, state.shape[2]
    phi_q = core.feature_map(q_part).view(b, h, g, size, m2)  # (b, h, g, c, 2m)
    phi_k = core.feature_map(k_part).view(b, h, g, size, m2)  # (b, h, g, c, 2m)
    v_one = v_part.reshape(b, h, g, size, d + 1)  # (b, h, g, c, d + 1)
    cum = log_g_part.reshape(b, h, g, size).cumsum(-1)  # L_t within each block
    keep_log = log_keep_part.reshape(b, h, g, size)  # log(1 - g_j)
    # weight of key j at query t: (1 - g_j) prod_{j < l <= t} g_l = exp(L_t - L_j + log(1 - g_j))
    logits = cum[..., :, None] - cum[..., None, :] + keep_log[..., None, :]  # (b, h, g, c, c)
    scores = (phi_q @ phi_k.transpose(-1, -2)) * logits.masked_fill(~tril, -math.inf).exp()
    tail = (cum[..., -1:] - cum + keep_log).exp()[..., None]  # (b, h, g, c, 1): weight at block end
    local = (phi_k * tail).transpose(-1, -2) @ v_one  # (b, h, g, 2m, d + 1): each block's own state
    # the states at the blocks' starts (b, h, g, 2m, d + 1) and after the group (b, h, 2m, d + 1)
    before, state = _block_prefix_states(state, local, cum[..., -1])
    result = scores @ v_one + cum.exp()[..., None] * (phi_q @ before)  # (b, h, g, c, d + 1)
    out = result[..., :d] / result[..., d:].abs().clamp_min(core.config.eps)
    return out.reshape(b, h, g * size, d), state  # (b, h, g * c, d)


def _block_prefix_states(state, local, block_log_decay):
    """The state at each block's start and after the last: S_start(g) = D(0, g) state + sum_{g' < g}
    D(g' + 1, g) local_g', with D(a, g) = exp(sum_{a <= l < g} block_log_decay_l) <= 1, for all blocks at once
    (one (g + 1) x g product instead of a scan of g steps: on a GPU each step was a few kernel launches).

    Args:
        state: (b, h, 2m, d + 1), [S | z] before the group.
        local: (b, h, g, 2m, d + 1), each block's own contribution at its end.
        block_log_decay: (b, h, g), the sum of the log gates across each block (<= 0).

    Returns:
        ((b, h, g, 2m, d + 1) states at the blocks' starts, (b, h, 2m, d + 1) the state after the group).
    """
    b, h, g = block_log_decay.shape
    after = block_log_decay.cumsum(-1)  # (b, h, g): log decay from the group's start to each block's end
    start = F.pad(after, (1, 0))  # (b, h, g + 1): ... to each block's start, and to the group's end
    rows = torch.arange(g + 1, device=local.device)[:, None]
    earlier = rows > torch.arange(g, device=local.device)[None, :]  # (g + 1, g): block g' before row
    # exp(start_row - after_g'): non-positive exponents where earlier (masked before exp: no overflow)
    weights = (start[..., :, None] - after[..., None, :]).masked_fill(~earlier, -math.inf).exp()
    states = (weights @ local.flatten(-2)).unflatten(-1, local.shape[-2:])  # (b, h, g + 1, 2m, d + 1)
    states = states + start.exp()[..., None, None] * state[:, :, None]
    return states[:, :, :g], states[:, :, g]


def _attend_chunked(core, query, key, value, inputs, state=None, return_state=False):
    mask, final = inputs.attention_mask, None
    if inputs.is_causal:
        out, final = core.causal_in_float32(partial(causal_in_blocks, core), query, key, value, mask, state)
    else:
        base, sigma = core.random_weights.to(query.dtype), core.scales().to(query.dtype)
        out = _NonCausalRFA.apply(query, key, value, base, sigma, mask, core.config.eps)
    return (AttentionOutput(out, None), final) if return_state else AttentionOutput(out, None)


# Taken by "auto" for every call it can run (not while tracing).
CHUNKED = Kernel("chunked", _attend_chunked, carries_state=True)
