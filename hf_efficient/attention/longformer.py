"""Longformer: sliding-window attention with dilation and global tokens (Beltagy et al. 2020).

    out_i = sum_{j in A(i)} softmax_j(q_i . k_j / sqrt(d)) v_j
    A(i)  = {i + t r : |t| <= w/2} ∪ G          for a local token i (window w, dilation r, globals G)
    A(g)  = {all real tokens}                     for a global token g in G

Every token attends to the global tokens and every global token attends to everything (symmetric). A
global key that also lies in the window is counted once: local and global keys share ONE softmax.

Causal form (``is_causal=True``, a decoder): token i sees itself and the w earlier tokens of its residue,
A(i) = {i - t r : 0 <= t <= w}, as many keys as the two-sided window (the whole span moved to the left, as
the autoregressive models of the paper's section 4). Decoding keeps the last w r keys and values of each
layer (a :class:`~hf_efficient.attention.cache.SlidingWindowCacheLayer`): memory and time per token
independent of the context. It has no global tokens (they attend to later tokens): ``[]`` when causal.

:meth:`LongformerAttention.reference` computes the window as overlapping chunks (the paper's scheme): O(n
(w + |G|) d) time and O(n (w + |G|)) memory; its kernels (:mod:`~.kernels.longformer`): ``"native"`` (the
chunks a group at a time, on CPU through torch's flash kernel) and ``"flex"``. Relative positions (BERT's
``relative_key[_query]``, :mod:`.relative`) add each pair's distance score, in the reference.

Deviations from the paper:
    * Longformer has separate projections Q_g, K_g, V_g for global attention. Projections live outside the
      cores here, so global rows use the same q/k/v as local ones (load a Longformer checkpoint by dropping
      or averaging its ``*_global`` weights; parity with transformers holds when they equal the local ones).
    * Windows and dilation are one value for all heads and layers (the paper varies them per layer/head).
    * Padding is internal: any length works (upstream needs a multiple of ``attention_window``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicLayer

from .base import ROTATE_QUERIES_AND_KEYS, AttentionCapabilities, AttentionCore, AttentionOutput
from .cache import SlidingWindowCacheLayer
from .config import AttentionConfig
from .dropout import fast_dropout, sdpa
from .inputs import AttentionInputs, is_tracing
from .kernels.flex import BlockMaskCache
from .kernels.longformer import LONGFORMER_KERNELS, chunk_size
from .registry import register_attention
from .relative import band_scores
from .utils import band_pairs, pad_to_multiple, unpad


@dataclass
class LongformerAttentionConfig(AttentionConfig):
    """Hyperparameters of :class:`LongformerAttention`.

    Attributes:
        attention_window: two-sided window w (HF's ``LongformerConfig.attention_window``): each token sees
            w / 2 keys on each side plus itself. Even, >= 2.
        attention_dilation: dilation r >= 1; token i sees i + t r for |t| <= w / 2.
        global_token_indices: positions that are global in every example (e.g. [0] for CLS); per-example
            global tokens come through the ``global_attention_mask`` input instead.
        implementation: ``"auto"`` (FlexAttention on CUDA without dropout, the chunked ``"native"`` kernel
            otherwise, the reference while tracing), ``"reference"``, ``"native"`` or ``"flex"``.
    """

    attention_window: int = 512
    attention_dilation: int = 1
    global_token_indices: list[int] = field(default_factory=list)

    def validate(self) -> None:
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


@register_attention("longformer")
class LongformerAttention(AttentionCore):
    config_class = LongformerAttentionConfig
    kernels = LONGFORMER_KERNELS
    cross_attention_refusal = (
        "its sliding window pairs query i with the keys around position i of the same sequence, which a "
        "decoder's query has no place in (Longformer-Encoder-Decoder uses full cross-attention too)"
    )
    capabilities = AttentionCapabilities(
        global_attention_mask=True, causal=True, relative_positions=True, rotary=ROTATE_QUERIES_AND_KEYS
    )
    paper = "Beltagy et al. 2020, Longformer: The Long-Document Transformer"
    cost = "O(n·w)"
    summary = "sliding window (optional dilation) + global tokens by index or per-example mask; causal window"
    small_config = {"attention_window": 6, "global_token_indices": [0]}
    causal_small_config = {"attention_window": 6}  # the causal form has no global tokens
    benchmark_config = {"attention_window": 512}  # Longformer's window for long inputs
    export_note = (
        "global_token_indices baked in (no per-example global_attention_mask); window chunks at once"
    )
    lra_listops = ("Longformer", 35.63)

    @classmethod
    def sliding_window_config(cls, window: int) -> dict[str, Any]:
        """A window of ``window`` tokens: ``attention_window`` (both sides together) and no global tokens."""
        return {"attention_window": window, "global_token_indices": []}

    script_configs = {  # vision: the patch rows above and below; mqar: the default covers a sequence whole
        "text": {"attention_config": {"attention_window": 128, "global_token_indices": [0]}},
        "listops": {"attention_config": {"attention_window": 128, "global_token_indices": [0]}},
        "mqar": {"attention_config": {"attention_window": 16, "global_token_indices": []}},
        "vision": {"attention_config": {"attention_window": 14, "global_token_indices": [0]}},
        "clm": {"attention_config": {"attention_window": 32, "global_token_indices": []}},
    }

    @classmethod
    def forward_flops(cls, n, head_dim, config, num_edges=None):
        """4 d (band pairs + 2 G n): window |i - j| <= w/2 per dilation residue, G global rows, columns."""
        half, r = config.attention_window // 2, config.attention_dilation
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
        self.flex_masks = BlockMaskCache()  # the flex kernel's masks of unpadded lengths, rebuilt on demand

    def covered_length(self) -> int | None:
        """Without dilation, token i sees every token within w / 2 on each side (w before it, causal): inputs
        of w / 2 + 1 tokens (w + 1) are covered whole. Dilation skips tokens at every length."""
        if self.config.attention_dilation != 1:
            return None
        return self.config.attention_window + 1 if self.spec.causal else self.config.attention_window // 2 + 1

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
        # (b, h, held + n, d) keys and values, (b, held + n) mask
        keys, values, key_mask = layer.update_with_mask(key, value, inputs.attention_mask)
        if held == 0:
            return self._attend(query, key, value, inputs)
        total, r = held + n, self.config.attention_dilation
        real = key_mask if key_mask is not None else torch.ones(b, total, dtype=torch.bool, device=key.device)
        if n == 1:
            distance = torch.arange(held, -1, -1, device=key.device)  # (held + 1,): the query is the last
            allowed = ((distance % r == 0) & (real | (distance == 0)))[:, None, None, :]  # all within w r
            if inputs.relative_positions is not None:  # (b, h, 1, held + 1) scores, -inf where not allowed
                scores = inputs.relative_positions.scores(query, keys, distance[None], self.scaling)
                allowed = scores.masked_fill(~allowed, float("-inf"))
            out = F.scaled_dot_product_attention(query, keys, values, attn_mask=allowed, scale=self.scaling)
            return AttentionOutput(out, None)
        queries = torch.cat([query.new_zeros(b, h, held, d), query], dim=2)  # kept tokens: outputs dropped
        joined = inputs.replace(attention_mask=key_mask, cache=None).prepare(b, total, "longformer")
        return AttentionOutput(self._attend(queries, keys, values, joined).output[:, :, held:], None)

    def reference(self, query, key, value, inputs: AttentionInputs) -> AttentionOutput:
        """The window as overlapping chunks, every chunk at once, then the global rows.

        Dilation: the tokens of one residue mod r form an undilated subsequence, (b, h, m r, d) ->
        (b r, h, m, d). Its queries come in chunks of c; chunk t sees key blocks t - j .. t + a (j c >= the
        keys before a query, a c >= those after), masked to the exact band, and the G global keys (a global
        key inside the window is already a local key: its global column is masked, so it counts once).
        """
        b, h, n, d = query.shape
        w, r, device = self.config.attention_window, self.config.attention_dilation, query.device
        before, after = (w, 0) if inputs.is_causal else (w // 2, w // 2)  # window keys before / after a query
        c = chunk_size(before, after)  # queries per chunk
        j, a = -(-before // c), -(-after // c)  # key blocks before / after a chunk's own
        mask, rel = inputs.attention_mask, inputs.relative_positions
        real = mask if mask is not None else torch.ones(b, n, dtype=torch.bool, device=device)  # (b, n)
        is_global = self._global_tokens(inputs, b, n, device)  # (b, n) or None
        slot_pos, slot_valid = self._global_slots(is_global, inputs, b, n, device)  # (b, G), (b, G)
        index = slot_pos[:, None, :, None].expand(b, h, -1, d)
        global_key, global_value = key.gather(2, index), value.gather(2, index)  # (b, h, G, d)

        q, k, v = (pad_to_multiple(t, r * c) for t in (query, key, value))  # (b, h, m r, d)
        key_real = pad_to_multiple(real, r * c, dim=-1, value=False)  # (b, m r)
        m = q.shape[2] // r
        if r > 1:  # (b, h, m r, d) -> (b r, h, m, d): subsequence s holds positions s, s + r, ...
            q, k, v = (t.unflatten(2, (m, r)).permute(0, 3, 1, 2, 4).flatten(0, 1) for t in (q, k, v))
            key_real = key_real.unflatten(1, (m, r)).transpose(1, 2).flatten(0, 1)  # (b r, m)
            global_key, global_value = (t.repeat_interleave(r, dim=0) for t in (global_key, global_value))
        num_chunks, span = m // c, (j + 1 + a) * c

        def windows(x):  # (B, h, m, d) -> (B, h, num_chunks, span, d): each chunk's keys, 0 past the ends
            blocks = F.pad(x, (0, 0, j * c, a * c)).unflatten(2, (num_chunks + j + a, c))
            return torch.cat([blocks[:, :, o : o + num_chunks] for o in range(j + 1 + a)], dim=3)

        # query e of chunk t sits at t c + e, its window key f at t c - j c + f
        offset = torch.arange(span, device=device) - j * c - torch.arange(c, device=device)[:, None]
        band = (offset >= -before) & (offset <= after)  # (c, span)
        window_real = windows(key_real[:, None, :, None])[:, :, :, None, :, 0]  # (B, 1, chunks, 1, span)
        local = band & (window_real | (offset == 0))  # the query itself: no padded row is left empty
        # a global key's position in subsequence s, or far away when it belongs to another residue
        same = (slot_pos % r)[:, None, :] == torch.arange(r, device=device)[None, :, None]  # (b, r, G)
        sub_pos = torch.where(same, (slot_pos // r)[:, None, :], -4 * (m + span)).flatten(0, 1)  # (B, G)
        relative = sub_pos[:, None, None, :] - torch.arange(m, device=device).view(num_chunks, c, 1)
        in_window = (relative >= -before) & (relative <= after)  # (B, chunks, c, G)
        glob = slot_valid.repeat_interleave(r, dim=0)[:, None, None, :] & ~in_window
        allowed = torch.cat([local[:, 0], glob], dim=-1)[:, None]  # (B, 1, chunks, c, span + G)

        queries = q.unflatten(2, (num_chunks, c))  # (B, h, chunks, c, d)
        keys, values = (
            torch.cat([windows(x), g[:, :, None].expand(-1, -1, num_chunks, -1, -1)], dim=3)
            for x, g in ((k, global_key), (v, global_value))
        )  # (B, h, chunks, span + G, d)
        scores = (queries * self.scaling) @ keys.transpose(-1, -2)  # (B, h, chunks, c, span + G)
        if rel is not None:
            scores = scores + band_scores(rel, queries, keys, offset, slot_pos, r, self.scaling)
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        probs = fast_dropout(probs, self.spec.dropout, self.training)
        out = (probs @ values).flatten(2, 3)  # (B, h, m, d)
        if r > 1:  # back to position t r + s
            out = out.unflatten(0, (b, r)).permute(0, 2, 3, 1, 4).flatten(2, 3)  # (b, h, m r, d)
        out = unpad(out, n)
        if is_global is not None:
            out = self._global_rows(out, query, key, value, real, is_global, slot_pos, slot_valid, rel)
        return AttentionOutput(out, None)

    def _global_rows(self, out, query, key, value, real, is_global, slot_pos, slot_valid, rel=None):
        """Replace the rows of global tokens by dense attention over all real keys (plus ``rel``'s scores):
        out (b, h, n, d), slots (b, G) as :meth:`_global_slots` gives them (unused slots are dropped)."""
        b, h, n, d = query.shape
        gather_index = slot_pos[:, None, :, None].expand(b, h, -1, d)  # (b, h, G, d)
        global_query, mask = query.gather(2, gather_index), real[:, None, None, :]
        if rel is not None:  # (b, h, G, n) scores of the global queries, -inf at padding
            scores = rel.position_scores(global_query, key, slot_pos[:, None], torch.arange(n), self.scaling)
            mask = scores.masked_fill(~mask, float("-inf"))
        dropout = self.spec.dropout if self.training else 0.0
        global_out = sdpa(
            global_query, key, value, attn_mask=mask, dropout_p=dropout, scale=self.scaling
        )  # (b, h, G, d)
        # Into their positions by a scatter and a select (no nonzero: its size would be a value).
        rows = global_out.masked_fill(~slot_valid[:, None, :, None], 0.0)  # unused slots add nothing
        placed = torch.zeros_like(out).scatter_add(2, gather_index, rows)  # (b, h, n, d)
        return torch.where(is_global[:, None, :, None], placed, out)

    def _global_tokens(self, inputs: AttentionInputs, b, n, device) -> torch.Tensor | None:
        """(b, n) bool of global tokens from the config's indices and the per-example mask, or None."""
        indices, global_attention_mask = self.config.global_token_indices, inputs.global_attention_mask
        if global_attention_mask is not None and is_tracing():
            raise ValueError(
                "longformer: per-example global tokens (global_attention_mask) cannot be traced by "
                "torch.export / torch.compile: how many tokens are global is a value of the mask, and the "
                "global rows are gathered into that many slots. Make the global positions part of the model "
                "instead (attention_config global_token_indices, e.g. [0] for [CLS]) and drop the mask."
            )
        if inputs.is_causal and (indices or global_attention_mask is not None):
            raise ValueError(
                "longformer: the causal form has no global tokens (a global token attends to every token, "
                "later ones too); drop global_attention_mask and use global_token_indices=[] in a causal "
                "model."
            )
        if not indices:
            return global_attention_mask
        if not is_tracing() and max(indices) >= n:  # a traced graph leaves positions past n out instead
            raise ValueError(
                f"longformer: global_token_indices {indices} point past the sequence of length {n}."
            )
        chosen = self._configured_global_positions(device)  # (G,)
        is_global = (torch.arange(n, device=device)[:, None] == chosen).any(-1).expand(b, n)  # (b, n)
        if global_attention_mask is not None:
            is_global = is_global | global_attention_mask
        if inputs.attention_mask is not None:
            is_global = is_global & inputs.attention_mask  # a padded token is never global
        if global_attention_mask is None:
            return is_global  # the configured positions, known on the host (padding may hide some)
        return is_global if bool(is_global.any()) else None

    def _configured_global_positions(self, device) -> torch.Tensor:
        """global_token_indices, (G,) ascending and unique, made on ``device`` (no host-device copy)."""
        positions = sorted(set(self.config.global_token_indices))
        return torch.stack([torch.full((), p, dtype=torch.long, device=device) for p in positions])

    def _global_slots(
        self, is_global, inputs: AttentionInputs, b: int, n: int, device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each example's global positions, (b, G), and (b, G) bool marking the slots in use (an unused
        slot holds some non-global position). With a per-example global_attention_mask: the global
        positions in ascending order, G the largest count of an example, read from the device; otherwise the
        G configured positions, known on the host (no device read: traceable, and no GPU sync)."""
        if is_global is None:
            empty = torch.zeros(b, 0, dtype=torch.long, device=device)
            return empty, empty.bool()
        if inputs.global_attention_mask is None:
            chosen = self._configured_global_positions(device)  # (G,)
            slot_pos = chosen.clamp(max=n - 1).expand(b, -1)  # positions past n (while tracing) stay unused
            return slot_pos, is_global.gather(1, slot_pos) & (chosen < n)
        count = is_global.sum(1)  # (b,)
        slot_pos = torch.sort((~is_global).int(), dim=1, stable=True).indices[:, : int(count.max())]
        return slot_pos, torch.arange(slot_pos.shape[1], device=device)[None] < count[:, None]
