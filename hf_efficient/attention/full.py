"""Exact softmax attention through Hugging Face's kernels.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d) + B + M) V

B is an optional additive bias (Graphormer's spatial/edge encodings, relative positions), M the padding
(and causal) mask. Cost O(n^2 d) time; memory O(n^2) with the eager kernel, O(n) with sdpa's
flash-style CPU kernel. The kernel is HF's ``attn_implementation``: ``"eager"`` is BERT's own
``eager_attention_forward``, every other name is looked up in ``ALL_ATTENTION_FUNCTIONS`` (sdpa, flex,
flash...). Requesting attention weights runs the eager kernel for that call, as the others return none.

Decoding (a cache in the inputs): every key and value so far is kept (transformers' ``DynamicLayer``, in a
:class:`~hf_efficient.attention.cache.KeyValueCacheLayer`), so each new token costs O(T d) against the T
tokens before it, and the cache grows as O(T h d) per layer.
"""

from __future__ import annotations

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.bert.modeling_bert import eager_attention_forward

from .base import AttentionCapabilities, AttentionCore, AttentionOutput, AttentionSpec
from .cache import KeyValueCacheLayer
from .kernels.flex import BlockMask, BlockMaskCache, blocks_all, flex_attend, flex_block_mask, num_blocks, use_flex
from .inputs import AttentionInputs
from .registry import register_attention
from .utils import additive_mask


def check_kernel(implementation: str) -> None:
    """Raise for an ``attn_implementation`` that is neither eager nor one of HF's attention functions."""
    if implementation != "eager" and implementation not in ALL_ATTENTION_FUNCTIONS:
        valid = ["eager", *ALL_ATTENTION_FUNCTIONS.keys()]
        raise ValueError(f"Unknown attn_implementation {implementation!r}; valid: {', '.join(valid)}.")


