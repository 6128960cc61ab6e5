"""Transformer-LS against a dense float64 re-statement of its maths, its exact limit, and its edge cases."""

from __future__ import annotations

import pytest
import torch

from hf_efficient.attention import AttentionSpec, build_attention
from hf_efficient.attention.kernels import long_short as long_short_kernel

from .helpers import make_core, make_qkv, reference_attention


def randomise_parameters(core, seed=0):
    """Non-trivial W^P and LayerNorm affines (different per head) so that every parameter is exercised."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in core.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if p.dim() == 2 else 0.0))
    return core


def layer_norm(x, weight, bias, eps):
    """Plain LayerNorm over the last dim; weight/bias (h, d) broadcast over (b, h, m, d)."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight[:, None] + bias[:, None]


def dense_long_short(core, q, k, v, mask=None):
    """softmax([q LN_L(K)^T (band only) , q LN_G(P^T K)^T] / sqrt(d)) [LN_L(V) ; LN_G(P^T V)], float64."""
    cfg = core.config
    q, k, v = (t.double() for t in (q, k, v))
    b, h, n, d = q.shape
    w, e, eps = cfg.window_size, cfg.window_size // 2, cfg.layer_norm_eps
    real = torch.ones(b, n, dtype=torch.bool) if mask is None else mask
    k = k.masked_fill(~real[:, None, :, None], 0.0)
    v = v.masked_fill(~real[:, None, :, None], 0.0)
    params = {name: p.detach().double() for name, p in core.named_parameters()}

    def norm(x, which):
        if not cfg.dual_ln:
            return x
        return layer_norm(x, params[f"{which}_norm_weight"], params[f"{which}_norm_bias"], eps)

    position = torch.arange(n)
    segment_start = (position // w * w)[:, None]  # (n, 1)
    band = (position[None] >= segment_start - e) & (position[None] < segment_start + w + e)  # (n, n)
    allowed = band[None, None] & real[:, None, None, :]  # (b, 1, n, n)
    scores = q @ norm(k, "local").transpose(-1, -2) / d**0.5  # (b, h, n, n)
    scores = scores.masked_fill(~allowed, float("-inf"))
    keys_values = [norm(v, "local")]
    if cfg.num_landmarks > 0:
        logits = torch.einsum("bhnd,hdr->bhnr", k, params["dynamic_projection"])
        p = torch.softmax(logits.masked_fill(~real[:, None, :, None], float("-inf")), dim=2)  # over n
        k_bar = norm(p.transpose(-1, -2) @ k, "global")  # (b, h, r, d)
        v_bar = norm(p.transpose(-1, -2) @ v, "global")
        scores = torch.cat([scores, q @ k_bar.transpose(-1, -2) / d**0.5], dim=-1)  # (b, h, n, n + r)
        keys_values.append(v_bar)
    probs = torch.softmax(scores, dim=-1)
    out = probs @ torch.cat(keys_values, dim=2)
    return out.masked_fill(~real[:, None, :, None], 0.0)


@pytest.mark.parametrize(
    "config",
    [
        {"window_size": 6, "num_landmarks": 4},
        {"window_size": 5, "num_landmarks": 3},  # odd window: floor(5 / 2) = 2 keys on each side
        {"window_size": 8, "num_landmarks": 4, "dual_ln": False},
        {"window_size": 4, "num_landmarks": 0},
        {"window_size": 64, "num_landmarks": 2},  # one segment, longer than the sequence
    ],
)
@pytest.mark.parametrize("padded", [False, True])
def test_matches_dense_float64_reference(config, padded):
    core = randomise_parameters(make_core("long_short", **config))
    q, k, v = make_qkv(b=2, n=37)
    mask = None
    if padded:
        mask = torch.ones(2, 37, dtype=torch.bool)
        mask[1, 26:] = False
        k[1, :, 26:], v[1, :, 26:] = 1e9, -1e9  # poisoned padding must not matter
    out = core(q, k, v, attention_mask=mask).output
    torch.testing.assert_close(out.double(), dense_long_short(core, q, k, v, mask), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n", [30, 37])
def test_window_covering_sequence_without_landmarks_is_full_attention(n):
    """No long branch, no DualLN, one segment holding every key: exactly softmax attention."""
    core = make_core("long_short", window_size=40, num_landmarks=0, dual_ln=False)
    full = build_attention("full", AttentionSpec(2, 8)).eval()
    q, k, v = make_qkv(b=2, n=n)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[0, n - 7 :] = False
    torch.testing.assert_close(
        core(q, k, v, attention_mask=mask).output,
        full(q, k, v, attention_mask=mask).output,
        atol=1e-5,
        rtol=1e-5,
    )
    # and with a short window it is banded attention, not full
    short = make_core("long_short", window_size=4, num_landmarks=0, dual_ln=False)
    assert (short(q, k, v).output - full(q, k, v).output).abs().max() > 1e-2


def test_window_covering_sequence_with_landmarks_is_full_attention_over_extra_keys():
    """With one segment and no DualLN, the r landmarks are r extra keys appended to exact attention."""
    core = randomise_parameters(make_core("long_short", window_size=32, num_landmarks=3, dual_ln=False))
    q, k, v = make_qkv(b=1, n=20)
    p = torch.softmax(torch.einsum("bhnd,hdr->bhnr", k, core.dynamic_projection.detach()), dim=2)
    k_all = torch.cat([k, p.transpose(-1, -2) @ k], dim=2)  # (b, h, n + r, d)
    v_all = torch.cat([v, p.transpose(-1, -2) @ v], dim=2)
    expected = reference_attention(q, k_all, v_all, allowed=torch.ones(20, 23, dtype=torch.bool))
    torch.testing.assert_close(core(q, k, v).output.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("budget", [1, 3000, 20000])
def test_chunked_kernel_equals_reference_over_several_chunks(monkeypatch, budget):
    """The kernel cuts rows and segments into chunks only past sizes the contract tests reach; small budgets
    (1 byte: one (row, segment) per chunk) make several, and outputs and gradients stay the reference's."""
    monkeypatch.setattr(long_short_kernel, "CHUNK_BYTES", budget)
    q, k, v = make_qkv(b=3, h=4, n=29)
    mask = torch.arange(29)[None] < torch.tensor([[29], [20], [25]])
    grad = torch.randn(3, 4, 29, 8)
    results = []
    for implementation in ("reference", "chunked"):
        config = {"window_size": 4, "num_landmarks": 3, "implementation": implementation}
        core = randomise_parameters(make_core("long_short", heads=4, **config))
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = core(*leaves, attention_mask=mask).output
        results.append([out, *torch.autograd.grad(out, (*leaves, *core.parameters()), grad)])
    for got, want in zip(*results[::-1], strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_auto_runs_the_chunked_kernel_outside_tracing():
    core = make_core("long_short")
    assert core.kernel_for(make_qkv()[0], None) is long_short_kernel.CHUNKED


@pytest.mark.parametrize("implementation", ["reference", "chunked"])
def test_gradcheck_float64(implementation):
    config = {"window_size": 4, "num_landmarks": 2, "implementation": implementation}
    core = randomise_parameters(make_core("long_short", **config)).double()
    q, k, v = (t.double().requires_grad_() for t in make_qkv(b=1, n=11))
    mask = torch.arange(11)[None] < 9
    assert torch.autograd.gradcheck(
        lambda *t: core(*t, attention_mask=mask).output, (q, k, v), fast_mode=True
    )


def test_long_range_branch_reaches_beyond_the_window():
    """Token 0 can reach token 39 (window 6) only through the landmarks."""
    q, k, v = make_qkv(b=1, n=40)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 0] += 1.0
    v2[:, :, 0] += 1.0
    with_landmarks = make_core("long_short", window_size=6, num_landmarks=4)
    moved = with_landmarks(q, k2, v2).output[:, :, 39] - with_landmarks(q, k, v).output[:, :, 39]
    assert moved.abs().max() > 1e-4
    local_only = make_core("long_short", window_size=6, num_landmarks=0)
    assert torch.equal(local_only(q, k2, v2).output[:, :, 39], local_only(q, k, v).output[:, :, 39])


def test_padded_keys_do_not_influence_the_landmarks():
    """Queries far from the padding see it only through the landmarks: their outputs must not move."""
    core = randomise_parameters(make_core("long_short", window_size=6, num_landmarks=4))
    q, k, v = make_qkv(b=1, n=40)
    mask = torch.arange(40)[None] < 30
    base = core(q, k, v, attention_mask=mask).output[:, :, :20]
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 30:] = torch.randn(1, 2, 10, 8) * 5
    v2[:, :, 30:] = torch.randn(1, 2, 10, 8) * 5
    assert torch.equal(core(q, k2, v2, attention_mask=mask).output[:, :, :20], base)
    # control: the same change to real tokens does move those far outputs
    assert (core(q, k2, v2).output[:, :, :20] - core(q, k, v).output[:, :, :20]).abs().max() > 1e-4


def test_parameters_follow_the_config_and_receive_gradients():
    core = make_core("long_short", window_size=6, num_landmarks=4).train()
    shapes = {name: tuple(p.shape) for name, p in core.named_parameters()}
    assert shapes == {
        "dynamic_projection": (2, 8, 4),
        "local_norm_weight": (2, 8),
        "local_norm_bias": (2, 8),
        "global_norm_weight": (2, 8),
        "global_norm_bias": (2, 8),
    }
    q, k, v = make_qkv(n=23)
    core(q, k, v).output.square().sum().backward()
    for name, p in core.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert list(make_core("long_short", num_landmarks=0, dual_ln=False).parameters()) == []


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"window_size": 0}, "window_size"),
        ({"num_landmarks": -1}, "num_landmarks"),
        ({"layer_norm_eps": 0.0}, "layer_norm_eps"),
        ({"window_size": 8.5}, "window_size"),
        ({"dual_ln": 1}, "dual_ln"),
    ],
)
def test_bad_config_raises(config, field):
    with pytest.raises(ValueError, match=field):
        build_attention("long_short", AttentionSpec(2, 8), config)


@pytest.mark.parametrize("implementation", ["reference", "chunked"])
def test_dropout_gradients_and_eval_determinism(implementation):
    """Training dropout drops probabilities; with the RNG pinned its backward matches finite differences."""
    spec = AttentionSpec(2, 8, dropout=0.3)
    config = {"window_size": 4, "num_landmarks": 2, "implementation": implementation}
    core = build_attention("long_short", spec, config).double().train()
    q, k, v = (t.double().requires_grad_() for t in make_qkv(b=1, n=10))

    def pinned(*qkv):
        torch.manual_seed(7)  # the same dropout mask on every call
        return core(*qkv).output

    assert torch.autograd.gradcheck(pinned, (q, k, v), fast_mode=True)
    assert not torch.allclose(core(q, k, v).output, core(q, k, v).output)
    core.eval()
    assert torch.equal(core(q, k, v).output, core(q, k, v).output)
