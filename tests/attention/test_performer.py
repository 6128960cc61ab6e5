"""performer (FAVOR+): convergence to softmax attention, explicit quadratic forms, redraws (the redraw
callback: tests/training/test_callbacks.py)."""

from __future__ import annotations

import math

import pytest
import torch

from hf_efficient.attention import AttentionSpec, build_attention
from hf_efficient.attention.kernels import kernelized as chunked_engine
from hf_efficient.attention.performer import EXPONENT_FLOOR as PERFORMER_EXPONENT_FLOOR
from hf_efficient.attention.performer import RELU_FEATURE_FLOOR
from hf_efficient.attention.utils import CUDA_CHUNK_FACTOR, device_chunk_budget, orthogonal_gaussian_features

from .helpers import (
    assert_close_with_gradients,
    kernel_quadratic_form,
    make_core,
    make_qkv,
    reference_attention,
)


def explicit_features(x, w, kernel):
    """The paper's feature maps, float64, no stabilisation: (b, h, n, d) -> (b, h, n, m)."""
    x, w = x.double(), w.double()
    m, d = w.shape
    if kernel == "relu":
        return torch.relu(x @ w.T / math.sqrt(m)) + RELU_FEATURE_FLOOR
    x = x * d**-0.25
    return torch.exp(x @ w.T - x.square().sum(-1, keepdim=True) / 2) / math.sqrt(m)


def relative_error(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def test_error_against_softmax_decreases_with_num_features():
    """More random features -> closer to exact attention (averaged over seeds to smooth the noise).

    Inputs are scaled so that |q'|^2 = |q|^2 / sqrt(d) is about 1: the estimator's variance grows like
    exp(|q' + k'|^2), so unit-variance 16-d inputs would need far more features for the same error.
    """
    q, k, v = make_qkv(b=1, h=2, n=48, d=16, seed=0)
    q, k = 0.5 * q, 0.5 * k
    exact = reference_attention(q, k, v)
    errors = []
    for m in (16, 64, 256, 1024, 4096):
        runs = [
            relative_error(make_core("performer", head_dim=16, num_features=m, seed=s)(q, k, v).output, exact)
            for s in range(4)
        ]
        errors.append(sum(runs) / len(runs))
    # measured: 0.50, 0.35, 0.26, 0.085, 0.043 (roughly 1 / sqrt(m))
    assert all(later < earlier for earlier, later in zip(errors, errors[1:], strict=False)), errors
    assert errors[-1] < 0.08, errors
    assert errors[0] > 5 * errors[-1], errors


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", ["softmax", "relu"])
def test_equals_explicit_quadratic_form_of_its_features(kernel, causal):
    """Stabilised chunked computation == unstabilised phi(Q) phi(K)^T V / normaliser, outputs and gradients.

    eps = 0 and float64, so the stabilising shifts must cancel exactly; a per-key shift would fail this
    test (it reweights the keys). 26 tokens with block_size 4: the causal form pads its last block.
    """
    core = make_core("performer", kernel=kernel, eps=0.0)
    q, k, v = (3 * t.double() for t in make_qkv(b=2, n=26))  # large logits: stabilisation matters
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    mask = torch.ones(2, 26, dtype=torch.bool)
    mask[1, 3] = mask[1, 19:] = False
    w = core.projection_matrix
    phi_q, phi_k = explicit_features(q, w, kernel), explicit_features(k, w, kernel)
    expected = kernel_quadratic_form(phi_q, phi_k, v, mask, causal)
    expected = expected.masked_fill(~mask[:, None, :, None], 0)
    out = core(q, k, v, attention_mask=mask, is_causal=causal).output
    assert_close_with_gradients(out, expected, (q, k, v), atol=1e-10, rtol=1e-8)


def test_exponent_floor_keeps_outputs_and_gradients():
    """Large-norm queries/keys (a checkpoint's) push many exponents below the -80 floor that keeps exp out of
    slow denormals; outputs and gradients still equal the unfloored float64 form: what is floored weighs
    less than e^-80 of a row's largest feature."""
    core = make_core("performer", eps=0.0, num_features=64)
    q, k, v = (t.double() for t in make_qkv(b=1, n=32, seed=3))
    q, k = 12 * q, 12 * k
    w = core.projection_matrix
    scaled = k * k.shape[-1] ** -0.25
    exponents = scaled @ w.double().T - scaled.square().sum(-1, keepdim=True) / 2  # (b, h, n, m)
    assert (exponents - exponents.amax() < PERFORMER_EXPONENT_FLOOR).float().mean() > 0.2  # the floor acts
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    phi_q, phi_k = explicit_features(q, w, "softmax"), explicit_features(k, w, "softmax")
    expected = kernel_quadratic_form(phi_q, phi_k, v)
    out = core(q, k, v).output
    assert_close_with_gradients(out, expected, (q, k, v), atol=1e-9, rtol=1e-7)


def test_causal_output_ignores_future_values():
    core = make_core("performer")
    q, k, v = make_qkv(b=1, n=20)
    out = core(q, k, v, is_causal=True).output
    v2 = v.clone()
    v2[:, :, 11:] += 3.0
    torch.testing.assert_close(core(q, k, v2, is_causal=True).output[:, :, :11], out[:, :, :11])


def test_gradcheck_causal():
    core = make_core("performer", num_features=8, eps=0.0).double()  # eps 0: the shifts cancel exactly
    q, k, v = (t.double().requires_grad_() for t in make_qkv(b=1, h=2, n=6))
    mask = torch.tensor([[True] * 5 + [False]])
    fn = lambda a, b, c: core(a, b, c, attention_mask=mask, is_causal=True).output  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v), fast_mode=True)