@register_attention("full")
class FullAttention(AttentionCore):
    capabilities = AttentionCapabilities(
        attention_bias=True, causal=True, output_attentions=True, permutation_equivariant=True
    )
    paper = "Vaswani et al. 2017, Attention Is All You Need"
    cost = "O(n²)"
    summary = (
        "exact softmax through HF kernels (`attn_implementation`: eager, sdpa, flex...); additive bias; "
        "causal; weights"
    )

    @classmethod
    def forward_flops(cls, n, head_dim, config, num_edges=None):
        """4 n^2 d: Q K^T and P V over all n x n pairs."""
        return 4.0 * n * n * head_dim

    def __init__(self, spec: AttentionSpec, config=None):
        super().__init__(spec, config)
        check_kernel(spec.attn_implementation)
        self.flex_masks = BlockMaskCache()  # FlexAttention masks of unpadded causal lengths
        self.is_causal = False  # read by HF kernels as a fallback; we always pass is_causal explicitly

    def _attend(self, query, key, value, inputs: AttentionInputs) -> AttentionOutput:
        is_causal, output_attentions = inputs.is_causal, inputs.output_attentions
        n = query.shape[-2]
        implementation = self.attn_implementation(inputs)
        dropout = self.spec.dropout if self.training else 0.0
        if not output_attentions and self._on_flex(implementation, query, inputs, dropout):
            return AttentionOutput(self._attend_flex(query, key, value, inputs), None)
        mask = additive_mask(inputs.attention_mask, query.dtype)  # (b, 1, 1, n) or None
        if inputs.attention_bias is not None:
            bias = inputs.attention_bias.to(query.dtype)
            mask = bias if mask is None else mask + bias  # (b|1, h|1, n, n)
        if is_causal and (mask is not None or output_attentions or implementation == "eager"):
            mask = _with_causal(mask, n, n, query)
            is_causal = False  # now carried by the mask
        return self._kernel(query, key, value, mask, is_causal, implementation, output_attentions, dropout)

    def _kernel(
        self, query, key, value, mask, is_causal: bool, implementation: str, output_attentions: bool, dropout
    ) -> AttentionOutput:
        """softmax(Q K^T / sqrt(d) + mask) V through HF's kernel (eager when weights are wanted); queries
        (b, h, n, d) and keys (b, h, T, d) may differ in length (decoding)."""
        impl = "eager" if output_attentions else implementation
        check_kernel(impl)
        kernel = eager_attention_forward if impl == "eager" else ALL_ATTENTION_FUNCTIONS[impl]
        output, weights = kernel(
            self, query, key, value, mask, dropout=dropout, scaling=self.scaling, is_causal=is_causal
        )
        # HF kernels return (b, n, h, d); the contract is (b, h, n, d).
        return AttentionOutput(output.transpose(1, 2), weights if output_attentions else None)

    def new_cache_layer(self) -> KeyValueCacheLayer:
        return KeyValueCacheLayer()

    def _attend_cached(self, query, key, value, inputs: AttentionInputs, layer) -> AttentionOutput:
        """The new tokens' queries against every key so far (transformers' KV cache): (b, h, n, T) scores,
        padded keys masked, the new tokens causal among themselves. Attention weights come back as
        (b, h, n, T). The prompt goes through the parallel causal form (a 64k-token prompt with an explicit
        (n, T) mask would need 16 GiB); after it, FlexAttention is not used: a few queries against a growing
        cache suit sdpa."""
        if inputs.attention_bias is not None:
            raise ValueError(
                "full: an attention_bias cannot be used with a generation cache (it is (n, n) over the new "
                "tokens only); decode without the bias, or without a cache."
            )
        keys, values, key_mask = layer.update_with_mask(key, value, inputs.attention_mask)  # (b, h, T, d)
        n, total = query.shape[2], keys.shape[2]
        if total == n:  # the prompt: the parallel causal form (sdpa's causal kernel, no (n x n) mask)
            return self._attend(query, key, value, inputs)
        mask = additive_mask(key_mask, query.dtype)  # (b, 1, 1, T) or None
        if n > 1:
            mask = _with_causal(mask, n, total, query)
        implementation = self.attn_implementation(inputs)
        if implementation == "flex_attention":
            implementation = "sdpa"
        dropout = self.spec.dropout if self.training else 0.0
        return self._kernel(
            query, keys, values, mask, False, implementation, inputs.output_attentions, dropout
        )

    @staticmethod
    def _on_flex(implementation: str, query, inputs: AttentionInputs, dropout: float) -> bool:
        """FlexAttention for ``attn_implementation="flex_attention"`` only: with a dense per-head bias
        (Graphormer's) sdpa and FlexAttention took the same time and memory on an H200 (4k-16k tokens,
        ``benchmarks/results/reference/gpu``), and sdpa needs no compilation."""
        return implementation == "flex_attention" and use_flex("flex", query, dropout)

    def _attend_flex(self, query, key, value, inputs: AttentionInputs) -> torch.Tensor:
        """Padding and causality as a block mask, the bias (per head) as a score_mod; (b, h, n, d).

        transformers' flex function reads a padding mask per query position and a bias from head 0 only,
        so this core builds its own masks."""
        b, h, n, _ = query.shape
        real, causal = inputs.attention_mask, inputs.is_causal  # (b, n) bool or None
        score_mod = None
        if inputs.attention_bias is not None:
            bias = inputs.attention_bias.to(query.dtype).expand(b, h, n, n)

            def score_mod(score, batch, head, q, k):
                return score + bias[batch, head, q, k]

        mask = None  # unpadded and not causal: every pair
        if real is not None or causal:
            cache_key = (n, str(query.device)) if real is None else None  # unpadded causal: one per length
            mask = self.flex_masks.get(cache_key, lambda: self._flex_mask(n, real, causal, query.device))
        return flex_attend(query, key, value, mask, self.scaling, score_mod)

    @staticmethod
    def _flex_mask(n, real, causal, device) -> BlockMask:
        """Block mask of padding (real: (b, n) bool or None) and causality; batch dimension real's or 1."""

        def mask_mod(batch, head, q, k):
            allowed = q >= k if causal else q >= 0
            return allowed & real[batch, k] if real is not None else allowed

        b, nb = 1 if real is None else real.shape[0], num_blocks(n)
        rows = torch.arange(nb, device=device)
        lower = rows[:, None] >= rows[None, :]  # (nb, nb): block pairs with some k <= q
        partial = (lower if causal else torch.ones_like(lower))[None, None]  # (1, 1, nb, nb)
        full = (rows[:, None] > rows[None, :] if causal else torch.ones_like(lower))[None, None]
        if real is not None:  # a block is full only if all its keys are real
            full = full & blocks_all(real)[:, None, None, :]
        return flex_block_mask(partial.expand(b, 1, nb, nb), mask_mod, n, full=full.expand(b, 1, nb, nb))


def _with_causal(mask: torch.Tensor | None, n: int, total: int, like: torch.Tensor) -> torch.Tensor:
    """``mask`` plus the causal mask of the last n of ``total`` positions: query i (at total - n + i) sees
    keys j <= total - n + i; (b|1, 1, n, total) additive."""
    causal = torch.full((n, total), torch.finfo(like.dtype).min, dtype=like.dtype, device=like.device)
    causal = causal.triu(total - n + 1)[None, None]  # (1, 1, n, total), min above the shifted diagonal
    return causal if mask is None else mask + causal
