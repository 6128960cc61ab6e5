"""linear (Katharopoulos et al. 2020): explicit quadratic form, causal parallel == recurrent, padding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hf_efficient.attention import AttentionSpec, build_attention
from hf_efficient.attention.kernels.kernelized import kernelized_attention
from hf_efficient.attention.linear import elu_feature_map, masked_elu_feature_map

from .helpers import kernel_quadratic_form, make_core, make_qkv


def quadratic_form(q, k, v, mask=None, causal=False):
    """The explicit float64 (n x n) form with linear attention's elu + 1 features and eps = 1e-6."""
    phi_q, phi_k = F.elu(q.double()) + 1, F.elu(k.double()) + 1
    return kernel_quadratic_form(phi_q, phi_k, v, mask, causal, eps=1e-6)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 5, 37])
def test_equals_explicit_quadratic_form(causal, n):
    core = make_core("linear")  # block_size 4: several causal blocks
    q, k, v = make_qkv(b=2, n=n)
    out = core(q, k, v, is_causal=causal).output
    torch.testing.assert_close(out.double(), quadratic_form(q, k, v, causal=causal), atol=1e-5, rtol=1e-5)
    out64 = core(q.double(), k.double(), v.double(), is_causal=causal).output  # float64 in, float64 maths
    torch.testing.assert_close(out64, quadratic_form(q, k, v, causal=causal), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_padding_anywhere_masks_keys_and_values(causal):
    core = make_core("linear")
    q, k, v = make_qkv(b=2, n=21)
    mask = torch.rand(2, 21, generator=torch.Generator().manual_seed(3)) > 0.3
    mask[:, 0] = True
    k, v = k.masked_fill(~mask[:, None, :, None], 1e9), v.masked_fill(~mask[:, None, :, None], -1e9)
    out = core(q, k, v, attention_mask=mask, is_causal=causal).output
    expected = quadratic_form(q, k.masked_fill(~mask[:, None, :, None], 0), v, mask, causal)
    expected = expected.masked_fill(~mask[:, None, :, None], 0)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_size", [1, 3, 4, 50])
@pytest.mark.parametrize("budget", [1, 2**12, 2**30])
def test_causal_blocks_and_chunk_groups_do_not_change_the_result(block_size, budget):
    """Parallel causal form: any block size, any number of carried-state groups (tiny budget -> many)."""
    q, k, v = (t.double() for t in make_qkv(b=2, n=29))
    mask = torch.ones(2, 29, dtype=torch.bool)
    mask[1, 20:] = False
    out = kernelized_attention(
        q, k, v, mask, elu_feature_map, masked_elu_feature_map, 8, causal=True, eps=1e-6,
        block_size=block_size, budget=budget,
    )  # fmt: skip
    expected = quadratic_form(q, k, v, mask, causal=True)
    torch.testing.assert_close(out[0], expected[0], atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(out[1, :, :20], expected[1, :, :20], atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("budget", [1, 2**30])
def test_noncausal_chunking_does_not_change_the_result(budget):
    q, k, v = (t.double() for t in make_qkv(b=2, n=23))
    out = kernelized_attention(
        q, k, v, None, elu_feature_map, masked_elu_feature_map, 8, causal=False, eps=1e-6, budget=budget
    )
    torch.testing.assert_close(out, quadratic_form(q, k, v), atol=1e-12, rtol=1e-12)


def test_causal_parallel_equals_recurrent_steps():
    core = make_core("linear")
    q, k, v = make_qkv(b=2, n=19)
    parallel = core(q, k, v, is_causal=True).output
    state, steps = None, []
    for t in range(19):
        out_t, state = core.step(q[:, :, t], k[:, :, t], v[:, :, t], state)
        steps.append(out_t)
    torch.testing.assert_close(torch.stack(steps, dim=2), parallel, atol=1e-5, rtol=1e-5)
    # [S | z]: phi(k) v^T and phi(k) side by side, d x (d + 1) per head; elu + 1 needs no shift
    assert state.sums.shape == (2, 2, 8, 9) and state.shift is None


def test_causal_output_ignores_future_tokens():
    core = make_core("linear")
    q, k, v = make_qkv(b=1, n=20)
    out = core(q, k, v, is_causal=True).output
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 12:] += 5.0
    v2[:, :, 12:] -= 5.0
    out2 = core(q, k2, v2, is_causal=True).output
    torch.testing.assert_close(out2[:, :, :12], out[:, :, :12], atol=0, rtol=0)
    assert not torch.allclose(out2[:, :, 12:], out[:, :, 12:])


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(causal):
    core = make_core("linear")
    q, k, v = (t.double().requires_grad_() for t in make_qkv(b=1, n=9))
    mask = torch.ones(1, 9, dtype=torch.bool)
    mask[0, 7:] = False
    attend = lambda a, b, c: core(a, b, c, attention_mask=mask, is_causal=causal).output  # noqa: E731
    assert torch.autograd.gradcheck(attend, (q, k, v))
    assert torch.autograd.gradgradcheck(attend, (q, k, v), fast_mode=True)  # a random projection


def test_feature_map_keeps_its_output_not_the_queries_and_keys():
    """phi = elu + 1 keeps phi for backward (phi' = min(phi, 1)): queries and keys are free after forward."""
    core = make_core("linear")
    q, k, v = (t.requires_grad_() for t in make_qkv(b=1, n=16))
    query, key = q * 1.0, k * 1.0  # non-leaf, like the projections' outputs
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.untyped_storage().data_ptr()) or t, lambda t: t
    ):
        core(query, key, v, is_causal=False).output.sum().backward()
    assert query.untyped_storage().data_ptr() not in saved and key.untyped_storage().data_ptr() not in saved
    x = torch.tensor([-30.0, -1.0, 0.0, 0.5, 3.0], dtype=torch.float64, requires_grad=True)
    keep = torch.tensor([True, True, True, True, False])
    masked_elu_feature_map(x, keep).sum().backward()
    expected = torch.tensor([-30.0, -1.0, 0.0, 0.5, 3.0], dtype=torch.float64).exp().clamp(max=1.0)
    # 0 at the padded key; atol: elu(x) + 1 itself loses digits to cancellation at x = -30 (phi ~ 1e-13)
    torch.testing.assert_close(x.grad, expected * keep, rtol=1e-12, atol=1e-15)


