"""hf_efficient.compat: every private name it wraps still exists in the installed release, and each
fallback computes what the private name does."""

from __future__ import annotations

import pytest
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


# ---- torch: CPU flash attention ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward"],
)
def test_cpu_flash_attention_ops_exist(name):
    """Fails when a torch upgrade removes the private op: Longformer's native kernel would quietly fall
    back to the public sdpa with plain autograd (slower, more memory in backward)."""
    assert hasattr(torch.ops.aten, name)
    assert compat.HAS_CPU_FLASH


def _flash_inputs():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 5, 8, generator=g, dtype=torch.float64).float() for _ in range(3))
    allowed = torch.rand(3, 1, 5, 5, generator=g) < 0.6
    allowed |= torch.eye(5, dtype=torch.bool)  # every row allows a key
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    return q, k, v, mask


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "fallback"])
def test_cpu_flash_attention_equals_attention_and_its_gradients(fused, monkeypatch):
    """Forward (output and log-sum-exp) and backward of the wrappers, through torch's fused op and
    through the plain-maths fallback, equal autograd through the public scaled_dot_product_attention."""
    monkeypatch.setattr(compat, "HAS_CPU_FLASH", fused)
    q, k, v, mask = _flash_inputs()
    scale = 0.3
    out, lse = compat.cpu_flash_attention(q, k, v, mask, scale)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = torch.nn.functional.scaled_dot_product_attention(*leaves, attn_mask=mask, scale=scale)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ((q @ k.transpose(-1, -2)) * scale + mask).logsumexp(-1))
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    grads = compat.cpu_flash_attention_backward(grad_out, q, k, v, out, lse, mask, scale)
    expected_grads = torch.autograd.grad(expected, leaves, grad_out)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, atol=1e-5, rtol=1e-5)


# ---- end: torch: CPU flash attention -----------------------------------------------------------------
