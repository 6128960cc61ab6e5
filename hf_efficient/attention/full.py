"""Exact softmax attention (Vaswani et al. 2017, "Attention Is All You Need", equation 1).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d) + B + M) V

B is an optional additive bias (Graphormer's spatial/edge encodings) plus, when given, BERT's learned
relative position scores (:mod:`~hf_efficient.attention.relative`: formed as a dense (b, h, n, T) bias, as
BERT's eager attention forms them, so that every kernel runs them; O(n^2 d) memory), M the padding (and
causal) mask: 0 where a query may see a key, the dtype's minimum where it may not. Cost O(n^2 d) time; the
reference forms the n x n scores (O(n^2) memory), sdpa's flash-style kernel does not (O(n)).

The reference (:meth:`FullAttention.reference`) is BERT's eager maths; the kernels
(:mod:`~hf_efficient.attention.kernels.full`) run Hugging Face's ``attn_implementation`` (``"hf"``: eager,
sdpa, flash...) or FlexAttention (``"flex"``, for ``attn_implementation="flex_attention"``). ``"auto"``
takes ``flex`` for flex_attention where it can, ``hf`` otherwise; requesting attention weights runs the
eager function for that call, as the others return none.

Decoding (a cache in the inputs): every key and value so far is kept (transformers' ``DynamicLayer``, in a
:class:`~hf_efficient.attention.cache.KeyValueCacheLayer`), so each new token costs O(T d) against the T
tokens before it, and the cache grows as O(T h d) per layer. The prompt goes through the parallel causal
form; later tokens attend to the (n, T) keys so far with their mask M (causal on the shifted diagonal).
"""

from __future__ import annotations

import torch

from .base import (
    ROTATE_QUERIES_AND_KEYS,
    AttentionCapabilities,
    AttentionCore,
    AttentionOutput,
    AttentionSpec,
)
from .cache import KeyValueCacheLayer
from .dropout import fast_dropout
from .inputs import AttentionInputs
from .kernels.flex import BlockMaskCache
from .kernels.full import FULL_KERNELS, check_kernel, hf_function_name, run_hf
from .registry import register_attention
from .relative import offset_distances
from .utils import additive_mask