def test_config_validation():
    spec = AttentionSpec(2, 8)
    with pytest.raises(ValueError, match="eps"):
        build_attention("linear", spec, {"eps": -1.0})
    with pytest.raises(ValueError, match="block_size"):
        build_attention("linear", spec, {"block_size": 0})
    assert build_attention("linear", spec).config.eps == 1e-6


@pytest.mark.parametrize("attention_type", ["linear", "performer", "rfa"])
@pytest.mark.parametrize("causal", [False, True])
def test_chunked_kernel_equals_reference_over_many_chunks(attention_type, causal, monkeypatch):
    """The kernelized family's chunked kernels with budgets so small that every chunk is a row or a few
    (non-causal) or one block (causal): outputs, gradients (of RFA's sigma and gate too) and, causal, a
    prefill from a carried state, against the reference (the contract test's lengths fit in one chunk at the
    real budgets)."""
    from hf_efficient.attention.cache import EfficientCache
    from hf_efficient.attention.kernels import kernelized, rfa

    monkeypatch.setattr(kernelized, "FEATURE_CHUNK_BYTES", 2**10)
    monkeypatch.setattr(kernelized, "CHUNK_BYTES", 2**10)
    monkeypatch.setattr(rfa, "rows_per_chunk", lambda bytes_per_row, rows, budget=None: min(4, rows))
    config = {"causal_chunk": 5} if attention_type == "rfa" else {}
    torch.manual_seed(0)
    reference = make_core(attention_type, causal=causal, implementation="reference", **config).train()
    chunked = make_core(attention_type, causal=causal, implementation="chunked", **config).train()
    chunked.load_state_dict(reference.state_dict())
    q, k, v = make_qkv(b=2, n=41)
    mask = torch.ones(2, 41, dtype=torch.bool)
    mask[1, 30:] = False
    mask[1, 5:8] = False
    results = []
    for core in (reference, chunked):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = core(*leaves, attention_mask=mask, is_causal=causal).output
        params = [p for _, p in sorted(core.named_parameters())]
        results.append([out, *torch.autograd.grad((out * v.flip(2)).sum(), leaves + params)])
    for want, got in zip(*results, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    if causal:  # prefill of 20 tokens, then of the other 21 from the state it left
        outs = []
        for core in (reference, chunked):
            cache, parts = EfficientCache.for_cores([core]), []
            for s in (slice(0, 20), slice(20, 41)):
                with torch.no_grad():
                    out = core(
                        *(t[:, :, s] for t in (q, k, v)),
                        attention_mask=mask[:, s],
                        is_causal=True,
                        cache=cache,
                    )
                parts.append(out.output)
            outs.append(torch.cat(parts, 2))
        torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(outs[0], results[0][0].detach(), atol=1e-5, rtol=1e-5)
