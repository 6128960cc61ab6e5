"""Nystromformer: exact limit, parity with transformers' NystromformerSelfAttention, segments and padding."""

from __future__ import annotations

import functools

import pytest
import torch
from transformers import NystromformerConfig as UpstreamConfig
from transformers.models.nystromformer.modeling_nystromformer import NystromformerSelfAttention

from hf_efficient.attention import AttentionSpec, build_attention
from hf_efficient.attention.nystromformer import iterative_pinv, segment_means

from .helpers import make_core, make_qkv, reference_attention


def double_qkv(b: int, n: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    return tuple(t.double() for t in make_qkv(b=b, n=n, seed=seed))


@pytest.mark.parametrize("n", [12, 16])
def test_one_token_per_landmark_equals_full_attention(n):
    """m = n: F = A = B = the softmax matrix P, and F pinv(P) B V = P V once the iteration converged."""
    core = make_core("nystromformer", num_landmarks=n, pinv_iterations=30, conv_kernel_size=None).double()
    q, k, v = double_qkv(b=2, n=n)
    torch.testing.assert_close(core(q, k, v).output, reference_attention(q, k, v), atol=1e-10, rtol=1e-10)
    # float32 with the same iterations agrees with exact sdpa to the float32 conditioning of P.
    core32 = make_core("nystromformer", num_landmarks=n, pinv_iterations=30, conv_kernel_size=None)
    q, k, v = make_qkv(b=2, n=n)
    full = build_attention("full", AttentionSpec(2, 8)).eval()
    torch.testing.assert_close(core32(q, k, v).output, full(q, k, v).output, atol=5e-4, rtol=1e-3)


def test_more_landmarks_than_tokens_and_padding_stay_exact():
    """Empty segments (m > real tokens) are excluded: with one real token per non-empty segment the
    result is still exact attention over the real tokens, with padding (poisoned) appended or not."""
    core = make_core("nystromformer", num_landmarks=20, pinv_iterations=30, conv_kernel_size=None).double()
    q, k, v = double_qkv(b=2, n=15)
    mask = torch.ones(2, 15, dtype=torch.bool)
    mask[0, 11:] = False  # example 0: 11 real tokens, example 1: 15
    poison = (~mask)[:, None, :, None]
    q, k, v = (t.masked_fill(poison, 1e9) for t in (q, k, v))
    out = core(q, k, v, attention_mask=mask).output
    expected = reference_attention(q, k, v, mask)
    torch.testing.assert_close(out[0, :, :11], expected[0, :, :11], atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(out[1], expected[1], atol=1e-10, rtol=1e-10)
    assert (out[0, :, 11:] == 0).all()


def _upstream(num_landmarks: int, n: int, conv: int | None) -> NystromformerSelfAttention:
    config = UpstreamConfig(
        hidden_size=16,
        num_attention_heads=2,
        num_landmarks=num_landmarks,
        segment_means_seq_len=n,
        conv_kernel_size=conv or 3,  # the upstream config does not accept None ...
        attention_probs_dropout_prob=0.0,
    )
    layer = NystromformerSelfAttention(config).eval()
    layer.conv_kernel_size = conv  # ... but the layer skips the convolution when its attribute is None
    # The paper's Z0 = A^T / ||A||_1 per (batch, head) matrix. Upstream's default ("original") divides by
    # the largest column sum over the whole batch and all heads, which couples the examples of a batch.
    layer.init_option = "exact"
    return layer


@pytest.mark.parametrize("conv", [None, 3, 5])
@pytest.mark.parametrize(("n", "num_landmarks", "iterations"), [(24, 4, 6), (32, 8, 3)])
def test_matches_transformers_nystromformer(conv, n, num_landmarks, iterations):
    torch.manual_seed(0)
    upstream = _upstream(num_landmarks, n, conv)
    core = make_core(
        "nystromformer", num_landmarks=num_landmarks, pinv_iterations=iterations, conv_kernel_size=conv
    )
    if conv is not None:
        core.conv.load_state_dict(upstream.conv.state_dict())  # same parameter name and shape
    hidden = torch.randn(3, n, 16)

    def split(x):
        return x.view(3, n, 2, 8).transpose(1, 2)  # (b, n, h*d) -> (b, h, n, d)

    with torch.no_grad():
        out = core(split(upstream.query(hidden)), split(upstream.key(hidden)), split(upstream.value(hidden)))
    merged = out.output.transpose(1, 2).reshape(3, n, 16)  # (b, h, n, d) -> (b, n, h*d)
    # Upstream's forward always uses the default n_iter=6; bind our iteration count on this instance.
    upstream.iterative_inv = functools.partial(
        NystromformerSelfAttention.iterative_inv, upstream, n_iter=iterations
    )
    with torch.no_grad():
        expected = upstream(hidden)[0]
    torch.testing.assert_close(merged, expected, atol=1e-5, rtol=1e-5)


def test_segments_follow_each_examples_real_tokens():
    """Real token r of an example with L real tokens is in segment floor(r m / L); padding is skipped."""
    x = torch.arange(12, dtype=torch.float64).reshape(1, 1, 12, 1).expand(2, 1, 12, 1)  # token index
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[0, :2] = False  # example 0 is left-padded: real tokens 2..11 (L = 10)
    (means,), nonempty = segment_means((x,), mask, 4)
    # L = 10, m = 4: segments of real ranks {0,1,2}, {3,4}, {5,6,7}, {8,9} -> tokens {2,3,4}, {5,6}, ...
    torch.testing.assert_close(means[0, 0, :, 0], torch.tensor([3.0, 5.5, 8.0, 10.5], dtype=torch.float64))
    # L = 12, m = 4: three tokens each.
    torch.testing.assert_close(means[1, 0, :, 0], torch.tensor([1.0, 4.0, 7.0, 10.0], dtype=torch.float64))
    assert nonempty is None
    (_,), nonempty = segment_means((x,), mask, 11)
    assert nonempty[0].sum() == 10 and nonempty[1].all()


def test_left_padding_equals_the_unpadded_sequence():
    core = make_core("nystromformer")
    q, k, v = make_qkv(b=1, n=21)
    alone = core(q, k, v).output
    qp, kp, vp = (torch.cat([torch.full((1, 2, 5, 8), 1e9), t], dim=2) for t in (q, k, v))
    mask = torch.arange(26)[None] >= 5
    padded = core(qp, kp, vp, attention_mask=mask).output
    torch.testing.assert_close(padded[:, :, 5:], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n", [1, 5, 7, 37, 65])
def test_awkward_lengths(n):
    core = make_core("nystromformer", num_landmarks=8).train()
    q, k, v = make_qkv(b=2, n=n, requires_grad=True)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, (n + 1) // 2 :] = False
    out = core(q, k, v, attention_mask=mask).output
    assert out.shape == (2, 2, n, 8) and torch.isfinite(out).all()
    out.square().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    assert torch.isfinite(core.conv.weight.grad).all()


def test_iterative_pinv_converges_to_the_pseudo_inverse():
    scores = torch.randn(2, 3, 10, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    kernel = torch.softmax(scores, -1)
    approx = iterative_pinv(kernel, 40)
    torch.testing.assert_close(approx, torch.linalg.pinv(kernel), atol=1e-8, rtol=1e-8)
    assert (iterative_pinv(kernel, 2) - torch.linalg.pinv(kernel)).abs().max() > 1e-3  # it does iterate


def test_config_validation_names_the_field():
    spec = AttentionSpec(2, 8)
    with pytest.raises(ValueError, match="conv_kernel_size"):
        build_attention("nystromformer", spec, {"conv_kernel_size": 4})
    with pytest.raises(ValueError, match="num_landmarks"):
        build_attention("nystromformer", spec, {"num_landmarks": 0})
    with pytest.raises(ValueError, match="pinv_iterations"):
        build_attention("nystromformer", spec, {"pinv_iterations": 0})
