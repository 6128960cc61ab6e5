"""Linformer: identity projections give exact attention; length limit; sharing modes and their ties."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, load_model, save_model
from torch import nn

from hf_efficient.attention import AttentionSpec, build_attention

from .helpers import make_core, make_qkv, reference_attention


def identity_projection(k: int, n_max: int) -> torch.Tensor:
    """(k, n_max) matrix whose first k columns are the identity: E[:, :k] K = K."""
    return torch.eye(k, n_max)


@pytest.mark.parametrize("sharing", ["none", "headwise", "key_value", "layerwise"])
def test_identity_projections_equal_full_attention(sharing):
    n = 19
    core = make_core("linformer", max_seq_len=32, projected_length=n, sharing=sharing)
    with torch.no_grad():
        for param in core.parameters():
            param.copy_(identity_projection(n, 32).expand_as(param))
    q, k, v = make_qkv(b=2, n=n)
    out = core(q, k, v).output
    full = build_attention("full", AttentionSpec(2, 8)).eval()
    torch.testing.assert_close(out, full(q, k, v).output, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.double(), reference_attention(q, k, v), atol=1e-5, rtol=1e-5)


def test_projection_is_a_learned_compression():
    """With k < n the output differs from exact attention and the projections receive gradients."""
    core = make_core("linformer", projected_length=8).train()
    q, k, v = make_qkv(n=30)
    out = core(q, k, v).output
    assert not torch.allclose(out.double(), reference_attention(q, k, v), atol=1e-3)
    out.square().sum().backward()
    assert core.key_projection.grad[:, :30].abs().sum() > 0
    assert (core.key_projection.grad[:, 30:] == 0).all(), "columns beyond n are not used"


def test_longer_input_raises_naming_the_limit():
    core = make_core("linformer", max_seq_len=24)
    q, k, v = make_qkv(n=24)
    assert core(q, k, v).output.shape == (2, 2, 24, 8)
    q, k, v = make_qkv(n=25)
    with pytest.raises(ValueError, match="max_seq_len=24"):
        core(q, k, v)


def test_missing_max_seq_len_raises_at_construction():
    with pytest.raises(ValueError, match="max_seq_len"):
        build_attention("linformer", AttentionSpec(2, 8, max_seq_len=None))


@pytest.mark.parametrize(
    ("sharing", "expected"),
    [("none", 2 * 2 * 8 * 40), ("headwise", 2 * 8 * 40), ("key_value", 8 * 40), ("layerwise", 8 * 40)],
)
def test_parameter_counts_per_sharing_mode(sharing, expected):
    core = make_core("linformer", max_seq_len=40, projected_length=8, sharing=sharing)
    assert sum(p.numel() for p in core.parameters()) == expected


@pytest.mark.parametrize("sharing", ["none", "headwise", "key_value", "layerwise"])
def test_layerwise_ties_only_in_layerwise_mode(sharing):
    layers = nn.ModuleList(
        make_core("linformer", layer_idx=i, max_seq_len=40, projected_length=8, sharing=sharing)
        for i in range(3)
    )
    for layer in layers[1:]:
        layer.share_parameters_with(layers[0])
    unique = sum(p.numel() for p in layers.parameters())  # parameters() skips repeated objects
    per_layer = sum(p.numel() for p in layers[0].parameters())
    if sharing == "layerwise":
        assert unique == per_layer
        assert layers[1].projection is layers[0].projection and layers[2].projection is layers[0].projection
    else:
        assert unique == 3 * per_layer
    if sharing == "key_value":
        key_projection, value_projection = layers[0]._projections()
        assert key_projection is value_projection


def test_layerwise_sharing_rejects_mismatched_first_layer():
    first = make_core("linformer", max_seq_len=40, projected_length=8, sharing="layerwise")
    other = make_core("linformer", max_seq_len=40, projected_length=4, sharing="layerwise")
    with pytest.raises(ValueError, match="projected_length"):
        other.share_parameters_with(first)
    with pytest.raises(ValueError, match="layerwise"):
        other.share_parameters_with(make_core("linformer", max_seq_len=40, sharing="headwise"))


def _tied_pair(seed: int) -> nn.ModuleList:
    torch.manual_seed(seed)
    pair = nn.ModuleList(
        make_core("linformer", layer_idx=i, max_seq_len=40, projected_length=8, sharing="layerwise")
        for i in range(2)
    )
    pair[1].share_parameters_with(pair[0])
    return pair


def test_layerwise_sharing_survives_save_and_load(tmp_path):
    pair = _tied_pair(seed=1)
    q, k, v = make_qkv(n=33)
    expected = [layer(q, k, v).output for layer in pair]
    path = tmp_path / "pair.safetensors"
    save_model(pair, str(path))  # drops the duplicate name of the tied tensor
    assert len(load_file(str(path))) == 1, "the tied projection must be stored once"

    fresh = _tied_pair(seed=2)
    assert not torch.equal(fresh[0].projection, pair[0].projection)
    load_model(fresh, str(path))
    assert fresh[1].projection is fresh[0].projection
    for layer, out in zip(fresh, expected, strict=True):
        torch.testing.assert_close(layer(q, k, v).output, out, atol=0, rtol=0)


def test_padding_is_zeroed_before_projection():
    """Poisoned padding (inf) must not reach the projected keys/values, and gradients stay finite."""
    core = make_core("linformer").train()
    q, k, v = make_qkv(b=2, n=20)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[0, 12:] = False
    poison = (~mask)[:, None, :, None]
    k, v = (t.masked_fill(poison, float("inf")).requires_grad_() for t in (k, v))
    out = core(q, k, v, attention_mask=mask).output
    assert torch.isfinite(out).all()
    out.sum().backward()
    for t in (k, v):
        assert torch.isfinite(t.grad).all() and (t.grad[0, :, 12:] == 0).all()


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="projected_length"):
        build_attention("linformer", AttentionSpec(2, 8, max_seq_len=16), {"projected_length": 0})
    with pytest.raises(ValueError, match="sharing"):
        build_attention("linformer", AttentionSpec(2, 8, max_seq_len=16), {"sharing": "everything"})
