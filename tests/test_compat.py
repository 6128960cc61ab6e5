"""hf_efficient.compat: every private name it wraps still exists in the installed release, and each
fallback computes what the private name does."""

from __future__ import annotations

import torch

from hf_efficient import compat

# ---- torch: softmax backward (BigBird's native kernels) ----


def test_softmax_backward_is_torchs_fused_op_and_its_fallback_agrees(monkeypatch):
    assert compat._SOFTMAX_BACKWARD is torch._softmax_backward_data, "torch._softmax_backward_data is gone"
    scores = torch.randn(3, 5, 7, dtype=torch.float64, requires_grad=True)
    probs = torch.softmax(scores, -1)
    grad = torch.randn_like(probs)
    (expected,) = torch.autograd.grad(probs, scores, grad)
    probs = probs.detach()
    out = torch.empty_like(probs)
    for got in (
        compat.softmax_backward(grad, probs, -1),
        compat.softmax_backward(grad, probs, -1, out=out),
        compat._softmax_backward_public(grad, probs, -1),
        compat._softmax_backward_public(grad, probs, -1, torch.empty_like(probs)),
    ):
        torch.testing.assert_close(got, expected)
    assert compat.softmax_backward(grad, probs, -1, out=out).data_ptr() == out.data_ptr()
    monkeypatch.setattr(compat, "_SOFTMAX_BACKWARD", None)  # a release without it
    torch.testing.assert_close(compat.softmax_backward(grad, probs, -1, out=out), expected)