@pytest.mark.parametrize("causal", [False, True])
def test_second_derivatives_with_a_padded_key(causal):
    core = make_core("performer", num_features=8, eps=0.0).double()
    q, k, v = (t.double().requires_grad_() for t in make_qkv(b=1, h=2, n=6))
    mask = torch.tensor([[True] * 5 + [False]])
    fn = lambda a, b, c: core(a, b, c, attention_mask=mask, is_causal=causal).output  # noqa: E731
    assert torch.autograd.gradgradcheck(fn, (q, k, v), fast_mode=True)


def test_features_are_kept_once_for_backward():
    """Only phi(q) and phi(k) of size (b, h, n, m) stay alive for backward: the exponent floor's clamp kept
    a copy of each exponent tensor besides (twice the feature memory: 256 MiB per layer at 16k tokens)."""
    core = make_core("performer", num_features=32)
    q, k, v = (t * 1.0 for t in (t.requires_grad_() for t in make_qkv(b=1, h=2, n=64)))
    saved = {}
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) and t,
        lambda t: t,
    ):
        out = core(q, k, v).output
    feature_bytes = 1 * 2 * 64 * 32 * 4  # one (b, h, n, m) float32 tensor; q, k, v are 4x smaller
    assert list(saved.values()).count(feature_bytes) == 2
    out.sum().backward()


def test_features_are_orthogonal_blocks_with_chi_norms():
    w = orthogonal_gaussian_features(40, 16, torch.Generator().manual_seed(0))
    assert w.shape == (40, 16)
    directions = w / w.norm(dim=1, keepdim=True)
    for start in (0, 16, 32):  # rows of one block are orthogonal
        block = directions[start : start + 16]
        torch.testing.assert_close(block @ block.T, torch.eye(len(block)), atol=1e-5, rtol=0)
    many = orthogonal_gaussian_features(4096, 16, torch.Generator().manual_seed(1))
    assert abs(many.square().sum(1).mean().item() - 16) < 0.5  # E|w|^2 = d for chi_d norms


def test_redraw_and_seeding():
    core = make_core("performer")
    q, k, v = make_qkv(n=17)
    w0, out0 = core.projection_matrix.clone(), core(q, k, v).output
    assert torch.equal(make_core("performer").projection_matrix, w0)  # same (seed, layer) -> same W
    assert not torch.equal(make_core("performer", layer_idx=1).projection_matrix, w0)
    assert not torch.equal(make_core("performer", seed=1).projection_matrix, w0)

    torch.manual_seed(123)
    core.redraw_features()  # from the global RNG
    assert not torch.equal(core.projection_matrix, w0)
    assert not torch.allclose(core(q, k, v).output, out0)

    core.resample_random_state(7)
    w7 = core.projection_matrix.clone()
    core.resample_random_state(8)
    assert not torch.equal(core.projection_matrix, w7)
    core.resample_random_state(7)
    assert torch.equal(core.projection_matrix, w7)

    core.init_weights()  # back to the (config.seed, layer_idx) draw
    assert torch.equal(core.projection_matrix, w0)
    assert "projection_matrix" in core.state_dict()


def test_config_validation():
    spec = AttentionSpec(2, 8)
    for bad, field in (({"num_features": 0}, "num_features"), ({"kernel": "cosine"}, "kernel")):
        with pytest.raises(ValueError, match=field):
            build_attention("performer", spec, bad)
    assert build_attention("performer", spec).config.num_features == 256


