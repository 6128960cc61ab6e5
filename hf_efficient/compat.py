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
