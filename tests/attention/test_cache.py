"""The generation cache: the layers each causal core builds follow the batch through generate() (beam
reordering, selection, repetition), count the tokens seen, keep a constant size where the state is recurrent,
and refuse what they cannot do (rolling back a recurrent state, a cache of another model)."""

from __future__ import annotations

import pytest
import torch

from hf_efficient.attention import causal_attention_types
from hf_efficient.attention.cache import (
    EfficientCache,
    KeyValueCacheLayer,
    RecurrentStateLayer,
    SlidingWindowCacheLayer,
)

from .helpers import make_core, make_qkv

CAUSAL_TYPES = causal_attention_types()


def decode(core, cache, q, k, v, start, stop, mask=None):
    """Run tokens start:stop one call through the core with the cache (several tokens: one parallel call)."""
    part = slice(start, stop)
    real = None if mask is None else mask[:, part]
    return core(q[:, :, part], k[:, :, part], v[:, :, part], attention_mask=real, is_causal=True, cache=cache)


@pytest.mark.parametrize("attention_type", CAUSAL_TYPES)
def test_reorder_select_and_repeat_follow_the_batch(attention_type):
    """After a prompt, reordering the cache as beam search does (rows swapped, one duplicated) and then
    decoding gives what the parallel form gives on the reordered sequences; so do selecting rows
    (batch_select_indices) and repeating them (batch_repeat_interleave)."""
    core = make_core(attention_type, causal=True)
    q, k, v = make_qkv(b=2, n=14)
    beams = torch.tensor([1, 0, 1])
    cache = EfficientCache.for_cores([core])
    decode(core, cache, q, k, v, 0, 9)
    cache.reorder_cache(beams)
    after = [decode(core, cache, *(t[beams] for t in (q, k, v)), t, t + 1).output for t in range(9, 14)]
    expected = core(q[beams], k[beams], v[beams], is_causal=True).output[:, :, 9:]
    torch.testing.assert_close(torch.cat(after, dim=2), expected, atol=1e-5, rtol=1e-5)

    cache = EfficientCache.for_cores([core])
    decode(core, cache, q, k, v, 0, 9)
    cache.batch_select_indices(torch.tensor([1]))
    cache.batch_repeat_interleave(2)
    rows = torch.tensor([1, 1])
    got = decode(core, cache, *(t[rows] for t in (q, k, v)), 9, 14).output
    expected = core(q[rows], k[rows], v[rows], is_causal=True).output[:, :, 9:]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert cache.get_seq_length() == 14


@pytest.mark.parametrize("attention_type", CAUSAL_TYPES)
def test_state_size_is_constant_for_recurrent_and_windowed_types(attention_type):
    """Bytes held after 40 and after 120 tokens: the same for the recurrent and windowed layers, three times
    as many for the key/value cache (it holds every token)."""
    core = make_core(attention_type, causal=True)
    q, k, v = make_qkv(b=1, n=120)
    cache = EfficientCache.for_cores([core])
    decode(core, cache, q, k, v, 0, 40)
    early = cache.nbytes
    for t in range(40, 120, 10):
        decode(core, cache, q, k, v, t, t + 1)
        decode(core, cache, q, k, v, t + 1, t + 10)
    layer = cache.layers[0]
    if type(layer) is KeyValueCacheLayer:
        assert cache.nbytes == 3 * early
    else:
        assert cache.nbytes == early > 0


def test_padded_steps_leave_a_recurrent_state_unchanged():
    core = make_core("linear", causal=True)
    q, k, v = make_qkv(b=2, n=6)
    cache = EfficientCache.for_cores([core])
    decode(core, cache, q, k, v, 0, 5)
    before = cache.layers[0].state[0].clone()
    mask = torch.tensor([[False], [True]])  # row 0's next token is padding
    out = core(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], attention_mask=mask, is_causal=True, cache=cache).output
    after = cache.layers[0].state[0]
    assert torch.equal(after[0], before[0]) and not torch.equal(after[1], before[1])
    assert (out[0] == 0).all()


def test_layers_refuse_what_they_cannot_do():
    recurrent, window = RecurrentStateLayer(), SlidingWindowCacheLayer(4)
    recurrent.store([torch.ones(2, 3)], num_tokens=5)
    recurrent.crop(0)  # rolling back nothing is fine (generate calls it)
    for layer in (recurrent, window):
        with pytest.raises(ValueError, match=r"cannot remove tokens \(crop\(-1\)\)"):
            layer.crop(-1)
        assert not layer.is_croppable
    with pytest.raises(TypeError, match="not keys and values"):
        recurrent.update(torch.zeros(1), torch.zeros(1))
    assert recurrent.get_seq_length() == 5 and recurrent.get_max_length() == -1
    recurrent.reset()
    assert recurrent.state is None and recurrent.get_seq_length() == 0
    with pytest.raises(ValueError, match="window must be >= 1"):
        SlidingWindowCacheLayer(0)


def test_key_value_layer_keeps_the_padding_of_its_keys():
    layer = KeyValueCacheLayer()
    key = torch.randn(2, 1, 3, 4)
    layer.update_with_mask(key, key, None)
    assert layer.key_mask is None  # nothing padded yet: no mask kept
    _, _, mask = layer.update_with_mask(key[:, :, :1], key[:, :, :1], torch.tensor([[True], [False]]))
    assert mask.tolist() == [[True] * 4, [True, True, True, False]]
    layer.reorder_cache(torch.tensor([1, 1]))
    assert layer.key_mask.tolist() == [[True, True, True, False]] * 2
    layer.crop(-2)
    assert layer.keys.shape[2] == 2 and layer.key_mask.shape == (2, 2)


def test_cache_belongs_to_its_model():
    linear, full = make_core("linear", causal=True), make_core("full", causal=True, layer_idx=1)
    with pytest.raises(ValueError, match="core 0 has layer_idx 1"):
        EfficientCache.for_cores([full])
    q, k, v = make_qkv(b=1, n=4)
    cache = EfficientCache.for_cores([linear])
    with pytest.raises(ValueError, match="none for layer_idx=1"):
        full(q, k, v, is_causal=True, cache=cache)
    with pytest.raises(
        TypeError, match="is a RecurrentStateLayer, but this core decodes from a KeyValueCacheLayer"
    ):
        make_core("full", causal=True)(q, k, v, is_causal=True, cache=cache)
    with pytest.raises(ValueError, match="call with is_causal=True"):
        linear(q, k, v, cache=cache)
    with pytest.raises(
        ValueError, match="nothing to cache for decoding. Causal attention types: full, linear"
    ):
        make_core("bigbird").new_cache_layer()


def test_full_prompt_builds_no_square_mask(monkeypatch):
    """full's prompt (nothing cached yet) goes through the parallel causal form: sdpa's causal kernel, no
    (n x n) mask, which a 64k-token prompt could not hold (16 GiB); later chunks mask (n x T) as they must."""
    from hf_efficient.attention import full as full_module

    built = []
    original = full_module._with_causal
    monkeypatch.setattr(full_module, "_with_causal", lambda *a: built.append(a[1:3]) or original(*a))
    core = make_core("full", causal=True)
    q, k, v = make_qkv(b=1, n=12)
    cache = EfficientCache.for_cores([core])
    decode(core, cache, q, k, v, 0, 8)
    assert built == []
    decode(core, cache, q, k, v, 8, 12)
    assert built == [(4, 12)]
