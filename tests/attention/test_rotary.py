"""Rotary positions (RoPE) through the attention contract: the rotation is transformers' own, the types that
rotate queries and keys are exact attention with RoPE where their pattern covers the sequence (and the window
past it), the kernelized types are RoFormer's eq. 19 on their own feature maps, and what cannot carry them
is refused naming why.

The registry-wide properties (relative positions only, refusals) are tests/attention/contract.py's
``check_rotary_positions_carried_or_refused``.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import ModernBertConfig
from transformers.models.modernbert.modeling_modernbert import ModernBertRotaryEmbedding, apply_rotary_pos_emb

import hf_efficient
from hf_efficient.attention import AttentionSpec, RotaryPositions, build_attention, get_attention_class
from hf_efficient.attention.base import ROTATE_FEATURE_MAPS, ROTATE_QUERIES_AND_KEYS
from hf_efficient.attention.cache import EfficientCache
from hf_efficient.attention.registry import check_rotary_type
from hf_efficient.attention.rotary import default_inverse_frequencies

from .helpers import (
    make_core,
    make_qkv,
    padding_mask,
    reference_attention,
    rotary_kernel_quadratic_form,
    rotary_positions,
)
from .test_longformer import assert_equals_pattern_reference, longformer_pattern

TEXT_TYPES = hf_efficient.list_attention_types("text")
ROTATING = [t for t in TEXT_TYPES if get_attention_class(t).capabilities.rotary == ROTATE_QUERIES_AND_KEYS]
FEATURE_MAPS = [t for t in TEXT_TYPES if get_attention_class(t).capabilities.rotary == ROTATE_FEATURE_MAPS]


def test_which_text_types_carry_rotary_positions():
    """The exact, window and block types rotate queries and keys; the kernelized ones their feature maps;
    the types that compress keys over positions (and Reformer's hash buckets) refuse them."""
    assert ROTATING == ["bigbird", "full", "longformer"]
    assert FEATURE_MAPS == ["linear", "performer", "rfa"]
    assert hf_efficient.rotary_attention_types("text") == sorted(ROTATING + FEATURE_MAPS)
    for name in ("linformer", "long_short", "nystromformer", "reformer_lsh"):
        with pytest.raises(ValueError, match=f"{name}' cannot carry rotary positions: .*Types that can: big"):
            check_rotary_type(name, "text")


def test_rotation_is_transformers_rotary_embedding():
    """RotaryPositions.at and rotate compute what ModernBERT's rotary embedding and apply_rotary_pos_emb do,
    bit for bit, per layer kind (its two thetas), in float32 and bfloat16."""
    config = ModernBertConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=3)
    upstream = ModernBertRotaryEmbedding(config)
    positions = torch.arange(40)[None] + 3
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(2, 4, 40, 8).to(dtype)
        for kind in ("full_attention", "sliding_attention"):
            cos, sin = upstream(q, positions, kind)
            theta = config.rope_parameters[kind]["rope_theta"]
            ours = RotaryPositions.at(positions, default_inverse_frequencies(8, theta), dtype=dtype)
            assert torch.equal(ours.cos, cos) and torch.equal(ours.sin, sin)
            expected, _ = apply_rotary_pos_emb(q, q, cos, sin)
            assert torch.equal(ours.rotate(q), expected)


@pytest.mark.parametrize("attention_type", ROTATING)
def test_a_covered_length_is_exact_attention_with_rope(attention_type):
    """Where the pattern covers the sequence (every length for ``full``), a rotating type is exact attention
    on the rotated queries and keys, on a padded batch."""
    core = make_core(
        attention_type, **({"global_token_indices": []} if attention_type == "longformer" else {})
    )
    n = core.covered_length() or 24
    q, k, v = make_qkv(b=2, n=n)
    mask = padding_mask([n, n - 3], n)
    rotary = rotary_positions(torch.arange(n)[None])
    expected = reference_attention(rotary.rotate(q), rotary.rotate(k), v, mask)
    expected = expected.masked_fill(~mask[:, None, :, None], 0.0).float()
    torch.testing.assert_close(core(q, k, v, attention_mask=mask, rotary=rotary).output, expected)


@pytest.mark.parametrize("implementation", ["native", "reference"])
def test_window_past_its_reach_is_banded_attention_with_rope(implementation):
    """ModernBERT's window layers: the Longformer window with rotary positions is exact attention with RoPE
    over |i - j| <= w / 2, far past the window, outputs and gradients."""
    n, window = 50, 8
    core = make_core(
        "longformer", attention_window=window, global_token_indices=[], implementation=implementation
    )
    q, k, v = make_qkv(b=2, n=n, requires_grad=True)
    mask = padding_mask([n, 43], n)
    rotary = rotary_positions(torch.arange(n)[None])
    out = core(q, k, v, attention_mask=mask, rotary=rotary).output
    allowed = longformer_pattern(n, window, 1, torch.zeros(1, n, dtype=torch.bool))
    assert_equals_pattern_reference(out, q, k, v, mask, allowed, rotary)


