"""Kernels of ``full`` (exact softmax attention): Hugging Face's attention functions and FlexAttention.

``hf``: the call's ``attn_implementation`` through transformers. ``"eager"`` is BERT's own
``eager_attention_forward``, every other name is looked up in ``ALL_ATTENTION_FUNCTIONS`` (sdpa, flash...).
Requesting attention weights runs the eager function for that call, as the others return none. A causal
call without padding or bias (and not on eager) hands causality to the function itself (sdpa's
``is_causal``: no n x n mask is formed); otherwise the causal mask joins the additive mask. For
``"flex_attention"`` transformers' own function reads the padding mask per query position and the bias of
head 0 only, so this core runs its own ``flex`` kernel instead, and sdpa where that kernel cannot serve the
call (decoding after the prompt, dropout, a CPU backward). Training on CPU with attention dropout, sdpa is
:func:`hf_efficient.attention.dropout.sdpa`: torch's math path, its dropout mask drawn fast.

``flex``: padding and causality as a FlexAttention block mask, a per-head bias as a ``score_mod``
(:mod:`.flex`). ``"auto"`` takes it for ``attn_implementation="flex_attention"`` only, on any device:
with a dense per-head bias sdpa measured no slower than FlexAttention on a GPU
(``benchmarks/results/reference/gpu``), and sdpa needs no compilation.
"""

from __future__ import annotations

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.bert.modeling_bert import eager_attention_forward

from ..base import AttentionOutput, Kernel
from ..dropout import sdpa
from .flex import BlockMask, blocks_all, flex_attend, flex_block_mask, flex_unsupported, num_blocks


def check_kernel(implementation: str) -> None:
    """Raise for an ``attn_implementation`` that is neither eager nor one of HF's attention functions."""
    if implementation != "eager" and implementation not in ALL_ATTENTION_FUNCTIONS:
        valid = ["eager", *ALL_ATTENTION_FUNCTIONS.keys()]
        raise ValueError(f"Unknown attn_implementation {implementation!r}; valid: {', '.join(valid)}.")


def hf_function_name(core, inputs) -> str:
    """The HF attention function of this call: eager when weights are wanted, sdpa in place of
    flex_attention (see the module docstring), else the call's ``attn_implementation``."""
    if inputs.output_attentions:
        return "eager"
    implementation = core.attn_implementation(inputs)
    return "sdpa" if implementation == "flex_attention" else implementation


def hf_attend(core, query, key, value, inputs) -> AttentionOutput:
    """The parallel form through HF's function: (b, h, n, d) queries, keys and values."""
    n = query.shape[-2]
    name = hf_function_name(core, inputs)
    # the function's own causal form where no mask is needed anyway (eager has none)
    masked = inputs.attention_mask is not None or inputs.attention_bias is not None or name == "eager"
    causal_in_mask = inputs.is_causal and masked
    mask = core.score_mask(query, inputs.attention_mask, inputs.attention_bias, causal_in_mask, n)
    return run_hf(core, query, key, value, mask, inputs.is_causal and not causal_in_mask, name, inputs)


def run_hf(core, query, key, value, mask, is_causal: bool, name: str, inputs) -> AttentionOutput:
    """softmax(Q K^T / sqrt(d) + mask) V through HF's function ``name``; queries (b, h, n, d) and keys
    (b, h, T, d) may differ in length (decoding)."""
    check_kernel(name)
    dropout = core.spec.dropout if core.training else 0.0
    if name == "sdpa" and dropout > 0 and not is_causal and query.device.type == "cpu":
        # sdpa's own math path with its dropout mask drawn fast (the fused CPU kernel has no dropout)
        return AttentionOutput(sdpa(query, key, value, mask, dropout, core.scaling), None)
    function = eager_attention_forward if name == "eager" else ALL_ATTENTION_FUNCTIONS[name]
    output, weights = function(
        core, query, key, value, mask, dropout=dropout, scaling=core.scaling, is_causal=is_causal
    )
    # HF functions return (b, n, h, d); the contract is (b, h, n, d).
    return AttentionOutput(output.transpose(1, 2), weights if inputs.output_attentions else None)


def flex_attend_full(core, query, key, value, inputs) -> AttentionOutput:
    """Padding and causality as a block mask, the bias (per head) as a score_mod; (b, h, n, d)."""
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
        mask = core.flex_masks.get(cache_key, lambda: flex_mask(n, real, causal, query.device))
    return AttentionOutput(flex_attend(query, key, value, mask, core.scaling, score_mod), None)


def flex_mask(n, real, causal, device) -> BlockMask:
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


def _on_flex_attention(core, query, inputs) -> bool:
    return core.attn_implementation(inputs) == "flex_attention"


FULL_KERNELS = (
    Kernel("flex", flex_attend_full, flex_unsupported, _on_flex_attention, traces=True),
    Kernel("hf", hf_attend, traces=True),
)

__all__ = ["FULL_KERNELS", "check_kernel", "flex_attend_full", "flex_mask", "hf_attend", "run_hf"]
