"""Reformer LSH attention: Kitaev, Kaiser & Levskaya 2020, "Reformer: The Efficient Transformer".

Queries and keys are shared: key k_j = q_j / ||q_j||. Each of ``num_hashes`` rounds r draws a random
matrix R_r of shape (d, num_buckets / 2) and hashes h_r(x) = argmax([x R_r ; -x R_r]). Tokens are sorted
by (bucket, position), the sorted order is cut into chunks of ``chunk_length``, and a query attends to the
keys of its own chunk and the previous one that share its bucket (the set P_i^r):

    o_i^r   = sum_{j in P_i^r} exp(s_ij - log N_ij - z_i^r) v_j,   s_ij = q_i . k_j / sqrt(d)
    z_i^r   = logsumexp_{j in P_i^r} (s_ij - log N_ij)
    o_i     = sum_r exp(z_i^r - logsumexp_r' z_i^r') o_i^r

N_ij (the paper's de-duplication) counts the rounds whose window P_i^r' holds j: same bucket in round r' and
at most one chunk apart there. With it, o_i is exact softmax attention over the union of the windows.
A token never attends to itself (its score is set to -1e5, HF's value) unless it has no other key.
Cost: O(num_hashes * n * (2 * chunk_length + num_buckets / 2) * d) time (attention + hashing), and
O(num_hashes * n * d) memory: the chunked attention is a flash-style autograd Function that works on
~4 MiB tiles of scores and recomputes them in the backward, so nothing of size n x chunk_length is kept.
Heads are processed a few at a time so the O(n) intermediates stay under utils.CHUNK_BYTES.

Deviations and choices:
- Scaling: s_ij = q_i . k_j / sqrt(d). HF's ``LSHSelfAttention`` uses q_i . k_j with no 1/sqrt(d)
  (its keys are q / ||q||, like ours), so ours equals HF's with its query/key projection divided by sqrt(d).
- Keys in other buckets are masked (as in the paper); HF attends to the whole chunk window instead.
- The look-back never wraps: the first chunk of each round has no previous chunk (HF and trax wrap around).
- Rotations are drawn per head, shape (heads, d, num_hashes, num_buckets / 2), as in HF.
- ``num_buckets=None`` picks 2 * round(n / chunk_length) from n = the longest real sequence in the batch (HF
  rounds down to a power of two); a sequence that fits in one chunk gets 1 bucket, i.e. exact attention
  without self (HF runs standard attention there too). ``num_buckets=1`` (no hashing) is allowed for that
  exact limit; other odd counts raise.
- Randomness: in eval the rotations come from a torch.Generator seeded with (config.seed, layer_idx), so
  outputs are deterministic and survive save/load (there is no state to save). In training, fresh
  rotations are drawn from torch's global RNG on every forward, like dropout: reproducible under
  ``torch.manual_seed``; ``resample_random_state`` therefore has nothing to redraw.
- Padding: positions are zeroed, put in an extra bucket past the real ones (sorted last, never matched by a
  real query), and the sequence is padded to a multiple of chunk_length inside the core.
- Numerics: probabilities below exp(-80) times a row's largest are set to exactly 0 (CPU exp is ~100x
  slower on underflowing inputs); invisible in float32. Dropout (``spec.dropout``) acts on the
  probabilities of each round, as in HF, with masks drawn from the global RNG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import AttentionCapabilities, AttentionCore, AttentionOutput
from .config import AttentionConfig
from .inputs import AttentionInputs, is_tracing
from .registry import register_attention
from .utils import extend_padding_mask, pad_to_multiple, row_slices, rows_per_chunk, unpad, zero_padded

SELF_SCORE = -1e5  # HF's self-mask value: a token sees itself only when nothing else is in its window
NORM_EPS = 1e-12  # as F.normalize
FLOOR = -80.0  # probabilities below exp(FLOOR) relative to the largest are set to 0
TILE_BYTES = 2**22  # scores tile of the chunked kernel (4 MiB measured fastest here, 256 KiB-16 MiB tried)


@dataclass
class ReformerLSHConfig(AttentionConfig):
    """Hyperparameters of LSH attention.

    Attributes:
        num_hashes: hashing rounds; more rounds, fewer missed neighbours, proportionally more work.
        chunk_length: tokens per chunk of the sorted order; each query sees 2 * chunk_length keys.
        num_buckets: even number of hash buckets, 1 for no hashing, or None for about 2 n / chunk_length.
        seed: seeds the eval-mode rotations (combined with the layer index).
    """

    num_hashes: int = 2
    chunk_length: int = 64
    num_buckets: int | None = None
    seed: int = 0

    def validate(self) -> None:
        if self.num_hashes < 1:
            raise ValueError(f"num_hashes must be >= 1, got {self.num_hashes}.")
        if self.chunk_length < 1:
            raise ValueError(f"chunk_length must be >= 1, got {self.chunk_length}.")
        if self.num_buckets is not None and (
            self.num_buckets < 1 or (self.num_buckets > 1 and self.num_buckets % 2)
        ):
            raise ValueError(
                f"num_buckets must be an even number >= 2 (argmax over [xR; -xR]), 1 (no hashing) or None "
                f"(auto), got {self.num_buckets}."
            )


def num_buckets(n: int, config: ReformerLSHConfig) -> int:
    """Buckets for a batch whose longest real sequence has n tokens: the configured number, else about
    n / chunk_length (even, at least 2), or 1 when one chunk holds the sequence."""
    if config.num_buckets is not None:
        return config.num_buckets
    chunk = config.chunk_length
    return 1 if n <= chunk else 2 * max(1, (n + chunk // 2) // chunk)


@register_attention("reformer_lsh")
class ReformerLSHAttention(AttentionCore):
    config_class = ReformerLSHConfig
    capabilities = AttentionCapabilities(
        padding_mask=True, shared_query_key=True, modalities=frozenset({"text", "vision"})
    )
    paper = "Kitaev et al. 2020, Reformer: The Efficient Transformer"
    cost = "O(n·c·rounds)"
    summary = "shared query/key, random-rotation LSH, sorted chunks"
    small_config = {"num_hashes": 2, "chunk_length": 4, "num_buckets": 4}
    # Half precision runs in float32: hashing rounded projections moves tokens between buckets (argmax
    # ties), and the chunk bookkeeping (float-coded buckets, -inf biases) needs float32's range.
    float32_for = (torch.float16, torch.bfloat16)

    @classmethod
    def forward_flops(cls, n, head_dim, config, num_edges=None):
        """R (n d nb + 4 n min(n, 2c) d): per round, hashing x R (d x nb/2) and 2c keys (own + previous
        chunk)."""
        rounds, chunk, nb = config.num_hashes, config.chunk_length, num_buckets(n, config)
        hashing = 2.0 * n * head_dim * (nb // 2) if nb > 1 else 0.0
        return rounds * (hashing + 4.0 * n * min(n, 2 * chunk) * head_dim)

    def tracing_blocker(self) -> str | None:
        if self.config.num_buckets is not None:
            return None
        return (
            "with num_buckets=None the number of buckets (and with it the shape of the random rotations) "
            "follows the longest real sequence of each batch, a value of the padding mask. Set "
            "attention_config num_buckets to the count the model serves with (about 2 n / chunk_length for "
            "n tokens; core.num_buckets_for(n) gives it)."
        )

    def num_buckets_for(self, n: int) -> int:
        """Buckets used for a batch whose longest real sequence has n tokens."""
        return num_buckets(n, self.config)

    def __init__(self, spec, config=None):
        super().__init__(spec, config)
        # The eval rotations of a configured bucket count, drawn once on the CPU (even when the model is
        # built on the meta device): a plain attribute, not state (a function of the seed), that traced
        # graphs (torch.export, torch.compile) read as a constant; a Generator draw cannot be traced.
        self.eval_rotations = None
        if self.config.num_buckets is not None and self.config.num_buckets > 1:
            self.eval_rotations = self._seeded_rotations(self.config.num_buckets)

    def _seeded_rotations(self, num_buckets: int) -> torch.Tensor:
        """The eval-mode rotations (h, d, num_hashes, num_buckets / 2), float32 on the CPU."""
        shape = (self.num_heads, self.head_dim, self.config.num_hashes, num_buckets // 2)
        # mixed with a fixed odd constant so that seed 0 is not the stream of torch.manual_seed(0)
        seed = ((self.config.seed * 1_000_003 + self.spec.layer_idx) ^ 0x9E3779B97F4A7C15) % 2**64
        return torch.randn(shape, generator=torch.Generator().manual_seed(seed), device="cpu")

    def rotations(self, num_buckets: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """Random rotations (h, d, num_hashes, num_buckets / 2): global RNG in training, seeded in eval."""
        if self.training:
            shape = (self.num_heads, self.head_dim, self.config.num_hashes, num_buckets // 2)
            return torch.randn(shape, dtype=dtype, device=device)
        fixed = self.eval_rotations if self.config.num_buckets is not None else None
        return (fixed if fixed is not None else self._seeded_rotations(num_buckets)).to(device, dtype)

    def _attend(self, query, key, value, inputs: AttentionInputs) -> AttentionOutput:
        attention_mask = inputs.attention_mask
        b, h, n, d = query.shape
        chunk, rounds = self.config.chunk_length, self.config.num_hashes
        num_real = (
            n if attention_mask is None or self.config.num_buckets else int(attention_mask.sum(-1).max())
        )
        num_buckets = self.num_buckets_for(num_real)
        mask = extend_padding_mask(attention_mask, b, n, chunk, query.device)  # (b, N) or None
        # Zero padded tokens so that nothing (not even inf/NaN) can leak out of them.
        q = zero_padded(pad_to_multiple(query, chunk), mask)  # (b, h, N, d)
        v = zero_padded(pad_to_multiple(value, chunk), mask)  # (b, h, N, d)
        big_n = q.shape[2]
        rotations = self.rotations(num_buckets, q.device, q.dtype) if num_buckets > 1 else None
        q_rows, v_rows = q.reshape(b * h, big_n, d), v.reshape(b * h, big_n, d)  # (b * h, N, d)
        head_index = torch.arange(b * h, device=q.device) % h
        row_mask = None if mask is None else mask.repeat_interleave(h, dim=0)  # (b * h, N)
        # A few heads at a time, so that the O(N) intermediates (hash projections, sorted copies) stay small.
        bytes_per_head = 4 * big_n * max(num_buckets // 2, rounds * d)
        heads_per_slice = rows_per_chunk(bytes_per_head, b * h)
        outputs = []
        for rows in row_slices(b * h, heads_per_slice):
            slice_mask = None if mask is None else row_mask[rows]
            buckets = self._hash(q_rows[rows], rotations, head_index[rows], num_buckets, slice_mask)
            outputs.append(self._lsh_attention(q_rows[rows], v_rows[rows], buckets, num_buckets))
        out = torch.cat(outputs).view(b, h, big_n, d)  # (b, h, N, d)
        return AttentionOutput(unpad(out, n), None)

    def _hash(self, q, rotations, heads, num_buckets, mask) -> torch.Tensor:
        """Bucket ids (S, R, N) of S rows of queries (S, N, d); padding gets the extra bucket num_buckets."""
        s, big_n, _ = q.shape
        rounds = self.config.num_hashes
        with torch.no_grad():
            if rotations is None:
                buckets = torch.zeros(s, rounds, big_n, dtype=torch.long, device=q.device)
            else:
                per_round = []
                for r in range(rounds):
                    projected = torch.bmm(q, rotations[heads, :, r])  # (S, N, num_buckets / 2)
                    top, top_index = projected.max(-1)
                    bottom, bottom_index = projected.min(-1)
                    # argmax over [xR ; -xR] without building the concatenation
                    per_round.append(torch.where(top >= -bottom, top_index, bottom_index + num_buckets // 2))
                buckets = torch.stack(per_round, 1)  # (S, R, N)
            if mask is not None:
                buckets = buckets.masked_fill(~mask[:, None, :], num_buckets)
        return buckets

    def _lsh_attention(self, q, v, buckets, num_buckets) -> torch.Tensor:
        """LSH attention of S rows: q, v (S, N, d), buckets (S, R, N) -> output (S, N, d)."""
        s, big_n, d = q.shape
        rounds, chunk = self.config.num_hashes, self.config.chunk_length
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
                others = [[o for o in range(rounds) if o != r] for r in range(rounds)]
                others = torch.tensor(others, device=device).view(1, rounds, 1, rounds - 1)
                other_codes = slot_code.gather(-1, others.expand(s, -1, big_n, -1))  # (S, R, N, R - 1)
                plan.other_codes = _pad_chunk(other_codes.view(-1, rounds - 1), chunk)  # (c + M, R - 1)
                plan.other_key_codes = plan.other_codes + 0.5  # so that |query - key| < 1 means 0 or 1
        self_score = SELF_SCORE if torch.finfo(q.dtype).max > 1e6 else -1e3
        dropout = self.spec.dropout if self.training else 0.0
        attend = _lsh_attention_whole if is_tracing() else _LSHAttentionFunction.apply
        out_sorted, lse = attend(
            q.reshape(s * big_n, d), v.reshape(s * big_n, d), plan, self.scaling, self_score, dropout
        )  # (S*R*N, d), (S*R*N, 1) in sorted order
        # Back to token order per round, then weight the rounds by their normalisers z^r.
        unsort = (lambda x, plan: x.index_select(0, plan.slot_of_token)) if is_tracing() else _Unsort.apply
        out_rounds = unsort(out_sorted, plan).view(s, rounds, big_n, d)
        lse_rounds = unsort(lse, plan).view(s, rounds, big_n, 1)
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

    x holds one padding chunk and then the sorted slots, so chunk 0's look-back is the padding. While
    tracing (every chunk, start = 0) a copy made of the blocks and the blocks shifted by one: strided views
    do not export.
    """
    if is_tracing():
        blocks = x.unflatten(0, (-1, c))  # (num_chunks + 1, c, ...)
        return torch.cat([blocks[:-1], blocks[1:]], dim=1)
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
    # query p of a chunk is key c + p of its window (a mask while tracing: diagonal views do not export)
    if is_tracing():
        self_key = F.pad(torch.eye(c, dtype=torch.bool, device=scores.device), (c, 0))  # (c, 2c)
        scores = scores.masked_fill(self_key, self_score)
    else:
        scores.diagonal(c, 1, 2).fill_(self_score)
    top = scores.amax(-1, keepdim=True)
    # exp(x) for x < FLOOR is flushed to exactly 0: CPU exp is ~100x slower on underflowing inputs
    if is_tracing():  # out of place: a traced graph differentiates through these with plain autograd
        probs = (scores - top).clamp_min(FLOOR).exp() - math.exp(FLOOR)
        total = probs.sum(-1, keepdim=True)
        return probs / total, total.log() + top
    probs = scores.sub_(top).clamp_min_(FLOOR).exp_().sub_(math.exp(FLOOR))
    total = probs.sum(-1, keepdim=True)
    return probs.div_(total), total.log_().add_(top)


