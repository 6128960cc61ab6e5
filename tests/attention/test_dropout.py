"""The CPU dropout of the attention probabilities and hidden states (hf_efficient.attention.dropout): each
element kept with probability 1 - p (p rounded to a multiple of 1/65536), kept values scaled to keep the
expectation, a 1-byte mask for backward, and sdpa's math path around it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hf_efficient.attention import dropout as module
from hf_efficient.attention.dropout import fast_dropout, keep_mask, sdpa


def test_keep_mask_fills_every_element_across_chunks(monkeypatch):
    """The mask is drawn a chunk at a time into an uninitialised tensor, four 16-bit lanes per 64-bit draw:
    every element, the last partial chunk's and its lanes included, is written, and each chunk keeps 1 - p
    of its elements."""
    monkeypatch.setattr(module, "MASK_CHUNK", 1000)
    shape = (300, 70)  # 21 chunks of 1,000, the last one 1,000 short
    assert keep_mask(shape, 0.0).all() and not keep_mask(shape, 1.0).any()
    keep = keep_mask(shape, 0.25)
    assert keep.shape == shape and keep.dtype == torch.bool
    rates = keep.view(-1)[:20_000].float().view(20, 1000).mean(1)
    assert (rates > 0.68).all() and (rates < 0.82).all()  # 1,000 draws each of Bernoulli(0.75): sd 0.014
    odd = keep_mask((7, 3), 0.5)  # 21 elements: the last draw's lanes partly unused
    assert odd.shape == (7, 3)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_each_lane_keeps_one_minus_p(p):
    """All four lanes of a draw (the sign lane too) keep 1 - p: 400,000 draws per lane position."""
    keep = keep_mask((400_000, 4), p).float()  # column j: lane j of each 64-bit draw
    rates = keep.mean(0)
    assert ((rates - (1 - p)).abs() < 0.004).all(), rates  # sd <= 0.0008


def test_fast_dropout_scales_what_it_keeps_and_keeps_a_bool_mask():
    x = torch.randn(300, 400, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = fast_dropout(x, 0.1)
    assert [t.dtype for t in saved] == [torch.bool]  # F.dropout keeps a float32 noise tensor on CPU
    kept = y != 0
    scale = 65536 / (65536 - round(0.1 * 65536))  # 1 / (1 - p'), p' = 6554 / 65536
    assert 0.095 < 1 - kept.float().mean().item() < 0.105  # 120,000 draws of Bernoulli(0.1)
    torch.testing.assert_close(y[kept], x[kept] * scale, rtol=0, atol=0)
    y.sum().backward()
    torch.testing.assert_close(x.grad, kept.float() * scale)


def test_fast_dropout_repeats_under_a_seed_and_passes_through_outside_training():
    x = torch.randn(64, 64)
    torch.manual_seed(3)
    first = fast_dropout(x, 0.3)
    torch.manual_seed(3)
    assert torch.equal(fast_dropout(x, 0.3), first)
    assert fast_dropout(x, 0.3, training=False) is x and fast_dropout(x, 0.0) is x
    assert torch.equal(fast_dropout(x, 1.0), torch.zeros_like(x))  # p = 1: F.dropout's zeros
    torch.manual_seed(3)  # p rounds to 0 lanes: F.dropout's, which drops none of these 4,096 under this seed
    torch.testing.assert_close(fast_dropout(x, 1e-6), x / (1 - 1e-6))


def _mask(kind: str, shape, empty_row: bool) -> torch.Tensor:
    allowed = (torch.rand(shape) > 0.3) | torch.eye(shape[-1], dtype=torch.bool)  # every row some key
    if empty_row:
        allowed[0, 0, 2] = False
    return allowed if kind == "bool" else torch.zeros(shape).masked_fill(~allowed, float("-inf"))


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_sdpa_is_the_math_path_with_the_fast_mask(kind):
    """With dropout on CPU: softmax(q k^T / sqrt(d) + mask), the mask of keep_mask drawn from the same seed,
    then the values; outputs and gradients."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, requires_grad=True) for _ in range(3))
    mask = _mask(kind, (2, 1, 5, 5), empty_row=False)
    torch.manual_seed(1)
    out = sdpa(q, k, v, mask, dropout_p=0.25)
    torch.manual_seed(1)
    keep = keep_mask((2, 3, 5, 5), 0.25)
    scores = q @ k.transpose(-1, -2) / 8**0.5
    scores = scores.masked_fill(~mask, float("-inf")) if kind == "bool" else scores + mask
    expected = (torch.softmax(scores, -1) * keep / 0.75) @ v
    torch.testing.assert_close(out, expected)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    expected_grads = torch.autograd.grad(expected.sum(), (q, k, v))
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad)


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_sdpa_gives_a_row_without_keys_zeros_and_finite_gradients(kind):
    """As torch's sdpa: a query row with no allowed key attends to nothing (zeros, not NaN), and backward
    through it stays finite."""
    q, k, v = (torch.randn(2, 3, 5, 8, requires_grad=True) for _ in range(3))
    mask = _mask(kind, (2, 1, 5, 5), empty_row=True)
    out = sdpa(q, k, v, mask, dropout_p=0.25)
    assert out[0, :, 2].abs().max() == 0 and not out.isnan().any()
    torch.testing.assert_close(out[0, :, 2], F.scaled_dot_product_attention(q, k, v, attn_mask=mask)[0, :, 2])
    assert all(grad.isfinite().all() for grad in torch.autograd.grad(out.sum(), (q, k, v)))


