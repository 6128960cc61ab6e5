"""Longformer: sliding-window attention with dilation and global tokens (Beltagy et al. 2020).

    out_i = sum_{j in A(i)} softmax_j(q_i . k_j / sqrt(d)) v_j
    A(i)  = {i + t r : |t| <= w/2} ∪ G          for a local token i (window w, dilation r, globals G)
    A(g)  = {all real tokens}                     for a global token g in G

Every token attends to the global tokens and every global token attends to everything (symmetric). A
global key that also lies in the window is counted once: local and global keys share ONE softmax.

Cost: O(n (w + |G|) d) time, O(n d) memory. Queries are split into chunks of c <= 256 positions (c = w/2
for w <= 512); chunk t attends to the key blocks t - j .. t + j (j c >= w/2, i.e. c + 2 j c keys) plus
the |G| global keys, masked to the exact band. On CPU (no dropout) a custom autograd Function runs torch's
fused flash kernel a few chunks per call, saves only q, k, v, the output and the log-sum-exp, and rebuilds
the windows in backward, so no intermediate exceeds ~24 MiB. With dropout or on other devices the same
chunk groups go through the public ``scaled_dot_product_attention`` and plain autograd. Dilation r
reshapes (n, d) -> (n / r, r, d): tokens of one residue mod r form an undilated sequence, so the same
kernel runs on the r interleaved subsequences. Global rows (few) are dense over all keys. No (n x n)
tensor is ever built.

Causal form (``is_causal=True``, a decoder): token i sees itself and the w earlier tokens of its residue,
A(i) = {i - t r : 0 <= t <= w}, as many keys as the two-sided window (the whole span moved to the left, as
the autoregressive models of the paper's section 4). Chunks then hold key blocks t - j .. t only. Decoding
keeps the last w r keys and values of each layer (a
:class:`~hf_efficient.attention.cache.SlidingWindowCacheLayer`): memory and time per token independent of
the context. The causal form has no global tokens (a global token attends to later tokens): a causal model
sets ``global_token_indices=[]``.

Deviations from the paper:
    * Longformer has separate projections Q_g, K_g, V_g for global attention. Projections live outside the
      cores here, so global rows use the same q/k/v as local ones (load a Longformer checkpoint by dropping
      or averaging its ``*_global`` weights; parity with transformers holds when they equal the local ones).
    * Windows and dilation are one value for all heads and layers (the paper varies them per layer/head).
    * Padding is internal: any length works (upstream needs a multiple of ``attention_window``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicLayer

from .base import AttentionCapabilities, AttentionCore, AttentionOutput
from .cache import SlidingWindowCacheLayer
from .config import AttentionConfig
from .kernels.flex import (
    FLEX_BLOCK,
    BlockMask,
    BlockMaskCache,
    blocks_all,
    blocks_holding,
    check_implementation,
    flex_attend,
    flex_block_mask,
    num_blocks,
    use_flex,
)
from .inputs import AttentionInputs, is_tracing
from .registry import register_attention
from .utils import CHUNK_BYTES, extend_padding_mask, pad_to_multiple, rows_per_chunk, unpad


@dataclass
class LongformerAttentionConfig(AttentionConfig):
    """Hyperparameters of :class:`LongformerAttention`.

    Attributes:
        attention_window: two-sided window w (HF's ``LongformerConfig.attention_window``): each token sees
            w / 2 keys on each side plus itself. Even, >= 2.
        attention_dilation: dilation r >= 1; token i sees i + t r for |t| <= w / 2.
        global_token_indices: positions that are global in every example (e.g. [0] for CLS); per-example
            global tokens come through the ``global_attention_mask`` input instead.
        implementation: ``"auto"`` (FlexAttention on CUDA without dropout, the chunked native path
            otherwise), ``"native"`` or ``"flex"`` (see :mod:`hf_efficient.attention.kernels.flex`).
    """

    attention_window: int = 512
    attention_dilation: int = 1
    global_token_indices: list[int] = field(default_factory=list)
    implementation: str = "auto"

    def validate(self) -> None:
        check_implementation("longformer", self.implementation)
        if self.attention_window < 2 or self.attention_window % 2:
            raise ValueError(
                f"attention_window must be an even integer >= 2 (w / 2 keys on each side), "
                f"got {self.attention_window}."
            )
        if self.attention_dilation < 1:
            raise ValueError(f"attention_dilation must be >= 1, got {self.attention_dilation}.")
        if any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in self.global_token_indices):
            raise ValueError(
                f"global_token_indices must be non-negative ints, got {self.global_token_indices}."
            )


def band_pairs(n: int, half: int) -> int:
    """(i, j) pairs with |i - j| <= half in a sequence of n tokens (the window's pattern, for FLOP counts)."""
    half = min(half, n - 1)
    return n * (2 * half + 1) - half * (half + 1)


@register_attention("longformer")
class LongformerAttention(AttentionCore):
    config_class = LongformerAttentionConfig
    capabilities = AttentionCapabilities(global_attention_mask=True, causal=True)
    paper = "Beltagy et al. 2020, Longformer: The Long-Document Transformer"
    cost = "O(n·w)"
    summary = "sliding window (optional dilation) + global tokens by index or per-example mask; causal window"
    small_config = {"attention_window": 6, "global_token_indices": [0]}
    causal_small_config = {"attention_window": 6}  # the causal form has no global tokens

    @classmethod
    def forward_flops(cls, n, head_dim, config, num_edges=None):
        """4 d (band pairs + 2 G n): window |i - j| <= w/2 (per dilation residue), G global rows and
        columns."""
        half, r = config.attention_window // 2, config.attention_dilation
        # residue s holds positions s, s + r, ...: an undilated band of half-width `half` on each
        pairs = sum(band_pairs(len(range(s, n, r)), half) for s in range(min(r, n)))
        num_global = len({i for i in config.global_token_indices if i < n})
        return 4.0 * head_dim * (pairs + 2 * num_global * n)

    def __init__(self, spec, config=None):
        super().__init__(spec, config)
        if spec.causal and self.config.global_token_indices:
            raise ValueError(
                f"longformer: global_token_indices={self.config.global_token_indices} in a causal model; the "
                "causal form has no global tokens (a global token attends to later tokens). Use "
                "global_token_indices=[]."
            )
        self.flex_masks = BlockMaskCache()  # FlexAttention masks of unpadded lengths, rebuilt on demand

    def new_cache_layer(self) -> SlidingWindowCacheLayer:
        return SlidingWindowCacheLayer(self.config.attention_window * self.config.attention_dilation)

    def _attend_cached(self, query, key, value, inputs: AttentionInputs, layer) -> AttentionOutput:
        """The new tokens against the kept window: one token by a softmax over at most w r + 1 keys; several
        through the parallel causal form on the kept tokens followed by the new ones (outputs of the kept
        ones, which have no queries, are dropped)."""
        if inputs.global_attention_mask is not None:
            raise ValueError("longformer: the causal form has no global tokens; drop global_attention_mask.")
        b, h, n, d = query.shape
        held = DynamicLayer.get_seq_length(layer)  # tokens kept from earlier calls
        keys, values, key_mask = layer.update_with_mask(
            key, value, inputs.attention_mask
        )  # (b, h, held + n, d)
        if held == 0:
            return self._attend(query, key, value, inputs)
        total, r = held + n, self.config.attention_dilation
        real = key_mask if key_mask is not None else torch.ones(b, total, dtype=torch.bool, device=key.device)
        if n == 1:
            distance = torch.arange(held, -1, -1, device=key.device)  # (held + 1,): the query is the last
            allowed = (distance % r == 0) & (real | (distance == 0))  # (b, held + 1); all within w r
            out = F.scaled_dot_product_attention(
                query, keys, values, attn_mask=allowed[:, None, None, :], scale=self.scaling
            )
            return AttentionOutput(out, None)
        queries = torch.cat([query.new_zeros(b, h, held, d), query], dim=2)  # kept tokens: outputs dropped
        joined = inputs.replace(attention_mask=key_mask, cache=None).prepare(b, total, "longformer")
        return AttentionOutput(self._attend(queries, keys, values, joined).output[:, :, held:], None)

    def _attend(self, query, key, value, inputs: AttentionInputs) -> AttentionOutput:
        attention_mask = inputs.attention_mask
        global_attention_mask = inputs.global_attention_mask
        b, h, n, d = query.shape
        device = query.device
        causal = inputs.is_causal
        is_global = self._global_tokens(global_attention_mask, attention_mask, b, n, device)
        if causal and is_global is not None:
            raise ValueError(
                "longformer: the causal form has no global tokens (a global token attends to every token, "
                "later ones too); drop global_attention_mask and use global_token_indices=[] in a causal "
                "model."
            )
        real = attention_mask if attention_mask is not None else torch.ones(b, n, dtype=torch.bool)
        real = real.to(device)
        dropout = self.spec.dropout if self.training else 0.0
        if use_flex(self.config.implementation, query, dropout):
            # a pattern of sizes only (no padding, no per-example global tokens): one mask per length
            same_for_all = attention_mask is None and global_attention_mask is None
            cache_key = (n, str(device), causal) if same_for_all else None
            if same_for_all and is_global is not None:
                is_global = is_global[:1]  # from global_token_indices: the same in every example
            mask = self.flex_masks.get(
                cache_key, lambda: self._flex_mask(n, attention_mask, is_global, device, causal)
            )
            return AttentionOutput(flex_attend(query, key, value, mask, self.scaling), None)
        if is_tracing():
            if causal:
                raise ValueError(
                    "longformer: the causal form cannot be traced by torch.export / torch.compile yet (its "
                    "traced path is the bidirectional window). Export the encoder form (is_causal=False)."
                )
            return AttentionOutput(self._attend_whole(query, key, value, real, is_global, dropout), None)
        slot_pos, slot_valid = _global_slots(is_global, b, device)  # (b, G), (b, G)
        gather_index = slot_pos[:, None, :, None].expand(b, h, -1, d)  # (b, h, G, d)
        if is_global is None:  # no gather: its backward would allocate a full-size zero gradient
            global_key = global_value = key.new_zeros(b, h, 0, d)
        else:
            global_key, global_value = key.gather(2, gather_index), value.gather(2, gather_index)

        r = self.config.attention_dilation
        window = self._window(causal, sub_len=-(-n // r))
        q, k, v = (pad_to_multiple(t, r * window.chunk) for t in (query, key, value))  # (b, h, r m, d)
        key_real = extend_padding_mask(real, b, n, r * window.chunk, device)  # (b, r m)
        m = q.shape[2] // r
        if r > 1:
            # (b, h, m r, d) -> (b, h, m, r, d) -> (b, r, h, m, d) -> (b r, h, m, d): subsequence s holds
            # positions s, s + r, s + 2r, ...
            q, k, v = (
                t.view(b, h, m, r, d).permute(0, 3, 1, 2, 4).reshape(b * r, h, m, d) for t in (q, k, v)
            )
            key_real = key_real.view(b, m, r).transpose(1, 2).reshape(b * r, m)  # (b r, m)
            global_key, global_value = (t.repeat_interleave(r, dim=0) for t in (global_key, global_value))
        # A global key's position inside subsequence s, or far away when it belongs to another one.
        residue = torch.arange(r, device=device)[None, :, None]  # (1, r, 1)
        in_sub = (slot_pos % r)[:, None, :] == residue  # (b, r, G)
        far = -4 * (m + window.reach + window.reach_after)
        sub_pos = torch.where(in_sub, (slot_pos // r)[:, None, :], far)  # (b, r, G)
        mask = window.mask(key_real, sub_pos.flatten(0, 1), slot_valid.repeat_interleave(r, dim=0))
        if device.type == "cpu" and dropout == 0.0 and _HAS_CPU_FLASH:
            chunks = _CpuFlashWindow.apply(q, k, v, global_key, global_value, mask, window, self.scaling)
        else:  # dropout or another device: the same groups through the public sdpa and plain autograd
            groups = window.groups(q, global_key.shape[2])
            chunks = torch.cat(
                [
                    F.scaled_dot_product_attention(
                        *window.group(q, k, v, global_key, global_value, start, stop),
                        attn_mask=mask[start:stop].flatten(0, 1)[:, None],
                        dropout_p=dropout,
                        scale=self.scaling,
                    )
                    for start, stop in groups
                ]
            )
        # (num_chunks B, h, chunk, d) -> (num_chunks, b, r, h, chunk, d) -> (b, h, num_chunks, chunk, r, d)
        # -> (b, h, r m, d): position (t chunk + a) r + s
        chunks = chunks.view(-1, b, r, h, window.chunk, d).permute(1, 3, 0, 4, 2, 5)
        out = unpad(chunks.reshape(b, h, m * r, d), n)  # (b, h, n, d)
        if is_global is None:
            return AttentionOutput(out, None)
        return AttentionOutput(
            self._global_rows(out, query, key, value, real, is_global, slot_pos, slot_valid), None
        )

    def _global_rows(self, out, query, key, value, real, is_global, slot_pos, slot_valid) -> torch.Tensor:
        """Replace the rows of global tokens by dense attention over all real keys: out (b, h, n, d), slots
        (b, G) as :func:`_global_slots` gives them (unused slots repeat some row and are dropped)."""
        b, h, n, d = query.shape
        gather_index = slot_pos[:, None, :, None].expand(b, h, -1, d)  # (b, h, G, d)
        dropout = self.spec.dropout if self.training else 0.0
        global_out = F.scaled_dot_product_attention(
            query.gather(2, gather_index),
            key,
            value,
            attn_mask=real[:, None, None, :],
            dropout_p=dropout,
            scale=self.scaling,
        )  # (b, h, G, d)
        # Into their positions by a scatter and a select (no nonzero: its size would be a value).
        rows = global_out.masked_fill(~slot_valid[:, None, :, None], 0.0)  # unused slots add nothing
        placed = torch.zeros_like(out).scatter_add(2, gather_index, rows)  # (b, h, n, d)
        return torch.where(is_global[:, None, :, None], placed, out)

    def _attend_whole(self, query, key, value, real, is_global, dropout) -> torch.Tensor:
        """The same attention with every chunk at once and plain autograd: what torch.export and
        torch.compile trace (no loop over chunk groups, no custom Function, no branch on n or on values).

        Differences from the chunked path, none visible in the output: the window is not clipped to short
        inputs, and global tokens are only the configured ``global_token_indices`` (their number is then
        known from the config), as slots in a fixed order.
        """
        b, h, n, d = query.shape
        r, device = self.config.attention_dilation, query.device
        window = self._window(causal=False, sub_len=None)
        if is_global is None:
            slot_pos = torch.zeros(b, 0, dtype=torch.long, device=device)
            slot_valid = torch.zeros(b, 0, dtype=torch.bool, device=device)
        else:
            chosen = torch.tensor(sorted(set(self.config.global_token_indices)), device=device)  # (G,)
            slot_pos = chosen.clamp(max=n - 1).expand(b, -1)  # (b, G): positions past n stay unused
            slot_valid = is_global.gather(1, slot_pos) & (chosen < n)
        gather_index = slot_pos[:, None, :, None].expand(b, h, -1, d)  # (b, h, G, d)
        global_key, global_value = key.gather(2, gather_index), value.gather(2, gather_index)

        q, k, v = (pad_to_multiple(t, r * window.chunk) for t in (query, key, value))  # (b, h, r m, d)
        key_real = pad_to_multiple(real, r * window.chunk, dim=-1, value=False)  # (b, r m)
        m = q.shape[2] // r
        if r > 1:  # subsequence s holds positions s, s + r, ... (as in _attend)
            q, k, v = (t.unflatten(2, (m, r)).permute(0, 3, 1, 2, 4).flatten(0, 1) for t in (q, k, v))
            key_real = key_real.unflatten(1, (m, r)).transpose(1, 2).flatten(0, 1)  # (b r, m)
            global_key, global_value = (t.repeat_interleave(r, dim=0) for t in (global_key, global_value))
        residue = torch.arange(r, device=device)[None, :, None]  # (1, r, 1)
        sub_pos = torch.where(
            (slot_pos % r)[:, None, :] == residue, (slot_pos // r)[:, None, :], -4 * (m + window.reach)
        )
        mask = window.mask(key_real, sub_pos.flatten(0, 1), slot_valid.repeat_interleave(r, dim=0))
        num_chunks = m // window.chunk
        queries = q.unflatten(2, (num_chunks, window.chunk)) * self.scaling  # (B, h, chunks, c, d)
        keys, values = (
            torch.cat([window.windows(x), extra[:, :, None].expand(-1, -1, num_chunks, -1, -1)], dim=3)
            for x, extra in ((k, global_key), (v, global_value))
        )  # (B, h, chunks, span + G, d)
        scores = (queries @ keys.transpose(-1, -2)).masked_fill(~mask.transpose(0, 1)[:, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if dropout > 0:
            probs = F.dropout(probs, dropout)
        out = (probs @ values).flatten(2, 3)  # (B, h, m, d)
        if r > 1:  # back to position t r + s
            out = out.unflatten(0, (b, r)).permute(0, 2, 3, 1, 4).flatten(2, 3)  # (b, h, m r, d)
        out = unpad(out, n)
        if is_global is None:
            return out
        return self._global_rows(out, query, key, value, real, is_global, slot_pos, slot_valid)

    def _window(self, causal: bool, sub_len: int | None) -> _Window:
        """The window's geometry on an undilated (sub)sequence of ``sub_len`` tokens: w / 2 keys on each side,
        or, causal, w earlier keys."""
        w = self.config.attention_window
        return _Window.build(w if causal else w // 2, 0 if causal else w // 2, sub_len)

    def _flex_mask(self, n, real, is_global, device, causal: bool = False) -> BlockMask:
        """The same pattern as one FlexAttention block mask (batch dimension: that of real / is_global).

        Token level: key k is real and (|q - k| <= r w/2 with r | q - k, or q or k is global); causal:
        0 <= q - k <= r w with r | q - k. Block level, from sizes: blocks I, J hold a window pair when their
        closest tokens are within reach; every pair when their farthest are (undilated, keys all real);
        global tokens open their block's row and column.
        """
        b = max([1] + [t.shape[0] for t in (real, is_global) if t is not None])
        half, r = self.config.attention_window // 2, self.config.attention_dilation
        reach = (2 * half if causal else half) * r

        shared_global = is_global[0] if is_global is not None and is_global.shape[0] == 1 else None

        def mask_mod(batch, head, q, k):
            distance = q - k
            within = (distance >= 0) & (distance <= reach) if causal else distance.abs() <= reach
            allowed = within & (distance % r == 0)
            if shared_global is not None:  # the same global tokens in every example (B = 1 mask)
                allowed = allowed | shared_global[q] | shared_global[k]
            elif is_global is not None:
                allowed = allowed | is_global[batch, q] | is_global[batch, k]
            return allowed & real[batch, k] if real is not None else allowed

        nb = num_blocks(n)
        blocks = torch.arange(nb, device=device)
        apart = (blocks[:, None] - blocks[None, :]).abs()  # (nb, nb) block distance
        closest = (apart - 1).clamp(min=0) * FLEX_BLOCK + (apart > 0).long()  # nearest token pair's distance
        partial = (closest <= reach)[None, None]  # (1, 1, nb, nb)
        full = ((apart + 1) * FLEX_BLOCK - 1 <= reach)[None, None] if r == 1 else torch.zeros_like(partial)
        if causal:  # key blocks at or before the query block; the diagonal block is never full
            earlier = (blocks[:, None] >= blocks[None, :])[None, None]
            partial, full = partial & earlier, full & (blocks[:, None] > blocks[None, :])[None, None]
        if is_global is not None:
            holds = blocks_holding(is_global)  # (b, nb)
            partial = partial | holds[:, None, :, None] | holds[:, None, None, :]
        if real is not None:
            partial = partial & blocks_holding(real)[:, None, None, :]
            full = full & blocks_all(real)[:, None, None, :]
        partial, full = partial.expand(b, 1, nb, nb), full.expand(b, 1, nb, nb)
        return flex_block_mask(partial, mask_mod, n, full=full & partial)

    def _global_tokens(self, global_attention_mask, attention_mask, b, n, device) -> torch.Tensor | None:
        """(b, n) bool of global tokens from the config's indices and the per-example mask, or None."""
        indices = self.config.global_token_indices
        if global_attention_mask is not None and is_tracing():
            raise ValueError(
                "longformer: per-example global tokens (global_attention_mask) cannot be traced by "
                "torch.export / torch.compile: how many tokens are global is a value of the mask, and the "
                "global rows are gathered into that many slots. Make the global positions part of the model "
                "instead (attention_config global_token_indices, e.g. [0] for [CLS]) and drop the mask."
            )
        if not indices:
            return global_attention_mask
        if not is_tracing() and max(indices) >= n:  # a traced graph leaves positions past n out instead
            raise ValueError(
                f"longformer: global_token_indices {indices} point past the sequence of length {n}."
            )
        chosen = torch.tensor(indices, device=device)
        is_global = (torch.arange(n, device=device)[:, None] == chosen).any(-1).expand(b, n)  # (b, n)
        if global_attention_mask is not None:
            is_global = is_global | global_attention_mask
        if attention_mask is not None:
            is_global = is_global & attention_mask  # a padded token is never global
        return is_global if is_tracing() or bool(is_global.any()) else None


def _global_slots(is_global: torch.Tensor | None, b: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Each example's global positions in ascending order, (b, G), padded to the largest count G, and
    (b, G) bool marking the slots in use (unused slots hold some non-global position)."""
    if is_global is None:
        return torch.zeros(b, 0, dtype=torch.long, device=device), torch.zeros(
            b, 0, dtype=torch.bool, device=device
        )
    count = is_global.sum(1)  # (b,)
    num_slots = int(count.max())
    slot_pos = torch.sort((~is_global).int(), dim=1, stable=True).indices[:, :num_slots]  # globals first
    return slot_pos, torch.arange(num_slots, device=device)[None] < count[:, None]


_HAS_CPU_FLASH = hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward")
_MAX_CHUNK = 256  # queries per chunk; keys per chunk = chunk + 2 reach (+ globals)
_GROUP_BYTES = CHUNK_BYTES  # keys of one group of chunks (per kernel call)


@dataclass(frozen=True)
class _Window:
    """Geometry of undilated window attention computed chunk by chunk.

    Queries come in chunks of ``chunk`` positions; chunk t sees key blocks t - j .. t + a (a block is
    ``chunk`` positions, j chunk >= ``before``, a chunk >= ``after``): ``span`` = (j + 1 + a) chunk keys,
    masked to -before <= k - i <= after (two-sided: before = after = w / 2; causal: before = w, after = 0).
    """

    before: int  # keys seen before the query
    after: int  # keys seen after it
    chunk: int
    blocks: int  # j, key blocks before the query's
    blocks_after: int  # a, key blocks after it

    @classmethod
    def build(cls, before: int, after: int, sub_len: int | None) -> _Window:
        """The geometry for ``before`` earlier and ``after`` later keys over (sub)sequences of ``sub_len``
        tokens (None: any length, as a traced graph needs)."""
        if sub_len is not None:  # keys farther than the sequence length do not exist: same pattern
            before, after = min(before, sub_len), min(after, sub_len)
        widest = max(before, after, 1)
        chunk = -(-widest // -(-widest // _MAX_CHUNK))
        return cls(before, after, chunk, -(-before // chunk), -(-after // chunk))

    @property
    def reach(self) -> int:
        """Keys before a chunk's first query that its window blocks hold."""
        return self.blocks * self.chunk

    @property
    def reach_after(self) -> int:
        return self.blocks_after * self.chunk

    @property
    def num_blocks(self) -> int:
        """Key blocks per chunk: j + 1 + a."""
        return self.blocks + 1 + self.blocks_after

    @property
    def span(self) -> int:
        return self.num_blocks * self.chunk

    def mask(
        self, key_real: torch.Tensor, global_pos: torch.Tensor, global_valid: torch.Tensor
    ) -> torch.Tensor:
        """(num_chunks, B, chunk, span + G) bool: which window and global keys each query may see.

        Args:
            key_real: (B, m) bool, False for padded keys.
            global_pos: (B, G) position of each global key in this sequence (far away if not in it): a
                global key inside a query's window is already a local key, so its global column is masked.
            global_valid: (B, G) bool, False for unused slots.
        """
        device, m = key_real.device, key_real.shape[1]
        num_chunks = m // self.chunk
        # Query a of chunk t sits at t chunk + a; window key e at t chunk - reach + e.
        offset = (
            torch.arange(self.span, device=device)
            - self.reach
            - torch.arange(self.chunk, device=device)[:, None]
        )
        band = (offset >= -self.before) & (offset <= self.after)  # (chunk, span)
        # The query itself is always allowed, so padded query rows never have an empty softmax.
        window_real = self.windows(key_real[:, None, :, None])[:, 0, :, :, 0].transpose(
            0, 1
        )  # (chunks, B, span)
        local = band & (window_real[:, :, None, :] | (offset == 0))  # (num_chunks, B, chunk, span)
        query_pos = torch.arange(m, device=device).view(num_chunks, 1, self.chunk, 1)
        relative = global_pos[None, :, None, :] - query_pos  # (num_chunks, B, chunk, G)
        in_window = (relative >= -self.before) & (relative <= self.after)
        return torch.cat([local, global_valid[None, :, None, :] & ~in_window], dim=-1)

    def windows(self, x: torch.Tensor) -> torch.Tensor:
        """(B, h, m, d) -> (B, h, num_chunks, span, d): the window keys of every chunk (zeros past the ends),
        as j + 1 + a shifted views of the blocks."""
        num_chunks = x.shape[2] // self.chunk
        padded = F.pad(x, (0, 0, self.reach, self.reach_after))  # (B, h, m + reaches, d)
        blocks = padded.unflatten(2, (num_chunks + self.num_blocks - 1, self.chunk))
        return torch.cat([blocks[:, :, o : o + num_chunks] for o in range(self.num_blocks)], dim=3)

    def groups(self, q: torch.Tensor, num_global: int) -> list[tuple[int, int]]:
        """Chunk ranges processed per kernel call, so that a group's keys stay under ~24 MiB."""
        batch, h, m, d = q.shape
        num_chunks = m // self.chunk
        size = rows_per_chunk(
            batch * h * (self.span + num_global) * d * q.element_size(), num_chunks, _GROUP_BYTES
        )
        return [(start, min(start + size, num_chunks)) for start in range(0, num_chunks, size)]

    def group(self, q, k, v, global_key, global_value, start: int, stop: int) -> tuple[torch.Tensor, ...]:
        """Queries (size B, h, chunk, d) and keys, values (size B, h, span + G, d) of chunks start:stop."""
        batch, h, m, d = q.shape
        size, c, j, a = stop - start, self.chunk, self.blocks, self.blocks_after
        # (B, h, m, d) -> (B, h, num_chunks, chunk, d) -> (size, B, h, chunk, d) -> (size B, h, chunk, d)
        queries = q.view(batch, h, m // c, c, d)[:, :, start:stop].permute(2, 0, 1, 3, 4).reshape(-1, h, c, d)
        lo, hi = (start - j) * c, (stop + a) * c
        out = [queries]
        for x, extra in ((k, global_key), (v, global_value)):
            piece = x[:, :, max(lo, 0) : min(hi, m)]  # a view, padded (copied) only at the ends
            if lo < 0 or hi > m:
                piece = F.pad(piece, (0, 0, max(0, -lo), max(0, hi - m)))
            # (B, h, (size + j + a) c, d) -> (B, h, size + j + a, c, d)
            # -> unfold (B, h, size, c, d, j + 1 + a) -> (size, B, h, j + 1 + a, c, d)
            # -> (size, B, h, span, d)
            blocks = piece.view(batch, h, size + j + a, c, d).unfold(2, self.num_blocks, 1)
            blocks = blocks.permute(2, 0, 1, 5, 3, 4)  # (size, B, h, j + 1 + a, c, d)
            # One copy straight into the group's keys: (size, B, h, span + G, d), globals last.
            keys = x.new_empty(size, batch, h, self.span + extra.shape[2], d)
            keys[:, :, :, : self.span].unflatten(3, (self.num_blocks, c)).copy_(blocks)
            keys[:, :, :, self.span :].copy_(extra[None].expand(size, -1, -1, -1, -1))
            out.append(keys.flatten(0, 1))  # (size B, h, span + G, d)
        return tuple(out)


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(chunks, B, chunk, keys) bool -> (chunks B, 1, chunk, keys) additive mask (0 / -inf)."""
    return (
        torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        .masked_fill_(~mask, float("-inf"))
        .flatten(0, 1)[:, None]
    )


class _CpuFlashWindow(torch.autograd.Function):
    """Window attention through torch's fused CPU flash kernel, recomputing the windows in backward.

    Saves only q, k, v, the output and the log-sum-exp (O(n d)); window gradients are accumulated block by
    block into the key gradient, so no intermediate is larger than one group (~24 MiB).
    """

    @staticmethod
    def forward(ctx, q, k, v, global_key, global_value, mask, window: _Window, scale: float):
        outputs, lses = [], []
        for start, stop in window.groups(q, global_key.shape[2]):
            inputs = window.group(q, k, v, global_key, global_value, start, stop)
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                *inputs, 0.0, False, attn_mask=_additive(mask[start:stop], q.dtype), scale=scale
            )
            outputs.append(out)
            lses.append(lse)
        out = torch.cat(outputs)  # (num_chunks B, h, chunk, d)
        ctx.save_for_backward(q, k, v, global_key, global_value, mask, out, torch.cat(lses))
        ctx.window, ctx.scale = window, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, global_key, global_value, mask, out, lse = ctx.saved_tensors
        window, (batch, h, m, d) = ctx.window, q.shape
        c, j, span = window.chunk, window.blocks, window.span
        grad_out = grad_out.contiguous()
        grad_q = torch.empty_like(q)
        grad_kv = [torch.zeros_like(k), torch.zeros_like(v)]
        grad_global = [torch.zeros_like(global_key), torch.zeros_like(global_value)]
        for start, stop in window.groups(q, global_key.shape[2]):
            rows = slice(start * batch, stop * batch)
            grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad_out[rows],
                *window.group(q, k, v, global_key, global_value, start, stop),
                out[rows],
                lse[rows],
                0.0,
                False,
                attn_mask=_additive(mask[start:stop], q.dtype),
                scale=ctx.scale,
            )
            # (size B, h, chunk, d) -> (size, B, h, chunk, d) -> (B, h, size, chunk, d)
            dq = grads[0].view(-1, batch, h, c, d).permute(1, 2, 0, 3, 4)
            grad_q.view(batch, h, m // c, c, d)[:, :, start:stop] = dq
            for grad, total, glob in zip(grads[1:], grad_kv, grad_global, strict=True):
                grad = grad.view(-1, batch, h, span + glob.shape[2], d)  # (size, B, h, span + G, d)
                local = grad[:, :, :, :span].unflatten(3, (window.num_blocks, c))  # (size, B, h, j+1+a, c, d)
                blocks = total.view(batch, h, m // c, c, d)  # (B, h, num_chunks, c, d)
                for o in range(window.num_blocks):  # window block o of chunk t is key block t + o - j
                    lo, hi = max(start + o - j, 0), min(stop + o - j, m // c)
                    shift = start + o - j
                    blocks[:, :, lo:hi] += local[lo - shift : hi - shift, :, :, o].permute(1, 2, 0, 3, 4)
                glob += grad[:, :, :, span:].sum(0)
        return grad_q, *grad_kv, *grad_global, None, None, None
