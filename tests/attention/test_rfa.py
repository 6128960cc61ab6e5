"""Random Feature Attention against float64 oracles written out by hand (same random features)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hf_efficient.attention.kernels import rfa as rfa_kernel
from hf_efficient.attention.kernels.rfa import _NonCausalRFA
from hf_efficient.attention.rfa import RandomFeatureAttention

from .helpers import assert_close_with_gradients, make_core, make_qkv, padding_mask, reference_attention


def explicit_features(core: RandomFeatureAttention, x: torch.Tensor) -> torch.Tensor:
    """phi(x^) = sqrt(1/m) [sin(W x^), cos(W x^)] in float64, W = sigma * W~ read off the core."""
    sigma = core.sigma if core.sigma is not None else core.config.sigma
    weight = (sigma * core.random_weights).double().detach()  # (h, m, d)
    u = F.normalize(x.double(), dim=-1) @ weight.transpose(1, 2)  # (b, h, n, m)
    return torch.cat([u.sin(), u.cos()], -1) / weight.shape[1] ** 0.5


def gate_weights(core: RandomFeatureAttention, key: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """(b, h, n, n) weight of key j at query t: (1 - g_j) prod_{j < l <= t} g_l for j <= t, else 0."""
    b, h, n, _ = key.shape
    if core.uses_gate:
        w, bias = core.gate_weight.double().detach(), core.gate_bias.double().detach()
        g = torch.sigmoid((key.double() * w[:, None]).sum(-1) + bias[:, None])  # (b, h, n)
    else:
        g = torch.ones(b, h, n, dtype=torch.float64)
    if mask is not None:
        g = g.masked_fill(~mask[:, None], 1.0)
    t, j, step = (
        torch.arange(n)[:, None, None],
        torch.arange(n)[None, :, None],
        torch.arange(n)[None, None, :],
    )
    between = (step > j) & (step <= t)  # (n, n, n): steps whose gate decays key j by query t
    decay = torch.where(between, g[:, :, None, None, :], torch.ones(())).prod(-1)  # (b, h, n, n)
    keep = (1 - g)[:, :, None, :] if core.uses_gate else torch.ones(())
    return (decay * keep).tril()


def quadratic_rfa(core, q, k, v, mask=None, causal=False) -> torch.Tensor:
    """The explicit O(n^2) form: A = phi(Q) phi(K)^T (gated and lower-triangular if causal), A V / A 1."""
    scores = explicit_features(core, q) @ explicit_features(core, k).transpose(-1, -2)  # (b, h, n, n)
    if causal:
        scores = scores * gate_weights(core, k, mask)
    v = v.double()
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, None, :], 0.0)
        v = v.masked_fill(~mask[:, None, :, None], 0.0)
    return scores @ v / scores.sum(-1, keepdim=True).abs().clamp_min(core.config.eps)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 4 rows (non-causal) / groups of one block (causal), so tiny inputs cross boundaries."""
    monkeypatch.setattr(rfa_kernel, "rows_per_chunk", lambda bytes_per_row, rows, budget=None: min(4, rows))


