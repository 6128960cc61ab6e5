"""Reformer LSH attention's kernel ("chunked"): the sorted-chunk attention as a flash-style autograd Function.

It computes :meth:`~hf_efficient.attention.reformer_lsh.ReformerLSHAttention.reference` on the core's own
buckets (``core.rows`` pads and lays out the heads, ``core.hash_buckets`` hashes them with
``core.rotations``, the core's random state, shared by both paths), and differs from it in how, not what:

* heads are hashed and attended a slice at a time, so the O(n) intermediates of a slice (hash projections,
  sorted copies) stay within ``CHUNK_BYTES``;
* :class:`_LSHAttentionFunction` computes the windows of ``TILE_BYTES`` of scores at a time and recomputes
  them in backward (both budgets ``CUDA_CHUNK_FACTOR`` times larger on CUDA, where a tile's cost is its
  launches), so nothing of size n x chunk_length is kept for backward; dropout masks are replayed
  from a saved seed;
* the window bias (-inf across buckets, -log N_ij inside) is built from float codes per tile
  (:class:`_Plan`), and the keys of a chunk's window are a strided view, not a copy.

``"auto"`` takes it for every call that is not traced (it does not run inside torch.export /
torch.compile graphs; the reference does). Both budgets are module attributes, so tests can make several
slices and tiles of small inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..base import AttentionOutput, Kernel
from ..utils import CHUNK_BYTES, device_chunk_budget, row_slices, rows_per_chunk, unpad

NORM_EPS = 1e-12  # as F.normalize
FLOOR = -80.0  # probabilities below exp(FLOOR) relative to the row's largest are set to 0
TILE_BYTES = 2**22  # scores per tile of _LSHAttentionFunction, the size measured fastest


def chunked_lsh_attention(core, query, key, value, inputs) -> AttentionOutput:
    """The core's LSH attention, a slice of heads at a time (see the module docstring)."""
    b, h, n, d = query.shape
    rows = core.rows(query, value, inputs)  # (b h, N, d) rows, padding zeroed
    big_n = rows.query.shape[1]
    bytes_per_head = 4 * big_n * max(rows.num_buckets // 2, core.config.num_hashes * d)
    outputs = []
    budget = device_chunk_budget(CHUNK_BYTES, query.device)  # larger slices on CUDA: fewer launches
    for s in row_slices(b * h, rows_per_chunk(bytes_per_head, b * h, budget)):
        mask = None if rows.mask is None else rows.mask[s]
        buckets = core.hash_buckets(rows.query[s], rows.rotations, rows.heads[s], rows.num_buckets, mask)
        outputs.append(_lsh_attention(core, rows.query[s], rows.value[s], buckets, rows.num_buckets))
    out = torch.cat(outputs).view(b, h, big_n, d)  # (b, h, N, d)
    return AttentionOutput(unpad(out, n), None)


CHUNKED = Kernel("chunked", chunked_lsh_attention)


def _lsh_attention(core, q, v, buckets, num_buckets) -> torch.Tensor:
    """LSH attention of S rows: q, v (S, N, d), buckets (S, R, N) -> output (S, N, d)."""
    s, big_n, d = q.shape
    rounds, chunk = core.config.num_hashes, core.config.chunk_length
    device = q.device
    with torch.no_grad():
        positions = torch.arange(big_n, device=device)
        # Sort each round by (bucket, position); `order` maps a sorted slot to its token.
        sorted_key, order = (buckets * big_n + positions).sort(-1)  # (S, R, N)
        slot_of_token = torch.empty_like(order).scatter_(-1, order, positions.expand_as(order))
        round_offset = (torch.arange(s * rounds, device=device) * big_n).view(s, rounds, 1)
        row_offset = (torch.arange(s, device=device) * big_n).view(s, 1, 1)
        # bucket ids differ between neighbouring rounds, so a window reaching back into the previous
        # round never matches; small integers, so exact as floats
        parity = (round_offset // big_n) % 2
        slot_bucket = (sorted_key // big_n + parity * (num_buckets + 1)).float()
        plan = _Plan(
            chunk=chunk,
            rounds=rounds,
            tokens=big_n,
            token_of_slot=(order + row_offset).flatten(),
            slot_of_token=(slot_of_token + round_offset).flatten(),
            token_round_of_slot=(order + round_offset).flatten(),
            slot_bucket=_pad_chunk(slot_bucket.flatten(), chunk, value=-1),  # chunk "-1" never matches
        )
        if rounds > 1:
            # code = bucket * (chunks + 1) + chunk: code_i - code_j is 0 or 1 exactly when j is in i's
            # window (same bucket, at most one chunk back) in that round.
            code = buckets * (big_n // chunk + 1) + slot_of_token // chunk  # (S, R, N)
            code = code.float().transpose(1, 2).reshape(s * big_n, rounds)  # (S * N, R) per token
            slot_code = code.index_select(0, plan.token_of_slot).view(s, rounds, big_n, rounds)
            # others[r] = the rounds other than r, in order: o + (o >= r) for o < R - 1, built on the device
            # (a Python list copied there would be a host-device sync)
            other = torch.arange(rounds - 1, device=device)
            others = other + (other >= torch.arange(rounds, device=device)[:, None])  # (R, R - 1)
            others = others.view(1, rounds, 1, rounds - 1)
            other_codes = slot_code.gather(-1, others.expand(s, -1, big_n, -1))  # (S, R, N, R - 1)
            plan.other_codes = _pad_chunk(other_codes.view(-1, rounds - 1), chunk)  # (c + M, R - 1)
            plan.other_key_codes = plan.other_codes + 0.5  # so that |query - key| < 1 means 0 or 1
    dropout = core.spec.dropout if core.training else 0.0
    self_score = core.self_score(q.dtype)
    out_sorted, lse = _LSHAttentionFunction.apply(
        q.reshape(s * big_n, d), v.reshape(s * big_n, d), plan, core.scaling, self_score, dropout
    )  # (S*R*N, d), (S*R*N, 1) in sorted order
    # Back to token order per round, then weight the rounds by their normalisers z^r.
    out_rounds = _Unsort.apply(out_sorted, plan).view(s, rounds, big_n, d)
    lse_rounds = _Unsort.apply(lse, plan).view(s, rounds, big_n, 1)
    weights = torch.softmax(lse_rounds, dim=1)  # (S, R, N, 1)
    return (weights * out_rounds).sum(1)  # (S, N, d)


@dataclass
class _Plan:
    """Index bookkeeping of one slice of heads (M = S * R * N sorted slots, G = M / c chunks).

    token_of_slot: (M,) token row (of S * N) sitting in each sorted slot.
    slot_of_token: (M,) sorted slot of each (row, round, token), i.e. the undo permutation.
    token_round_of_slot: (M,) (row, round, token) index of each slot, the inverse of slot_of_token.
    slot_bucket: (c + M,) bucket id of each slot, unique per (row, round), after one chunk of -1 padding.
    other_codes: (c + M, R - 1) the slot's token codes in the other rounds (see ``_lsh_attention``);
        other_key_codes the same plus 0.5.
    """

    chunk: int
    rounds: int
    tokens: int
    token_of_slot: torch.Tensor
    slot_of_token: torch.Tensor
    token_round_of_slot: torch.Tensor
    slot_bucket: torch.Tensor
    other_codes: torch.Tensor | None = None
    other_key_codes: torch.Tensor | None = None

    def window_bias(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive bias (T, c, 2c) of chunks [start, stop): -inf across buckets, -log N_ij inside."""
        c = self.chunk
        query_ids = self.slot_bucket[(start + 1) * c : (stop + 1) * c].view(-1, c, 1)
        valid = query_ids == _windows(self.slot_bucket, start, stop, c)[:, None]  # (T, c, 2c)
        if self.other_codes is None:
            return torch.zeros(valid.shape, dtype=dtype, device=valid.device).masked_fill_(~valid, -math.inf)
        query_codes = self.other_codes[(start + 1) * c : (stop + 1) * c].view(-1, c, 1, self.rounds - 1)
        key_codes = _windows(self.other_key_codes, start, stop, c)[:, None]  # (T, 1, 2c, R-1)
        count = None  # N_ij - 1: other rounds in which j is in i's window
        for r in range(self.rounds - 1):
            seen = (query_codes[..., r] - key_codes[..., r]).abs_() < 1
            count = seen.to(dtype) if count is None else count.add_(seen)
        # -log N_ij (two rounds need only -log 2 where seen)
        dedup = count.mul_(-math.log(2)) if self.rounds == 2 else count.log1p_().neg_()
        return torch.where(valid, dedup, -math.inf)


def _windows(x: torch.Tensor, start: int, stop: int, c: int) -> torch.Tensor:
    """Overlapping view (T, 2c, ...) of [chunk g-1 ; chunk g] for g in [start, stop).

    x holds one padding chunk and then the sorted slots, so chunk 0's look-back is the padding.
    """
    row = x.stride(0)
    offset = x.storage_offset() + start * c * row
    return x.as_strided((stop - start, 2 * c, *x.shape[1:]), (c * row, *x.stride()), offset)


def _pad_chunk(x: torch.Tensor, c: int, value: float = 0.0) -> torch.Tensor:
    """Prepend one chunk of ``value`` rows: (M, ...) -> (c + M, ...), the look-back of chunk 0."""
    return torch.cat([x.new_full((c, *x.shape[1:]), value), x])


def _tile_probs(plan, q_sorted, k_padded, start, stop, scale, self_score):
    """Attention probabilities (T, c, 2c) and logsumexp (T, c, 1) of chunks [start, stop)."""
    c, d = plan.chunk, q_sorted.shape[-1]
    queries = q_sorted[start * c : stop * c].view(-1, c, d)  # (T, c, d)
    keys = _windows(k_padded, start, stop, c)  # (T, 2c, d)
    bias = plan.window_bias(start, stop, q_sorted.dtype)
    scores = torch.baddbmm(bias, queries, keys.transpose(1, 2), alpha=scale)  # (T, c, 2c)
    scores.diagonal(c, 1, 2).fill_(self_score)  # query p of a chunk is key c + p of its window
    top = scores.amax(-1, keepdim=True)
    # exp(x) for x < FLOOR is flushed to exactly 0: CPU exp is slow on underflowing inputs
    probs = scores.sub_(top).clamp_min_(FLOOR).exp_().sub_(math.exp(FLOOR))
    total = probs.sum(-1, keepdim=True)
    return probs.div_(total), total.log_().add_(top)


def _sorted_inputs(q_rows, v_rows, plan):
    """Sorted queries (M, d), unit keys and values each after one zero chunk (c + M, d), key norms (M, 1)."""
    c, d = plan.chunk, q_rows.shape[-1]
    q_sorted = q_rows.index_select(0, plan.token_of_slot)
    norms = q_sorted.norm(dim=-1, keepdim=True).clamp_min(NORM_EPS)
    k_padded, v_padded = (q_rows.new_empty(c + q_sorted.shape[0], d) for _ in range(2))
    k_padded[:c], v_padded[:c] = 0.0, 0.0
    torch.div(q_sorted, norms, out=k_padded[c:])
    torch.index_select(v_rows, 0, plan.token_of_slot, out=v_padded[c:])
    return q_sorted, k_padded, v_padded, norms


class _LSHAttentionFunction(torch.autograd.Function):
    """Chunked attention in the sorted order, flash-style: tiles of scores, recomputed in backward.

    forward(q_rows (S*N, d), v_rows (S*N, d), plan, scale, self_score, dropout)
    -> out (M, d), lse (M, 1), both in sorted order. Nothing of size M x 2c is kept: the backward
    recomputes each tile's probabilities (dropout masks are replayed from a saved seed) and applies
    dS = P * (dP - rowsum(P * dP) + d lse).
    """

    @staticmethod
    def forward(ctx, q_rows, v_rows, plan, scale, self_score, dropout):
        c, d = plan.chunk, q_rows.shape[-1]
        q_sorted, k_padded, v_padded, _ = _sorted_inputs(q_rows, v_rows, plan)
        num_chunks = q_sorted.shape[0] // c
        out = q_rows.new_empty(num_chunks, c, d)
        lse = q_rows.new_empty(num_chunks, c, 1)
        seed = int(torch.randint(2**62, ())) if dropout > 0 else None  # global RNG: like F.dropout
        dropper = _Dropper(dropout, seed, q_rows.device)
        tile = rows_per_chunk(4 * c * 2 * c, num_chunks, device_chunk_budget(TILE_BYTES, q_rows.device))
        for start in range(0, num_chunks, tile):
            stop = min(start + tile, num_chunks)
            probs, lse[start:stop] = _tile_probs(plan, q_sorted, k_padded, start, stop, scale, self_score)
            torch.bmm(dropper.apply(probs), _windows(v_padded, start, stop, c), out=out[start:stop])
        ctx.save_for_backward(q_rows, v_rows, out)
        ctx.plan, ctx.scale, ctx.self_score, ctx.dropout, ctx.seed = plan, scale, self_score, dropout, seed
        return out.view(-1, d), lse.view(-1, 1)

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q_rows, v_rows, out = ctx.saved_tensors
        plan, scale = ctx.plan, ctx.scale
        c, d = plan.chunk, q_rows.shape[-1]
        q_sorted, k_padded, v_padded, norms = _sorted_inputs(q_rows, v_rows, plan)
        num_chunks = q_sorted.shape[0] // c
        grad_out = grad_out.contiguous().view(num_chunks, c, d)
        grad_lse = grad_lse.contiguous().view(num_chunks, c, 1)
        grad_q = torch.empty_like(q_sorted).view(num_chunks, c, d)
        grad_k, grad_v = torch.zeros_like(k_padded), torch.zeros_like(v_padded)  # (c + M, d)
        dropper = _Dropper(ctx.dropout, ctx.seed, q_rows.device)
        tile = rows_per_chunk(4 * c * 2 * c, num_chunks, device_chunk_budget(TILE_BYTES, q_rows.device))
        for start in range(0, num_chunks, tile):
            stop = min(start + tile, num_chunks)
            probs, _ = _tile_probs(plan, q_sorted, k_padded, start, stop, scale, ctx.self_score)
            used = dropper.apply(probs)
            d_out = grad_out[start:stop]  # (T, c, d)
            grad_used = torch.bmm(d_out, _windows(v_padded, start, stop, c).transpose(1, 2))  # (T, c, 2c)
            _add_to_windows(grad_v, used.transpose(1, 2), d_out, start, stop, c)
            grad_probs = dropper.backward(grad_used)
            if dropper.generator is None:  # rowsum(P * dP) = dO . O
                row = (d_out * out[start:stop]).sum(-1, keepdim=True)
            else:
                row = (probs * grad_probs).sum(-1, keepdim=True)
            grad_scores = grad_probs.sub_(row - grad_lse[start:stop]).mul_(probs)  # (T, c, 2c)
            grad_scores.diagonal(c, 1, 2).zero_()  # the self score is a constant
            torch.bmm(grad_scores, _windows(k_padded, start, stop, c), out=grad_q[start:stop])
            queries = q_sorted[start * c : stop * c].view(-1, c, d)
            _add_to_windows(grad_k, grad_scores.transpose(1, 2), queries, start, stop, c)
        # unit keys k = q / |q|: dq += (dk - k (k . dk)) / |q| (no radial part above the norm clamp)
        keys, grad_k = k_padded[c:], grad_k[c:].mul_(scale)
        radial = (keys * grad_k).sum(-1, keepdim=True).masked_fill_(norms <= NORM_EPS, 0.0)
        grad_sorted = grad_q.view(-1, d).mul_(scale).add_((grad_k - keys * radial) / norms)
        return _unsort_rows(grad_sorted, plan), _unsort_rows(grad_v[c:], plan), None, None, None, None


def _add_to_windows(target, left, right, start, stop, c):
    """target[window g] += left[g] @ right[g] for the overlapping (2c)-row windows of chunks [start, stop)."""
    t = stop - start
    target[start * c : stop * c].view(t, c, -1).baddbmm_(left[:, :c], right)  # previous-chunk half
    target[(start + 1) * c : (stop + 1) * c].view(t, c, -1).baddbmm_(left[:, c:], right)  # own half


def _unsort_rows(grad_sorted, plan):
    """Adjoint of gathering rows into sorted slots: (M, d) -> (S * N, d), summed over the rounds."""
    d = grad_sorted.shape[-1]
    grad = grad_sorted.index_select(0, plan.slot_of_token)  # (M, d) in (row, round, token) order
    return grad.view(-1, plan.rounds, plan.tokens, d).sum(1).view(-1, d)


class _Unsort(torch.autograd.Function):
    """Sorted slots (M, k) -> (row, round, token) order; the backward gathers by the inverse permutation."""

    @staticmethod
    def forward(ctx, x, plan):
        ctx.plan = plan
        return x.index_select(0, plan.slot_of_token)

    @staticmethod
    def backward(ctx, grad):
        return grad.index_select(0, ctx.plan.token_round_of_slot), None


class _Dropper:
    """Dropout on attention probabilities whose masks can be replayed tile by tile from a seed."""

    def __init__(self, p: float, seed: int | None, device: torch.device):
        self.p, self.keep = p, None
        self.generator = None if seed is None else torch.Generator(device).manual_seed(seed)

    def apply(self, probs: torch.Tensor) -> torch.Tensor:
        if self.generator is None:
            return probs
        self.keep = torch.empty(probs.shape, dtype=torch.bool, device=probs.device)
        self.keep.bernoulli_(1 - self.p, generator=self.generator)
        return probs.masked_fill(~self.keep, 0.0).mul_(1 / (1 - self.p))

    def backward(self, grad: torch.Tensor) -> torch.Tensor:
        if self.generator is None:
            return grad
        return grad.masked_fill_(~self.keep, 0.0).mul_(1 / (1 - self.p))
