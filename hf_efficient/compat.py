"""The one place that touches private torch / transformers APIs, each behind a fallback.

Mechanism and model code import what they need from here, never a private name directly
(tests/test_compat.py fails if one of the names below disappears from the installed release, so an
upgrade that removes one is noticed before users meet the fallback).
"""

from __future__ import annotations

import torch

# ---- torch: softmax backward ----

_SOFTMAX_BACKWARD = getattr(torch, "_softmax_backward_data", None)


def softmax_backward(
    grad: torch.Tensor, probs: torch.Tensor, dim: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The gradient of softmax's input from its output ``probs`` and that output's gradient ``grad``:
    probs * (grad - sum(grad * probs, dim)), written into ``out`` when given.

    torch's fused kernel (``torch._softmax_backward_data``, one pass over each row) where the installed
    release has it; the same maths in public ops otherwise (several passes over the tensor, slower)."""
    if _SOFTMAX_BACKWARD is not None:
        if out is None:
            return _SOFTMAX_BACKWARD(grad, probs, dim, probs.dtype)
        return _SOFTMAX_BACKWARD(grad, probs, dim, probs.dtype, grad_input=out)
    return _softmax_backward_public(grad, probs, dim, out)


def _softmax_backward_public(grad, probs, dim, out=None):
    product = torch.mul(grad, probs, out=out)  # (g * p)
    return product.addcmul_(probs, product.sum(dim, keepdim=True), value=-1.0)  # g p - p sum(g p)


# ---- torch: CPU flash attention ----
# torch's fused CPU kernel of scaled_dot_product_attention, called directly for what the public function
# does not give: the log-sum-exp of each query row (saved for a backward that recomputes the scores) and
# the backward itself. Private aten ops: they may change or vanish in any torch release.

HAS_CPU_FLASH = hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu") and hasattr(
    torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward"
)


def cpu_flash_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T scale + attn_mask) v and its log-sum-exp, without dropout or a causal mask.

    Args:
        query: (B, h, L, d); key, value: (B, h, S, d).
        attn_mask: additive (B | 1, 1 | h, L, S) (0 or -inf); every row must allow some key.

    Returns:
        out (B, h, L, d) in the query's dtype and logsumexp (B, h, L) of the scaled, masked scores (float32
        for float32 inputs). Without torch's fused CPU kernel the same by plain tensor maths.
    """
    if HAS_CPU_FLASH:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, 0.0, False, attn_mask=attn_mask, scale=scale
        )
    scores = (query.float() @ key.float().transpose(-1, -2)) * scale + attn_mask  # (B, h, L, S)
    lse = scores.logsumexp(-1)  # (B, h, L)
    out = (scores - lse[..., None]).exp() @ value.float()
    return out.to(query.dtype), lse


def cpu_flash_attention_backward(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    attn_mask: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (query, key, value) of :func:`cpu_flash_attention` from its output and log-sum-exp.

    With P = exp(q k^T scale + mask - lse): dV = P^T dO, dS = P (dO V^T - rowsum(dO O)), dQ = dS K scale,
    dK = dS^T Q scale (the same by plain tensor maths without torch's fused CPU kernel)."""
    if HAS_CPU_FLASH:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, query, key, value, out, logsumexp, 0.0, False, attn_mask=attn_mask, scale=scale
        )
    q, k, v, g = (t.float() for t in (query, key, value, grad_out))
    probs = ((q @ k.transpose(-1, -2)) * scale + attn_mask - logsumexp[..., None]).exp()  # (B, h, L, S)
    scores_grad = probs * (g @ v.transpose(-1, -2) - (g * out.float()).sum(-1, keepdim=True))
    grads = (scores_grad @ k * scale, scores_grad.transpose(-1, -2) @ q * scale, probs.transpose(-1, -2) @ g)
    return tuple(grad.to(query.dtype) for grad in grads)
