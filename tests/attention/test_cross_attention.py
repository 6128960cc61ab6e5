"""Cross-attention cores (``AttentionSpec(cross_attention=True)``): n queries of one sequence against the m
keys and values of another, the keys' padding as ``attention_mask`` (b, m).

Every capable type is checked against exact attention where the two must agree (identical keys: every
attention averages the real values), against its own non-causal self-attention on the same inputs, for
ignoring padded keys exactly, and for treating each query on its own (a decoder reads one token at a time).
Every other type is refused, with the reason its core declares.
"""

from __future__ import annotations

import pytest
import torch

import hf_efficient
from hf_efficient.attention import ATTENTION_REGISTRY, AttentionCore, AttentionSpec, build_attention

from .helpers import padding_mask, reference_attention, small_config

CROSS_TYPES = hf_efficient.cross_attention_types()
HEADS, HEAD_DIM = 2, 8


def cross_core(attention_type: str, **config):
    spec = AttentionSpec(num_heads=HEADS, head_dim=HEAD_DIM, max_seq_len=64, cross_attention=True)
    return build_attention(attention_type, spec, small_config(attention_type, **config)).eval()


def queries_and_keys(n=5, m=11, seed=0):
    """Queries (2, h, n, d), keys and values (2, h, m, d); the second row's last 4 keys are padding."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, HEADS, n, HEAD_DIM, generator=g)
    k, v = (torch.randn(2, HEADS, m, HEAD_DIM, generator=g) for _ in range(2))
    return q, k, v, padding_mask([m, m - 4], m)


def test_cross_attention_types():
    assert CROSS_TYPES == ["full", "linear", "performer", "rfa"]


@pytest.mark.parametrize("implementation", ["reference", "auto"])
def test_full_cross_attention_is_exact_softmax(implementation):
    q, k, v, mask = queries_and_keys()
    core = cross_core("full", implementation=implementation)
    out = core(q, k, v, attention_mask=mask).output
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, mask), atol=1e-6, rtol=1e-5)
    weights = core(q, k, v, attention_mask=mask, output_attentions=True).weights  # (b, h, n, m)
    assert weights.shape == (2, HEADS, 5, 11) and weights[1, :, :, 7:].abs().max() == 0


@pytest.mark.parametrize("attention_type", CROSS_TYPES)
def test_identical_keys_average_the_real_values_as_exact_attention(attention_type):
    """With every key the same, exact softmax weighs the real keys equally, and so does any kernel
    phi(q)^T phi(k): the output is the mean of the real values, whatever the queries (eps ~ 0: the kernelized
    normaliser's guard is the only other difference)."""
    q, _, v, mask = queries_and_keys()
    k = torch.randn(1, HEADS, 1, HEAD_DIM, generator=torch.Generator().manual_seed(1))
    k = k.expand(2, HEADS, 11, HEAD_DIM).contiguous()  # one key, 11 times
    no_guard = (
        {"eps": 1e-12}
        if "eps" in ATTENTION_REGISTRY[attention_type].config_class.__dataclass_fields__
        else {}
    )
    out = cross_core(attention_type, **no_guard)(q, k, v, attention_mask=mask).output
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, mask), atol=1e-5, rtol=1e-4)
    mean = v[1, :, :7].mean(1)  # (h, d): row 1 has 7 real keys
    torch.testing.assert_close(out[1], mean[:, None].expand(HEADS, 5, HEAD_DIM), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("attention_type", CROSS_TYPES)
def test_cross_attention_equals_the_types_own_attention_over_the_keys(attention_type):
    """On n = m tokens without padding the cross core computes what the type's (non-causal) self-attention
    core computes on the same queries, keys and values: the same maths, only the lengths may now differ."""
    q, k, v, _ = queries_and_keys(n=11, m=11)
    across = cross_core(attention_type)
    spec = AttentionSpec(num_heads=HEADS, head_dim=HEAD_DIM, max_seq_len=64)
    own = build_attention(attention_type, spec, small_config(attention_type)).eval()
    own.load_state_dict(across.state_dict())
    torch.testing.assert_close(across(q, k, v).output, own(q, k, v).output, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("attention_type", CROSS_TYPES)
def test_padded_keys_change_nothing_and_queries_are_independent(attention_type):
    q, k, v, mask = queries_and_keys()
    core = cross_core(attention_type)
    out = core(q, k, v, attention_mask=mask).output  # (2, h, 5, d)
    # garbage at the padded keys and values: nothing changes
    poisoned_k, poisoned_v = k.clone(), v.clone()
    poisoned_k[1, :, 7:], poisoned_v[1, :, 7:] = 1e3, -1e3
    torch.testing.assert_close(core(q, poisoned_k, poisoned_v, attention_mask=mask).output, out)
    # the padded row equals the same keys without their padding
    short = core(q[1:], k[1:, :, :7], v[1:, :, :7]).output
    torch.testing.assert_close(out[1:], short, atol=1e-6, rtol=1e-5)
    # each query on its own (decoding feeds one at a time): the same rows
    for i in range(q.shape[2]):
        one = core(q[:, :, i : i + 1], k, v, attention_mask=mask).output
        torch.testing.assert_close(one, out[:, :, i : i + 1], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("attention_type", CROSS_TYPES)
def test_gradients_reach_queries_keys_and_values(attention_type):
    q, k, v, mask = queries_and_keys()
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    cross_core(attention_type)(q, k, v, attention_mask=mask).output.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0
    assert k.grad[1, :, 7:].abs().max() == 0  # padded keys get no gradient


def test_a_row_with_no_real_key_attends_to_nothing():
    q, k, v, _ = queries_and_keys()
    mask = torch.zeros(2, 11, dtype=torch.bool)
    mask[0] = True
    for attention_type in CROSS_TYPES:
        out = cross_core(attention_type)(q, k, v, attention_mask=mask).output
        assert out[1].abs().max() == 0 and torch.isfinite(out).all() and out[0].abs().max() > 0


@pytest.mark.parametrize("attention_type", sorted(set(ATTENTION_REGISTRY) - set(CROSS_TYPES)))
def test_types_that_cannot_attend_to_another_sequence_are_refused_with_their_reason(attention_type):
    cls = ATTENTION_REGISTRY[attention_type]
    assert not cls.capabilities.cross_attention
    assert cls.cross_attention_refusal != AttentionCore.cross_attention_refusal  # each states its own reason
    spec = AttentionSpec(num_heads=HEADS, head_dim=HEAD_DIM, max_seq_len=64, cross_attention=True)
    with pytest.raises(ValueError, match="cannot serve cross-attention") as error:
        build_attention(attention_type, spec, small_config(attention_type))
    assert cls.cross_attention_refusal in str(error.value) and "full, linear, performer, rfa" in str(
        error.value
    )


def test_cross_attention_refuses_what_it_cannot_mean():
    q, k, v, mask = queries_and_keys()
    core = cross_core("full")
    with pytest.raises(ValueError, match="not causal"):
        core(q, k, v, attention_mask=mask, is_causal=True)
    with pytest.raises(ValueError, match="not cache"):
        core(q, k, v, attention_mask=mask, cache=object())
    with pytest.raises(ValueError, match=r"attention_mask must be a \(batch, seq\) = \(2, 11\)"):
        core(q, k, v, attention_mask=mask[:, :5])  # the mask is the keys'
    with pytest.raises(ValueError, match="keys and values"):
        core(q, k, v[:, :, :3])
    with pytest.raises(ValueError, match="non-causal"):
        AttentionSpec(num_heads=2, head_dim=8, causal=True, cross_attention=True)
    # a self-attention core still wants one sequence
    own = build_attention("full", AttentionSpec(num_heads=HEADS, head_dim=HEAD_DIM))
    with pytest.raises(ValueError, match="self-attention over one sequence"):
        own(q, k, v)
