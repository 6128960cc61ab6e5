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
Cost: O(num_hashes * n * (2 * chunk_length + num_buckets / 2) * d) time (attention + hashing).
:meth:`ReformerLSHAttention.reference` computes this in one piece, O(num_hashes * n * chunk_length)
memory; the kernel "chunked" (:mod:`.kernels.reformer_lsh`, what ``implementation="auto"`` runs outside
torch.export / torch.compile) computes the same a slice of heads and a tile of chunks at a time and
recomputes the scores in backward, so it keeps O(num_hashes * n * d).

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
- Numerics: probabilities below exp(-80) times a row's largest are set to exactly 0 (an underflowing exp is
  slow on CPU); invisible in float32. Dropout (``spec.dropout``) acts on the probabilities of each round,
  as in HF, with masks drawn from the global RNG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .base import AttentionCapabilities, AttentionCore, AttentionOutput
from .config import AttentionConfig
from .dropout import fast_dropout
from .inputs import AttentionInputs
from .kernels.reformer_lsh import CHUNKED, FLOOR, NORM_EPS
from .registry import register_attention
from .utils import extend_padding_mask, pad_to_multiple, unpad, zero_padded

SELF_SCORE = -1e5  # HF's self-mask value: a token sees itself only when nothing else is in its window


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
    cross_attention_refusal = (
        "its keys are its own normalised queries (shared query/key) and it hashes queries and keys of one"
        " sequence into the same buckets"
    )
    relative_positions_refusal = (
        "it forms scores only inside hash buckets of tokens sorted by their hash, not by position"
    )
    rotary_refusal = (
        "its hash buckets would be drawn from the rotated vectors, so which pairs it scores would depend on "
        "where the text sits (a text shifted by one token hashes apart), not on relative positions only"
    )
    capabilities = AttentionCapabilities(
        padding_mask=True, shared_query_key=True, modalities=frozenset({"text", "vision"})
    )
    paper = "Kitaev et al. 2020, Reformer: The Efficient Transformer"
    cost = "O(n·c·rounds)"
    summary = "shared query/key, random-rotation LSH, sorted chunks"
    small_config = {"num_hashes": 2, "chunk_length": 4, "num_buckets": 4}
    export_note = "needs attention_config num_buckets (the default follows the data); eval rotations baked in"
    lra_listops = ("Reformer", 37.27)
    script_configs = {  # vision: 2 buckets (27-28 of 49 keys a query); mqar: 64 tokens is a whole sequence
        "text": {"attention_config": {"num_hashes": 2, "chunk_length": 64}},
        "listops": {"attention_config": {"num_hashes": 2, "chunk_length": 64}},
        "mqar": {"attention_config": {"num_hashes": 2, "chunk_length": 16}},
        "vision": {"attention_config": {"num_hashes": 2, "chunk_length": 16, "num_buckets": 2}},
    }
    kernels = (CHUNKED,)
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

    def self_score(self, dtype: torch.dtype) -> float:
        """The score a token gives itself (HF's -1e5; -1e3 where the dtype's range is smaller)."""
        return SELF_SCORE if torch.finfo(dtype).max > 1e6 else -1e3

    def rows(self, query: torch.Tensor, value: torch.Tensor, inputs: AttentionInputs) -> _Rows:
        """What the hashing needs: queries and values padded to N, a multiple of chunk_length, with their
        padded positions zeroed (nothing, not even inf/NaN, leaks out of them), as rows (b h, N, d)."""
        attention_mask = inputs.attention_mask
        b, h, n, d = query.shape
        chunk = self.config.chunk_length
        num_real = (
            n if attention_mask is None or self.config.num_buckets else int(attention_mask.sum(-1).max())
        )
        num_buckets = self.num_buckets_for(num_real)
        mask = extend_padding_mask(attention_mask, b, n, chunk, query.device)  # (b, N) or None
        q = zero_padded(pad_to_multiple(query, chunk), mask)  # (b, h, N, d)
        v = zero_padded(pad_to_multiple(value, chunk), mask)  # (b, h, N, d)
        big_n = q.shape[2]
        rotations = self.rotations(num_buckets, q.device, q.dtype) if num_buckets > 1 else None
        return _Rows(
            query=q.reshape(b * h, big_n, d),
            value=v.reshape(b * h, big_n, d),
            mask=None if mask is None else mask.repeat_interleave(h, dim=0),  # (b h, N)
            heads=torch.arange(b * h, device=q.device) % h,  # (b h,) the head of each row
            num_buckets=num_buckets,
            rotations=rotations,
        )

    def hash_buckets(self, q, rotations, heads, num_buckets, mask) -> torch.Tensor:
        """Bucket ids (S, R, N) of S rows of queries (S, N, d): h_r(x) = argmax([x R_r ; -x R_r]); padded
        positions (mask (S, N) False) get the extra bucket num_buckets."""
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

    def reference(self, query, key, value, inputs: AttentionInputs) -> AttentionOutput:
        """The module docstring's equations in one piece (keys are the queries: ``key`` is ``query``)."""
        b, h, n, d = query.shape
        c, rounds = self.config.chunk_length, self.config.num_hashes
        rows = self.rows(query, value, inputs)
        q, v = rows.query, rows.value  # (B, N, d), B = b h
        big_n = q.shape[1]
        buckets = self.hash_buckets(q, rows.rotations, rows.heads, rows.num_buckets, rows.mask)  # (B, R, N)
        # Sort each round by (bucket, position): token order[., r, i] sits in slot i, token t in slot[., r, t]
        order = (buckets * big_n + torch.arange(big_n, device=q.device)).argsort(-1)  # (B, R, N)
        slot = order.argsort(-1)  # (B, R, N)
        # code_r(t) = bucket_r(t) (chunks + 1) + chunk_r(t): j is in i's window of round r (same bucket, same
        # or previous chunk) exactly when code_r(i) - code_r(j) is 0 or 1
        code = (buckets * (big_n // c + 1) + slot // c).int()  # (B, R, N)

        def in_slots(x):  # per token (B, N, ...) -> per round in sorted order, in chunks (B, R, G, c, ...)
            index = order.view(*order.shape, *[1] * (x.dim() - 2)).expand(-1, -1, -1, *x.shape[2:])
            return x[:, None].expand(-1, rounds, *x.shape[1:]).gather(2, index).unflatten(2, (-1, c))

        def windows(x, fill):  # (B, R, G, c, ...) -> (B, R, G, 2c, ...): previous chunk (fill before 0), own
            return torch.cat([torch.cat([torch.full_like(x[:, :, :1], fill), x[:, :, :-1]], 2), x], 3)

        q_sorted = in_slots(q)  # (B, R, G, c, d)
        keys = windows(F.normalize(q_sorted, dim=-1, eps=NORM_EPS), 0.0)  # (B, R, G, 2c, d) unit keys
        values = windows(in_slots(v), 0.0)  # (B, R, G, 2c, d)
        sorted_buckets = buckets.gather(-1, order).unflatten(2, (-1, c))  # (B, R, G, c)
        same_bucket = sorted_buckets[..., None] == windows(sorted_buckets, -1)[..., None, :]  # (.., c, 2c)
        query_codes = in_slots(code.transpose(1, 2))  # (B, R, G, c, R') the slot's codes in every round
        key_codes = windows(query_codes, -1)  # (B, R, G, 2c, R')
        # N_ij: the rounds in which j is in i's window (the paper's de-duplication)
        # (counted from 1 across buckets, which the bias excludes anyway, so that the log never meets 0)
        count = (~same_bucket).to(q.dtype)  # (B, R, G, c, 2c)
        for r in range(rounds):
            gap = query_codes[..., r, None] - key_codes[..., None, :, r]  # code_r(i) - code_r(j)
            count += (gap == 0) | (gap == 1)
        bias = torch.where(same_bucket, -count.log(), -math.inf)  # (B, R, G, c, 2c)
        scores = (q_sorted @ keys.transpose(-1, -2)) * self.scaling + bias  # (B, R, G, c, 2c)
        self_key = F.pad(torch.eye(c, dtype=torch.bool, device=q.device), (c, 0))  # query p is key c + p
        scores = scores.masked_fill(self_key, self.self_score(q.dtype))
        # softmax and its log-normaliser z^r; exp of a score FLOOR below the row's largest is flushed to 0
        top = scores.amax(-1, keepdim=True)
        probs = (scores - top).clamp_min(FLOOR).exp() - math.exp(FLOOR)
        total = probs.sum(-1, keepdim=True)
        probs, lse = probs / total, total.log() + top  # (B, R, G, c, 2c), (B, R, G, c, 1)
        probs = fast_dropout(probs, self.spec.dropout, self.training)
        out = (probs @ values).view(-1, rounds, big_n, d)  # (B, R, N, d) in sorted order
        # back to token order, then the rounds weighted by exp(z^r - logsumexp_r' z^r')
        out = out.gather(2, slot[..., None].expand(-1, -1, -1, d))  # (B, R, N, d)
        lse = lse.view(-1, rounds, big_n, 1).gather(2, slot[..., None])  # (B, R, N, 1)
        out = (torch.softmax(lse, dim=1) * out).sum(1)  # (B, N, d)
        return AttentionOutput(unpad(out.view(b, h, big_n, d), n), None)


class _Rows(NamedTuple):
    """Queries and values of every (batch, head) row, ready to hash (:meth:`ReformerLSHAttention.rows`)."""

    query: torch.Tensor  # (b h, N, d)
    value: torch.Tensor  # (b h, N, d)
    mask: torch.Tensor | None  # (b h, N) bool, False at padding (also the positions padded up to N)
    heads: torch.Tensor  # (b h,) the head of each row
    num_buckets: int
    rotations: torch.Tensor | None  # (h, d, R, num_buckets / 2); None for one bucket