def feature_maps_of(core, x: torch.Tensor) -> torch.Tensor:
    """The type's own feature map phi(x), (b, h, n, d) -> (b, h, n, m), without stabilising shifts."""
    if core.attention_type == "linear":
        return torch.nn.functional.elu(x) + 1
    if core.attention_type == "performer":  # exp(W x' - |x'|^2 / 2) / sqrt(m), x' = x d^(-1/4)
        scaled = x * core.head_dim**-0.25
        m = core.projection_matrix.shape[0]
        return torch.exp(
            scaled @ core.projection_matrix.t() - scaled.square().sum(-1, keepdim=True) / 2
        ) / math.sqrt(m)
    return core.feature_map(x)  # rfa's sin / cos features of the normalised vector


@pytest.mark.parametrize("attention_type", FEATURE_MAPS)
def test_kernelized_types_are_roformers_linear_attention(attention_type):
    """A kernelized type with rotary positions is RoFormer's eq. 19 on its own feature maps: the rotated maps
    in the numerator, the plain ones in the denominator, padded keys in neither (eps 0 where it has one;
    RFA divides by |denominator|, as without rotation); its gradients are finite."""
    core = make_core(attention_type, **({"eps": 0.0} if attention_type != "rfa" else {}))
    q, k, v = make_qkv(b=2, n=23, requires_grad=True)
    mask = padding_mask([23, 17], 23)
    rotary = rotary_positions(torch.arange(23)[None] + 4)
    out = core(q, k, v, attention_mask=mask, rotary=rotary).output
    numerator, denominator = rotary_kernel_quadratic_form(
        feature_maps_of(core, q), feature_maps_of(core, k), v, rotary, mask
    )
    expected = (numerator / denominator.abs()).masked_fill(~mask[:, None, :, None], 0.0)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-4)
    out.square().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("attention_type", ["linear", "performer"])
def test_kernels_leave_rotary_calls_to_the_reference(attention_type):
    """The kernelized kernels do not rotate feature maps: "auto" computes a call with rotary positions by the
    reference, and a forced kernel refuses it naming why."""
    q, k, v = make_qkv(n=19)
    rotary = rotary_positions(torch.arange(19)[None])
    auto = make_core(attention_type)(q, k, v, rotary=rotary).output
    reference = make_core(attention_type, implementation="reference")(q, k, v, rotary=rotary).output
    torch.testing.assert_close(auto, reference, atol=0, rtol=0)
    with pytest.raises(ValueError, match="does not rotate the feature maps"):
        make_core(attention_type, implementation="chunked")(q, k, v, rotary=rotary)


@pytest.mark.parametrize("attention_type", FEATURE_MAPS)
def test_kernelized_causal_form_refuses_rotary_positions(attention_type):
    core = make_core(attention_type, causal=True)
    q, k, v = make_qkv(n=9)
    with pytest.raises(ValueError, match=f"{attention_type}: rotary positions are carried by its non-causal"):
        core(q, k, v, is_causal=True, rotary=rotary_positions(torch.arange(9)[None]))


@pytest.mark.parametrize("attention_type", ["full", "longformer"])
def test_rotated_causal_decoding_equals_the_parallel_form(attention_type):
    """Rotated before the pattern, queries and keys decode from a cache as the parallel causal form computes
    them, each step given its own positions."""
    core = make_core(attention_type, causal=True)
    q, k, v = make_qkv(b=2, n=14)
    rotary = rotary_positions(torch.arange(14)[None])
    expected = core(q, k, v, is_causal=True, rotary=rotary).output
    cache, pieces = EfficientCache.for_cores([core]), []
    for start, stop in ((0, 5), *((t, t + 1) for t in range(5, 14))):
        part = slice(start, stop)
        step = rotary_positions(torch.arange(start, stop)[None])
        pieces.append(
            core(q[:, :, part], k[:, :, part], v[:, :, part], is_causal=True, cache=cache, rotary=step)
        )
    torch.testing.assert_close(torch.cat([p.output for p in pieces], dim=2), expected, atol=1e-5, rtol=1e-5)


def test_cross_attention_takes_no_rotary_positions():
    spec = AttentionSpec(num_heads=2, head_dim=8, cross_attention=True)
    core = build_attention("full", spec)
    q, k, v = make_qkv(n=5)
    with pytest.raises(ValueError, match="takes the other sequence's padding mask only, not rotary"):
        core(q, k, v, rotary=rotary_positions(torch.arange(5)[None]))


def test_bad_rotary_positions_raise_naming_the_shape_and_the_fix():
    core = make_core("full")
    q, k, v = make_qkv(n=10)
    with pytest.raises(
        ValueError, match=r"rotary cos must have shape \(batch or 1, seq, head_dim\) = \(2 or 1, 10, 8\)"
    ):
        core(q, k, v, rotary=rotary_positions(torch.arange(9)[None]))
    with pytest.raises(ValueError, match="odd number, 63.*Performer's num_features"):
        make_core("performer", num_features=63)(q, k, v, rotary=rotary_positions(torch.arange(10)[None]))