@pytest.mark.parametrize("with_mask", [False, True])
def test_non_causal_equals_explicit_quadratic_form(with_mask, small_chunks):
    core = make_core("rfa", num_features=16).double()
    q, k, v = (t.double() for t in make_qkv(b=2, n=23))
    mask = padding_mask([23, 17], 23) if with_mask else None
    out = core(q, k, v, attention_mask=mask).output
    ref = quadratic_rfa(core, q, k, v, mask)
    torch.testing.assert_close(out[0], ref[0], atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(out[1, :, :17], ref[1, :, :17], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("with_mask", [False, True])
def test_non_causal_backward_matches_finite_differences(with_mask, small_chunks):
    """The hand-written backward (features recomputed chunk by chunk) against torch.autograd.gradcheck."""
    q, k, v = (t.double().requires_grad_() for t in make_qkv(b=2, n=10))
    base = torch.randn(2, 6, 8, dtype=torch.float64)  # W~
    sigma = (torch.rand(2, 1, 8, dtype=torch.float64) + 0.5).requires_grad_()
    mask = padding_mask([10, 7], 10) if with_mask else None
    function = lambda q, k, v, sigma: _NonCausalRFA.apply(q, k, v, base, sigma, mask, 1e-3)  # noqa: E731
    assert torch.autograd.gradcheck(function, (q, k, v, sigma), fast_mode=True)


def test_sigma_is_learned_and_receives_gradients():
    core = make_core("rfa").train()
    q, k, v = make_qkv(n=19)
    core(q, k, v).output.square().sum().backward()
    assert core.sigma.grad is not None and core.sigma.grad.abs().sum() > 0
    frozen = make_core("rfa", learn_sigma=False, sigma=0.7)
    assert frozen.sigma is None and "sigma" not in dict(frozen.named_parameters())
    torch.testing.assert_close(frozen.projection(), 0.7 * frozen.random_weights)


@pytest.mark.parametrize("gate", [False, True])
def test_causal_equals_explicit_quadratic_form(gate, small_chunks):
    """gate=False: plain causal RFA; gate=True: weights (1 - g_j) prod g_l; several blocks and groups."""
    core = make_core("rfa", causal=True, gate=gate, causal_chunk=5).double()
    q, k, v = (t.double() for t in make_qkv(b=2, n=23))
    mask = padding_mask([23, 18], 23)
    out = core(q, k, v, attention_mask=mask, is_causal=True).output
    ref = quadratic_rfa(core, q, k, v, mask, causal=True)
    torch.testing.assert_close(out[0], ref[0], atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(out[1, :, :18], ref[1, :, :18], atol=1e-10, rtol=1e-10)


def test_causal_groups_of_several_blocks_equal_the_quadratic_form(monkeypatch):
    """Groups of 3 blocks of 5 tokens, 47 tokens (4 groups, the last short): the states at the blocks'
    starts come from one weighted product per group (not a scan); outputs and gradients equal the explicit
    gated form, with gates far from 1 (decays across blocks matter) and padding."""
    monkeypatch.setattr(rfa_kernel, "rows_per_chunk", lambda bytes_per_row, rows, budget=None: min(15, rows))
    core = make_core("rfa", causal=True, causal_chunk=5, gate_bias_init=-1.0).double()
    q, k, v = (t.double().requires_grad_() for t in make_qkv(b=2, n=47))
    mask = padding_mask([47, 40], 47)
    out = core(q, k, v, attention_mask=mask, is_causal=True).output.masked_fill(~mask[:, None, :, None], 0)
    ref = quadratic_rfa(core, q, k, v, mask, causal=True).masked_fill(~mask[:, None, :, None], 0)
    assert_close_with_gradients(out, ref, (q, k, v), atol=1e-9, rtol=1e-8)


@pytest.mark.parametrize("gate", [False, True])
def test_causal_parallel_equals_recurrent_step(gate):
    core = make_core("rfa", causal=True, gate=gate)
    q, k, v = make_qkv(b=2, n=29)
    mask = torch.ones(2, 29, dtype=torch.bool)
    mask[0, 3:6] = False  # padding in the middle: those steps must pass the state on unchanged
    mask[1, 25:] = False
    parallel = core(q, k, v, attention_mask=mask, is_causal=True).output
    state = None
    for t in range(29):
        out, new_state = core.step(q[:, :, t], k[:, :, t], v[:, :, t], state, real=mask[:, t])
        if state is not None and not mask[0, t]:
            assert torch.equal(new_state[0][0], state[0][0]) and torch.equal(new_state[1][0], state[1][0])
        state = new_state
        real = mask[:, t]
        torch.testing.assert_close(out[real], parallel[:, :, t][real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("side", ["right", "left"])
def test_causal_padding_with_poisoned_pads_leaves_real_outputs(side):
    """Padded steps keep the gated state as it is, so real outputs do not move, even for left padding."""
    core = make_core("rfa", causal=True)
    q, k, v = make_qkv(b=1, n=21)
    alone = core(q, k, v, is_causal=True).output
    pad = torch.full((1, 2, 9, 8), 1e9)
    join = (lambda t: torch.cat([t, pad], 2)) if side == "right" else (lambda t: torch.cat([pad, t], 2))
    mask = join(torch.ones(1, 2, 21, 8))[:, 0, :, 0] < 1e9  # (1, 30)
    padded = core(join(q), join(k), join(v), attention_mask=mask, is_causal=True).output
    torch.testing.assert_close(padded[:, :, mask[0]], alone, atol=1e-5, rtol=1e-5)
    assert (padded[:, :, ~mask[0]] == 0).all()


def test_causal_gradients_and_strong_forgetting_stay_finite():
    """Gates near 0 over many steps (log-space decays) and the gate parameters' gradients."""
    core = make_core("rfa", causal=True, gate_bias_init=-30.0).double().train()
    q, k, v = (t.double().requires_grad_() for t in make_qkv(b=1, n=40))
    out = core(q, k, v, is_causal=True).output
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, quadratic_rfa(core, q, k, v, causal=True), atol=1e-9, rtol=1e-9)
    out.square().sum().backward()
    assert core.gate_weight.grad.abs().sum() > 0 and core.gate_bias.grad.abs().sum() > 0
    gated = make_core("rfa", causal=True, causal_chunk=4).double()
    inputs = tuple(t[:, :, :10].detach().requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(lambda *x: gated(*x, is_causal=True).output, inputs, fast_mode=True)


def mean_error_against_softmax(num_seeds, **config):
    """Mean |RFA - softmax| over seeds 0..num_seeds-1 (inputs and features both drawn from the seed), on
    unit-norm-friendly inputs: |q| = |k| = d^(1/4), so q.k / sqrt(d) = q^.k^ = what sigma = 1 gives."""
    total = 0.0
    for seed in range(num_seeds):
        q, k, v = make_qkv(b=1, n=40, seed=seed)
        q, k = (F.normalize(t, dim=-1) * 8**0.25 for t in (q, k))
        core = make_core("rfa", seed=seed, **config)
        total += (core(q, k, v).output.double() - reference_attention(q, k, v)).abs().mean().item()
    return total / num_seeds


def test_approaches_full_attention_as_num_features_grows():
    """Mean absolute error against exact softmax (unit-norm-friendly inputs, sigma = 1), averaged over 4
    seeds, must fall at every step of m and end below 0.006 (about 1/7 of the error of plain averaging);
    Monte Carlo error goes as 1/sqrt(m)."""
    errors = [mean_error_against_softmax(num_seeds=4, num_features=m) for m in (16, 64, 256, 1024, 4096)]
    assert all(a > b for a, b in zip(errors, errors[1:], strict=False)), errors
    assert errors[-1] < 0.006, errors
    assert errors[0] > 4 * errors[-1], errors


def test_orthogonal_features_are_orthogonal_and_estimate_softmax_closer():
    """Each head's rows come in orthogonal blocks of d, and over 16 draws the error against exact softmax
    (sigma = 1, unit-norm-friendly inputs as above) is clearly below that of iid rows at the same m."""
    core = make_core("rfa", num_features=16, orthogonal_features=True, layer_idx=2)
    for head in core.random_weights:  # (m, d) with m = 2 d: two blocks
        for block in head.split(8):
            gram = block @ block.T  # (8, 8): zero off the diagonal
            off_diagonal = gram - torch.diag(gram.diagonal())
            torch.testing.assert_close(off_diagonal, torch.zeros(8, 8), atol=1e-5, rtol=0)
    errors = {
        orthogonal: mean_error_against_softmax(num_seeds=16, num_features=16, orthogonal_features=orthogonal)
        for orthogonal in (False, True)
    }
    assert errors[True] < 0.75 * errors[False], errors


def test_redraw_changes_outputs_and_init_restores_the_seeded_draw():
    core = make_core("rfa", layer_idx=3)
    q, k, v = make_qkv(n=17)
    before = core(q, k, v).output
    drawn = core.random_weights.clone()
    core.resample_random_state(7)
    assert not torch.allclose(core(q, k, v).output, before)
    redrawn = core.random_weights.clone()
    core.resample_random_state(7)
    assert torch.equal(core.random_weights, redrawn)
    core.init_weights()
    assert torch.equal(core.random_weights, drawn)
    assert not torch.equal(make_core("rfa", layer_idx=4).random_weights, drawn)  # layers differ


def test_non_causal_is_permutation_equivariant_causal_is_not():
    core = make_core("rfa", causal=True)
    assert core.capabilities.permutation_equivariant
    q, k, v = make_qkv(b=1, n=13)
    perm = torch.randperm(13)
    permuted = core(q[:, :, perm], k[:, :, perm], v[:, :, perm], is_causal=True).output
    assert not torch.allclose(permuted, core(q, k, v, is_causal=True).output[:, :, perm])


@pytest.mark.parametrize(
    "field, value", [("num_features", 0), ("sigma", 0.0), ("eps", -1.0), ("causal_chunk", 0)]
)
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        make_core("rfa", **{field: value})


def test_head_split_layout_gives_the_same_outputs_and_gradients():
    """Heads split from (b, n, h, d) projections arrive as strided views; results must not depend on it."""
    core = make_core("rfa").train()
    base = [torch.randn(2, 21, 2, 8, requires_grad=True) for _ in range(3)]  # (b, n, h, d)
    out = core(*(t.transpose(1, 2) for t in base)).output
    out.square().sum().backward()
    copies = [t.detach().transpose(1, 2).contiguous().requires_grad_() for t in base]  # (b, h, n, d)
    expected = core(*copies).output
    expected.square().sum().backward()
    torch.testing.assert_close(out, expected)
    for strided, contiguous in zip(base, copies, strict=True):
        torch.testing.assert_close(strided.grad, contiguous.grad.transpose(1, 2))


def test_gate_exists_only_in_causal_models():
    """The recency gate is used by the causal form only: an encoder's core has no gate parameters (they would
    never get a gradient), a decoder's has them; a causal call on an encoder's core with gate=True raises."""
    encoder, decoder = make_core("rfa"), make_core("rfa", causal=True)
    assert not any("gate" in name for name, _ in encoder.named_parameters())
    assert {"gate_weight", "gate_bias"} <= dict(decoder.named_parameters()).keys()
    assert encoder.unbuilt_parameter_names() == ("gate_weight", "gate_bias")
    assert decoder.unbuilt_parameter_names() == ()
    q, k, v = make_qkv(b=1, n=9)
    with pytest.raises(ValueError, match=r"gate=True, but this core was built for a bidirectional model"):
        encoder(q, k, v, is_causal=True)
    plain = make_core("rfa", gate=False)  # plain causal RFA needs no gate, in any model
    torch.testing.assert_close(
        plain(q, k, v, is_causal=True).output,
        make_core("rfa", causal=True, gate=False)(q, k, v, is_causal=True).output,
    )
