"""Exact softmax attention through Hugging Face's kernels.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d) + B + M) V

B is an optional additive bias (Graphormer's spatial/edge encodings, relative positions), M the padding
(and causal) mask. Cost O(n^2 d) time; memory O(n^2) with the eager kernel, O(n) with sdpa's
flash-style CPU kernel. The kernel is HF's ``attn_implementation``: ``"eager"`` is BERT's own
``eager_attention_forward``, every other name is looked up in ``ALL_ATTENTION_FUNCTIONS`` (sdpa, flex,
flash...). Requesting attention weights runs the eager kernel for that call, as the others return none.
"""

from __future__ import annotations

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.bert.modeling_bert import eager_attention_forward

from .base import AttentionCapabilities, AttentionCore, AttentionOutput, AttentionSpec
from .flex import BlockMask, BlockMaskCache, blocks_all, flex_attend, flex_block_mask, num_blocks, use_flex
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
    lra_listops = ("Transformer", 36.37)
    summary = (
        "exact softmax through HF kernels (`attn_implementation`: eager, sdpa, flex...); additive bias; "
        "causal; weights"
    )
    export_note = "eager or sdpa kernel (FlexAttention has no ONNX form); ONNX Runtime forms the n x n scores"

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
            causal = torch.full((n, n), torch.finfo(query.dtype).min, dtype=query.dtype, device=query.device)
            causal = causal.triu(1)[None, None]  # (1, 1, n, n), -inf above the diagonal
            mask = causal if mask is None else mask + causal
            is_causal = False  # now carried by the mask
        impl = "eager" if output_attentions else implementation
        check_kernel(impl)
        kernel = eager_attention_forward if impl == "eager" else ALL_ATTENTION_FUNCTIONS[impl]
        output, weights = kernel(
            self, query, key, value, mask, dropout=dropout, scaling=self.scaling, is_causal=is_causal
        )
        # HF kernels return (b, n, h, d); the contract is (b, h, n, d).
        return AttentionOutput(output.transpose(1, 2), weights if output_attentions else None)

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