@register_attention("full")
class FullAttention(AttentionCore):
    kernels = FULL_KERNELS
    capabilities = AttentionCapabilities(
        attention_bias=True,
        causal=True,
        output_attentions=True,
        permutation_equivariant=True,
        cross_attention=True,
        relative_positions=True,
        rotary=ROTATE_QUERIES_AND_KEYS,
    )
    paper = "Vaswani et al. 2017, Attention Is All You Need"
    cost = "O(n²)"
    summary = (
        "exact softmax through HF kernels (`attn_implementation`: eager, sdpa, flex...); additive bias; "
        "causal; weights"
    )
    export_note = "eager or sdpa kernel (FlexAttention has no ONNX form); ONNX Runtime forms the n x n scores"
    lra_listops = ("Transformer", 36.37)
    script_configs = {  # graph: Graphormer (the spatial and edge-encoding bias, a virtual token for pooling)
        "graph": {
            "model": {
                "graph_bias": "graphormer",
                "max_spatial_distance": 20,
                "max_edge_hops": 5,
                "add_virtual_token": True,
                "graph_pooling": "virtual_token",
            }
        }
    }

    @classmethod
    def forward_flops(cls, n, head_dim, config, num_edges=None):
        """4 n^2 d: Q K^T and P V over all n x n pairs."""
        return 4.0 * n * n * head_dim

    def __init__(self, spec: AttentionSpec, config=None):
        super().__init__(spec, config)
        check_kernel(spec.attn_implementation)
        self.flex_masks = BlockMaskCache()  # FlexAttention masks of unpadded causal lengths
        self.is_causal = False  # read by HF kernels as a fallback; we always pass is_causal explicitly

    def _attend(self, query, key, value, inputs: AttentionInputs, **carried) -> AttentionOutput:
        """The parallel form; relative position scores join the bias first, so every kernel sees them."""
        relative = inputs.relative_positions
        if relative is not None:
            distance = offset_distances(query.shape[2], query.shape[2], query.device)  # (n, n)
            bias = relative.scores(query, key, distance, self.scaling)  # (b, h, n, n)
            if inputs.attention_bias is not None:
                bias = bias + inputs.attention_bias.to(bias.dtype)
            inputs = inputs.replace(
                attention_bias=bias, relative_positions=None, prepared_for=inputs.prepared_for
            )
        return super()._attend(query, key, value, inputs, **carried)

    def reference(self, query, key, value, inputs: AttentionInputs) -> AttentionOutput:
        """softmax(Q K^T / sqrt(d) + B + M) V, with the (b, h, n, n) probabilities when asked for."""
        n = query.shape[-2]
        mask = self.score_mask(query, inputs.attention_mask, inputs.attention_bias, inputs.is_causal, n)
        return self.softmax_attention(query, key, value, mask, inputs.output_attentions)

    def attend_across(self, query, key, value, inputs: AttentionInputs) -> AttentionOutput:
        """Cross-attention, softmax(Q K^T / sqrt(d) + M) V over the other sequence's m keys (M: their
        padding): BERT's eager maths with ``implementation="reference"``, else HF's function of the call
        (sdpa in place of flex_attention)."""
        mask = self.score_mask(query, inputs.attention_mask, None, False, key.shape[2])  # (b, 1, 1, m)
        if self.config.implementation == "reference":
            return self.softmax_attention(query, key, value, mask, inputs.output_attentions)
        return run_hf(self, query, key, value, mask, False, hf_function_name(self, inputs), inputs)

    def score_mask(self, query, key_mask, bias, causal: bool, total: int) -> torch.Tensor | None:
        """B + M for queries (b, h, n, d) over ``total`` keys: the padded keys of ``key_mask`` ((b, T) bool or
        None), the bias, and with ``causal`` the causal mask of the last n of T positions; additive,
        (b|1, h|1, n|1, T), or None when nothing is masked."""
        mask = additive_mask(key_mask, query.dtype)  # (b, 1, 1, T) or None
        if bias is not None:
            bias = bias.to(query.dtype)
            mask = bias if mask is None else mask + bias  # (b|1, h|1, n, n)
        return _with_causal(mask, query.shape[-2], total, query) if causal else mask

    def softmax_attention(self, query, key, value, mask, output_attentions: bool) -> AttentionOutput:
        """softmax(Q K^T / sqrt(d) + mask) V for queries (b, h, n, d) over keys (b, h, T, d): BERT's eager
        maths, op for op."""
        scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling  # (b, h, n, T)
        if mask is not None:
            scores = scores + mask
        probs = torch.softmax(scores, dim=-1)
        probs = fast_dropout(probs, self.spec.dropout, self.training)
        output = torch.matmul(probs, value)  # (b, h, n, d)
        return AttentionOutput(output, probs if output_attentions else None)

    def new_cache_layer(self) -> KeyValueCacheLayer:
        return KeyValueCacheLayer()

    def _attend_cached(self, query, key, value, inputs: AttentionInputs, layer) -> AttentionOutput:
        """The new tokens' queries against every key so far (transformers' KV cache): (b, h, n, T) scores,
        padded keys masked, the new tokens causal among themselves. Attention weights come back as
        (b, h, n, T). The prompt goes through the parallel causal form (the chosen kernel; sdpa's causal
        kernel forms no (n x n) mask, which a long prompt could not hold); later tokens go through the
        reference with ``implementation="reference"``, else through HF's function (flex_attention: sdpa,
        a few queries against a growing cache suit it)."""
        if inputs.attention_bias is not None:
            raise ValueError(
                "full: an attention_bias cannot be used with a generation cache (it is (n, n) over the new "
                "tokens only); decode without the bias, or without a cache."
            )
        keys, values, key_mask = layer.update_with_mask(key, value, inputs.attention_mask)  # (b, h, T, d)
        n, total = query.shape[2], keys.shape[2]
        if total == n:  # the prompt: the parallel causal form
            return self._attend(query, key, value, inputs)
        mask = self.score_mask(query, key_mask, None, n > 1, total)  # (b, 1, n|1, T) or None
        relative = inputs.relative_positions
        if relative is not None:  # the new tokens sit at total - n .. total - 1
            distance = offset_distances(n, total, query.device)  # (n, T)
            scores = relative.scores(query, keys, distance, self.scaling)  # (b, h, n, T)
            mask = scores if mask is None else mask + scores
        if self.config.implementation == "reference":
            return self.softmax_attention(query, keys, values, mask, inputs.output_attentions)
        return run_hf(self, query, keys, values, mask, False, hf_function_name(self, inputs), inputs)


def _with_causal(mask: torch.Tensor | None, n: int, total: int, like: torch.Tensor) -> torch.Tensor:
    """``mask`` plus the causal mask of the last n of ``total`` positions: query i (at total - n + i) sees
    keys j <= total - n + i; (b|1, 1, n, total) additive."""
    causal = torch.full((n, total), torch.finfo(like.dtype).min, dtype=like.dtype, device=like.device)
    causal = causal.triu(total - n + 1)[None, None]  # (1, 1, n, total), min above the shifted diagonal
    return causal if mask is None else mask + causal