@pytest.mark.parametrize("implementation", ["chunked", "reference"])
def test_causal_outputs_do_not_depend_on_later_keys(implementation):
    """The causal form's stabilising shift is the running maximum over the keys so far: a later key cannot
    change an earlier output. Large-norm early keys (a checkpoint's) have log-features far below those of
    ordinary later keys; a shift taken over the whole sequence pushed them under the exponent floor, so the
    first outputs depended on keys after them. Decoding one token at a time must give the same outputs."""
    core = make_core("performer", causal=True, eps=0.0, implementation=implementation)  # eps 0: shifts cancel
    q, k, v = make_qkv(b=1, n=16, seed=2)
    # early keys: one large-norm direction (log-features near each other, ~150 below the later keys')
    direction = torch.nn.functional.normalize(
        torch.randn(8, generator=torch.Generator().manual_seed(5)), dim=0
    )
    k[:, :, :8] = 30.0 * direction + 0.3 * k[:, :, :8]
    whole = core(q, k, v, is_causal=True).output
    prefix = core(q[:, :, :8], k[:, :, :8], v[:, :, :8], is_causal=True).output
    torch.testing.assert_close(whole[:, :, :8], prefix, atol=1e-6, rtol=1e-5)
    w = core.projection_matrix
    phi_q, phi_k = explicit_features(q[:, :, :8], w, "softmax"), explicit_features(k[:, :, :8], w, "softmax")
    exact = kernel_quadratic_form(phi_q, phi_k, v[:, :, :8], causal=True)  # float64, no shift at all
    torch.testing.assert_close(prefix.double(), exact, atol=1e-5, rtol=1e-4)
    state, steps = None, []
    for t in range(16):
        out, state = core.step(q[:, :, t], k[:, :, t], v[:, :, t], state)
        steps.append(out)
    torch.testing.assert_close(torch.stack(steps, dim=2), whole, atol=1e-5, rtol=1e-5)
    assert state.shift.shape == (1, 2, 1, 1) and state.sums.shape == (1, 2, 64, 9)


def test_feature_chunks_are_larger_on_cuda():
    """CPU-sized feature chunks left performer and rfa bound by per-chunk launch work on a GPU; on CUDA the
    budget is CUDA_CHUNK_FACTOR times the CPU one, on every other device unchanged."""
    budget = 8 * 2**20
    assert device_chunk_budget(budget, torch.device("cpu")) == budget
    assert device_chunk_budget(budget, torch.device("cuda")) == CUDA_CHUNK_FACTOR * budget == 16 * budget


@pytest.mark.gpu
def test_performer_on_cuda_uses_the_larger_feature_chunks(monkeypatch):
    budgets = []
    plain = chunked_engine.rows_per_chunk

    def recording(bytes_per_row, total_rows, budget):
        budgets.append(budget)
        return plain(bytes_per_row, total_rows, budget)

    monkeypatch.setattr(chunked_engine, "rows_per_chunk", recording)
    core = make_core("performer", implementation="chunked").cuda()  # auto takes "parallel" on CUDA
    q, k, v = (t.cuda() for t in make_qkv(b=1, n=64, d=8))
    core(q, k, v)
    assert set(budgets) == {CUDA_CHUNK_FACTOR * chunked_engine.FEATURE_CHUNK_BYTES}  # key maxima, features


@pytest.mark.parametrize("implementation", ["chunked", "parallel"])
def test_bfloat16_features_come_from_float32_projections(implementation):
    """In bfloat16 the features are exp of float32 projections, rounded once (the products that read them
    run in bfloat16): they equal the float32 features to bfloat16's rounding, where exp of bfloat16-rounded
    projections missed them by several percent at head size 64. Outputs stay within the 0.05 tolerance."""
    core = make_core("performer", head_dim=64, num_features=256, implementation=implementation)
    assert torch.bfloat16 not in core.float32_for
    q, k, v = (t.bfloat16().float() for t in make_qkv(b=1, n=300, d=64, seed=3))  # exact in bfloat16
    maps32 = core.feature_maps(q, None)
    maps16 = core.feature_maps(q.bfloat16(), None)
    want = maps32.query_features(q)
    got = maps16.query_features(q.bfloat16())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2**-8, atol=1e-30)
    shift = torch.zeros(1, 2, 1, 1)
    want_k = maps32.key_features(k, None, shift)
    torch.testing.assert_close(
        maps16.key_features(k.bfloat16(), None, shift).float(), want_k, rtol=2**-8, atol=1e-30
    )
    out = core(q.bfloat16(), k.bfloat16(), v.bfloat16()).output
    assert (out.float() - core(q, k, v).output).abs().max() < 0.05