def test_sdpa_without_dropout_is_torchs():
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    torch.testing.assert_close(sdpa(q, k, v, scale=0.3), F.scaled_dot_product_attention(q, k, v, scale=0.3))
    half = sdpa(q.bfloat16(), k.bfloat16(), v.bfloat16(), dropout_p=0.1)
    assert half.dtype == torch.bfloat16 and half.shape == (1, 2, 4, 8)


@pytest.mark.parametrize("rows", [2, 5])  # two rows of one head a block; whole heads (every row, 5)
def test_sdpa_over_many_keys_recomputes_its_dropout_in_backward(monkeypatch, rows):
    """From RECOMPUTE_MIN_KEYS keys on (4 here), the queries in blocks of (sequences, heads, rows) (a block's
    budget: 2 rows, or 2 heads when every row fits), each block's probabilities and dropout mask drawn again
    in backward from the generator state of the forward: the outputs and gradients (queries, keys, values and
    an additive bias) are the block-wise maths with the blocks' masks drawn in order, and autograd keeps no
    (B, h, rows, S) tensor for backward (only the inputs)."""
    monkeypatch.setattr(module, "RECOMPUTE_MIN_KEYS", 4)
    monkeypatch.setattr(module, "rows_per_chunk", lambda _, total: min(total, rows if total == 5 else 2))
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, requires_grad=True) for _ in range(3))
    bias = torch.randn(1, 3, 5, 5, requires_grad=True)  # per query row: cut with the blocks
    saved = []
    torch.manual_seed(1)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        out = sdpa(q, k, v, bias, dropout_p=0.25)
    assert not [shape for shape in saved if shape[:2] == (2, 3) and shape[-1] == 5]  # no scores' shape
    blocks = module._blocks(q.shape, 5)
    assert len(blocks) == (2 * 3 * 3 if rows == 2 else 2 * 2)  # rows 2 + 2 + 1; heads 2 + 1
    torch.manual_seed(1)
    keep = torch.empty(2, 3, 5, 5, dtype=torch.bool)
    for items, heads, rows_ in blocks:
        keep[items, heads, rows_] = keep_mask(keep[items, heads, rows_].shape, 0.25)
    probs = torch.softmax(q @ k.transpose(-1, -2) / 8**0.5 + bias, -1)
    expected = (probs * keep / 0.75) @ v
    torch.testing.assert_close(out, expected)
    torch.manual_seed(5)  # backward redraws the forward's masks whatever the generator holds now
    grads = torch.autograd.grad(out.sum(), (q, k, v, bias))
    expected_grads = torch.autograd.grad(expected.sum(), (q, k, v, bias))
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad)


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_sdpa_recomputed_keeps_torchs_math_over_many_keys(kind):
    """At the real threshold (1,024 keys) with a per-query mask, a row without keys and bfloat16 inputs: the
    recomputed path's outputs and gradients are the math path's with the same masks (computed in float32)."""
    torch.manual_seed(0)
    q = torch.randn(2, 3, 6, 4, requires_grad=True)
    k, v = (torch.randn(2, 3, 1024, 4, requires_grad=True) for _ in range(2))
    mask = torch.rand(2, 1, 6, 1024) > 0.3
    mask[1, 0, 4] = False
    mask = mask if kind == "bool" else torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    torch.manual_seed(2)
    out = sdpa(q, k, v, mask, dropout_p=0.1)
    torch.manual_seed(2)
    expected = module._math_with_dropout(q, k, v, mask, 0.1, None)
    torch.testing.assert_close(out, expected)
    assert out[1, :, 4].abs().max() == 0
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    expected_grads = torch.autograd.grad(expected.sum(), (q, k, v))
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad)
    half = sdpa(*(t.detach().bfloat16().requires_grad_() for t in (q, k, v)), mask, dropout_p=0.1)
    assert half.dtype == torch.bfloat16 and half.isfinite().all()


def test_sdpa_recomputed_keeps_float64_inputs_in_float64():
    """Over 1,024 keys with gradients the recomputed blocks compute in the inputs' own float64 (only half
    types go up to float32): outputs and gradients of queries, keys, values and an additive mask equal the
    float64 math path to 1e-12 (float32 arithmetic misses it by about 1e-7)."""
    torch.manual_seed(0)
    q = torch.randn(1, 2, 3, 8, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 2, 1024, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    bias = torch.randn(1, 1, 3, 1024, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(2)
    out = sdpa(q, k, v, bias, dropout_p=0.1)
    torch.manual_seed(2)
    expected = module._math_with_dropout(q, k, v, bias, 0.1, None)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-12)
    grads = torch.autograd.grad(out.sum(), (q, k, v, bias))
    expected_grads = torch.autograd.grad(expected.sum(), (q, k, v, bias))
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, atol=1e-12, rtol=1e-12)