def _sorted_inputs(q_rows, v_rows, plan):
    """Sorted queries (M, d), unit keys and values each after one zero chunk (c + M, d), key norms (M, 1)."""
    c, d = plan.chunk, q_rows.shape[-1]
    q_sorted = q_rows.index_select(0, plan.token_of_slot)
    norms = q_sorted.norm(dim=-1, keepdim=True).clamp_min(NORM_EPS)
    if is_tracing():  # no writes into slices of a new tensor
        v_sorted = v_rows.index_select(0, plan.token_of_slot)
        return q_sorted, _pad_chunk(q_sorted / norms, c), _pad_chunk(v_sorted, c), norms
    k_padded, v_padded = (q_rows.new_empty(c + q_sorted.shape[0], d) for _ in range(2))
    k_padded[:c], v_padded[:c] = 0.0, 0.0
    torch.div(q_sorted, norms, out=k_padded[c:])
    torch.index_select(v_rows, 0, plan.token_of_slot, out=v_padded[c:])
    return q_sorted, k_padded, v_padded, norms


def _lsh_attention_whole(q_rows, v_rows, plan, scale, self_score, dropout):
    """What :class:`_LSHAttentionFunction` computes, as one tile with plain autograd (for traced graphs):
    (out (M, d), lse (M, 1)) in sorted order. Memory O(M 2c) for the probabilities."""
    c, d = plan.chunk, q_rows.shape[-1]
    q_sorted, k_padded, v_padded, _ = _sorted_inputs(q_rows, v_rows, plan)
    num_chunks = q_sorted.shape[0] // c
    probs, lse = _tile_probs(plan, q_sorted, k_padded, 0, num_chunks, scale, self_score)
    if dropout > 0:
        probs = F.dropout(probs, dropout)
    return torch.bmm(probs, _windows(v_padded, 0, num_chunks, c)).view(-1, d), lse.view(-1, 1)


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
        tile = rows_per_chunk(4 * c * 2 * c, num_chunks, TILE_BYTES)
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
        tile = rows_per_chunk(4 * c * 2 * c, num_chunks, TILE_BYTES)
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
