"""Longformer core: exact band/dilation/global pattern, exact limit, HF parity, config errors."""

from __future__ import annotations

import pytest
import torch

import hf_efficient.attention.kernels.longformer as longformer_kernels
from hf_efficient.attention import AttentionSpec, build_attention
from hf_efficient.attention.cache import EfficientCache
from hf_efficient.attention.relative import RelativePositions

from .helpers import (
    assert_dropout_only_in_training,
    make_core,
    make_qkv,
    reference_attention,
    relative_bias,
    relative_table,
)


def longformer_pattern(n: int, window: int, dilation: int, is_global: torch.Tensor) -> torch.Tensor:
    """(b, 1, n, n) allowed (query, key) pairs: |i - j| <= dilation * window / 2 on the dilation grid,
    plus global rows and columns."""
    diff = torch.arange(n)[None, :] - torch.arange(n)[:, None]  # key - query
    band = (diff.abs() <= dilation * (window // 2)) & (diff % dilation == 0)  # (n, n)
    allowed = band[None] | is_global[:, None, :] | is_global[:, :, None]  # (b, n, n)
    return allowed[:, None]


def padded_batch(n: int, seed: int = 0):
    q, k, v = make_qkv(b=2, n=n, seed=seed, requires_grad=True)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, n - 7 :] = False
    return q, k, v, mask


def assert_equals_pattern_reference(out, q, k, v, mask, allowed, rotary=None) -> None:
    """``out`` equals the dense oracle over the ``allowed`` pattern (padded rows 0), outputs and gradients;
    with ``rotary`` (RotaryPositions), on the rotated queries and keys."""
    rotated_q, rotated_k = (q, k) if rotary is None else (rotary.rotate(q), rotary.rotate(k))
    expected = reference_attention(rotated_q, rotated_k, v, mask, allowed=allowed)
    expected = expected.masked_fill(~mask[:, None, :, None], 0.0)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    weights = torch.randn_like(out)
    grads = torch.autograd.grad((out * weights).sum(), (q, k, v))
    expected_grads = torch.autograd.grad((expected * weights.double()).sum(), (q, k, v))
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, atol=1e-5, rtol=1e-5)


@pytest.fixture(params=["cpu_flash", "autograd_sdpa", "reference"])
def implementation(request, monkeypatch):
    """Run a test through the native kernel's fused-kernel autograd Function, through its plain-autograd
    fallback, and through the reference: the ``implementation`` to build the core with."""
    monkeypatch.setattr(longformer_kernels, "HAS_CPU_FLASH", request.param == "cpu_flash")
    return "reference" if request.param == "reference" else "native"


@pytest.mark.parametrize(
    ("n", "window", "dilation"),
    [
        (17, 6, 1),
        (23, 4, 1),
        (37, 6, 1),
        (50, 8, 1),
        (50, 4, 2),
        (23, 6, 3),
        (45, 6, 4),
        (40, 600, 1),
        (12, 16, 1),
    ],
)
def test_matches_band_reference_with_padding_and_globals(implementation, n, window, dilation):
    """Exact equality (outputs and gradients) with a dense oracle over the Longformer pattern; (12, 16)
    and (40, 600) are short enough for the native kernel's one dense masked call (n <= a chunk's keys),
    the band of (12, 16) still narrower than the sequence."""
    core = make_core(
        "longformer",
        attention_window=window,
        attention_dilation=dilation,
        global_token_indices=[0],
        implementation=implementation,
    )
    q, k, v, mask = padded_batch(n)
    global_mask = torch.zeros(2, n, dtype=torch.bool)
    global_mask[0, n - 2] = True  # near the end: inside some windows, far from others
    global_mask[1, 5] = True
    global_mask[1, n - 1] = True  # a padded token: never global
    out = core(q, k, v, attention_mask=mask, global_attention_mask=global_mask).output

    is_global = (global_mask | (torch.arange(n) == 0)) & mask
    assert_equals_pattern_reference(out, q, k, v, mask, longformer_pattern(n, window, dilation, is_global))


def test_large_window_three_block_reach(implementation):
    """A half-window above the 256-query chunk splits into several key blocks per side (j = 2)."""
    n, window = 640, 600
    core = make_core(
        "longformer", attention_window=window, global_token_indices=[], implementation=implementation
    )
    q, k, v = make_qkv(b=1, n=n, requires_grad=True)
    out = core(q, k, v).output
    expected = reference_attention(
        q, k, v, allowed=longformer_pattern(n, window, 1, torch.zeros(1, n).bool())
    )
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    grad_q, expected_grad = (torch.autograd.grad(t.sum(), q)[0] for t in (out, expected))
    torch.testing.assert_close(grad_q, expected_grad.float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("with_padding", [False, True])
def test_window_covering_sequence_equals_full(with_padding):
    n = 21
    core = make_core("longformer", attention_window=2 * n, global_token_indices=[])
    full = build_attention("full", AttentionSpec(2, 8)).eval()
    q, k, v, mask = padded_batch(n)
    mask = mask if with_padding else None
    torch.testing.assert_close(
        core(q, k, v, attention_mask=mask).output,
        full(q, k, v, attention_mask=mask).output,
        atol=1e-5,
        rtol=1e-5,
    )


def test_window_is_local_and_dilation_changes_the_pattern():
    """Sanity that the comparisons above are not vacuous: a narrow window differs from full attention,
    and dilation 2 differs from dilation 1."""
    q, k, v = make_qkv(b=1, n=30)
    narrow = make_core("longformer", attention_window=4, global_token_indices=[])(q, k, v).output
    dilated = make_core("longformer", attention_window=4, attention_dilation=2)(q, k, v).output
    full = build_attention("full", AttentionSpec(2, 8)).eval()(q, k, v).output
    assert (narrow - full).abs().max() > 1e-2
    assert (narrow - dilated).abs().max() > 1e-2


def test_global_by_index_equals_global_by_mask():
    n = 33
    q, k, v, mask = padded_batch(n)
    by_index = make_core("longformer", attention_window=6, global_token_indices=[0, 9])
    by_mask = make_core("longformer", attention_window=6, global_token_indices=[])
    global_mask = torch.zeros(2, n, dtype=torch.bool)
    global_mask[:, [0, 9]] = True
    expected = by_mask(q, k, v, attention_mask=mask, global_attention_mask=global_mask).output
    torch.testing.assert_close(by_index(q, k, v, attention_mask=mask).output, expected, atol=1e-6, rtol=1e-6)
    # ... and a global token changes the result of tokens far outside its window
    plain = by_mask(q, k, v, attention_mask=mask).output
    assert (plain[:, :, 20:] - expected[:, :, 20:]).abs().max() > 1e-3


def test_dropout_only_in_training():
    core = build_attention("longformer", AttentionSpec(2, 8, dropout=0.5), {"attention_window": 6})
    assert_dropout_only_in_training(core, *make_qkv(n=20))


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"attention_window": 5}, "attention_window"),
        ({"attention_window": 0}, "attention_window"),
        ({"attention_dilation": 0}, "attention_dilation"),
        ({"global_token_indices": [-1]}, "global_token_indices"),
    ],
)
def test_bad_config_raises(values, field):
    with pytest.raises(ValueError, match=field):
        build_attention("longformer", AttentionSpec(2, 8), values)


def test_global_index_past_sequence_raises():
    core = make_core("longformer", global_token_indices=[40])
    q, k, v = make_qkv(n=16)
    with pytest.raises(ValueError, match="global_token_indices"):
        core(q, k, v)


def test_parity_with_transformers_longformer_self_attention():
    """Same weights through transformers' LongformerSelfAttention (global projections tied to the local
    ones, as this core has no separate global projections) and through our projections + core."""
    modeling = pytest.importorskip("transformers.models.longformer.modeling_longformer")
    from transformers import LongformerConfig

    hidden, heads, window, n = 16, 2, 4, 20  # upstream needs n to be a multiple of attention_window
    config = LongformerConfig(
        hidden_size=hidden,
        num_attention_heads=heads,
        attention_window=[window],
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    layer = modeling.LongformerSelfAttention(config, layer_id=0).eval()
    for name in ("query", "key", "value"):
        getattr(layer, f"{name}_global").load_state_dict(getattr(layer, name).state_dict())

    hidden_states = torch.randn(2, n, hidden)
    real = torch.ones(2, n, dtype=torch.bool)
    real[1, 15:] = False
    is_global = torch.zeros(2, n, dtype=torch.bool)
    is_global[:, 0] = True
    is_global[1, 6] = True
    # Upstream's layer mask convention: -10000 padding, 0 local, +10000 global.
    layer_mask = torch.zeros(2, n).masked_fill(~real, -10000.0).masked_fill(is_global, 10000.0)
    with torch.no_grad():
        expected = layer(
            hidden_states,
            attention_mask=layer_mask,
            is_index_masked=~real,
            is_index_global_attn=is_global,
            is_global_attn=True,
        )[0]

        def heads_of(linear):  # (b, n, hidden) -> (b, n, heads, d) -> (b, heads, n, d)
            return linear(hidden_states).view(2, n, heads, hidden // heads).transpose(1, 2)

        core = build_attention(
            "longformer", AttentionSpec(heads, hidden // heads), {"attention_window": window}
        ).eval()
        out = core(
            heads_of(layer.query),
            heads_of(layer.key),
            heads_of(layer.value),
            attention_mask=real,
            global_attention_mask=is_global,
        ).output
    out = out.transpose(1, 2).reshape(2, n, hidden)  # (b, heads, n, d) -> (b, n, hidden)
    torch.testing.assert_close(out[real], expected[real], atol=1e-5, rtol=1e-5)
    assert (expected[~real] == 0).all() and (out[~real] == 0).all()


def causal_pattern(n: int, window: int, dilation: int) -> torch.Tensor:
    """(1, 1, n, n) allowed pairs of the causal form: keys i - t r, 0 <= t <= w (the whole window behind)."""
    behind = torch.arange(n)[:, None] - torch.arange(n)[None, :]  # query - key
    return ((behind >= 0) & (behind <= dilation * window) & (behind % dilation == 0))[None, None]


@pytest.mark.parametrize(
    ("n", "window", "dilation"), [(17, 6, 1), (37, 4, 1), (50, 4, 2), (45, 6, 4), (640, 300, 1), (12, 8, 1)]
)
def test_causal_matches_reference_with_padding(implementation, n, window, dilation):
    """The causal form: each token sees itself and the w earlier tokens of its residue, exactly (outputs and
    gradients), padding on the left and on the right; 300 keys behind a 256-query chunk need two blocks."""
    core = make_core(
        "longformer",
        causal=True,
        attention_window=window,
        attention_dilation=dilation,
        implementation=implementation,
    )
    q, k, v, mask = padded_batch(n)
    mask[0, :3] = False  # left padding in row 0, right padding in row 1
    out = core(q, k, v, attention_mask=mask, is_causal=True).output
    assert_equals_pattern_reference(out, q, k, v, mask, causal_pattern(n, window, dilation))


def test_causal_window_covering_sequence_equals_causal_full():
    core = make_core("longformer", causal=True, attention_window=64)
    q, k, v = make_qkv(b=2, n=40)
    expected = make_core("full")(q, k, v, is_causal=True).output
    torch.testing.assert_close(core(q, k, v, is_causal=True).output, expected, atol=1e-5, rtol=1e-5)


def test_causal_form_has_no_global_tokens():
    with pytest.raises(ValueError, match=r"global_token_indices=\[0\] in a causal model"):
        make_core("longformer", causal=True, global_token_indices=[0])
    core = make_core("longformer")  # bidirectional core (global token 0) called causally
    q, k, v = make_qkv(b=1, n=12)
    with pytest.raises(ValueError, match="causal form has no global tokens"):
        core(q, k, v, is_causal=True)


def test_decoding_keeps_only_the_window():
    """The cache holds the last w r keys whatever the context, and decoding matches the parallel form."""
    core = make_core("longformer", causal=True, attention_window=4, attention_dilation=2)
    q, k, v = make_qkv(b=1, n=30)
    expected = core(q, k, v, is_causal=True).output
    cache = EfficientCache.for_cores([core])
    steps = [core(q[:, :, :5], k[:, :, :5], v[:, :, :5], is_causal=True, cache=cache).output]
    for t in range(5, 30):
        one = slice(t, t + 1)
        steps.append(core(q[:, :, one], k[:, :, one], v[:, :, one], is_causal=True, cache=cache).output)
        assert cache.layers[0].keys.shape[2] == min(t + 1, 8)  # w r = 8 kept
    torch.testing.assert_close(torch.cat(steps, dim=2), expected, atol=1e-5, rtol=1e-5)
    assert cache.get_seq_length() == 30 and cache.nbytes == 2 * 8 * 2 * 8 * 4  # keys + values, float32


@pytest.mark.parametrize("flash", [True, False], ids=["cpu_flash", "autograd_sdpa"])
@pytest.mark.parametrize("causal", [False, True])
def test_native_equals_reference_over_several_chunk_groups(flash, causal, monkeypatch):
    """The native kernel sends chunks to the attention kernel in groups under a byte budget; lowered so
    that a short input spans several groups, its outputs and gradients (window keys accumulated across
    group boundaries, global keys summed over groups) still equal the reference's."""
    monkeypatch.setattr(longformer_kernels, "HAS_CPU_FLASH", flash)
    # one chunk per group: 8 groups of 4 queries (two-sided), 4 of 8 (causal) per residue
    monkeypatch.setattr(longformer_kernels, "GROUP_BYTES", 1)
    n, config = 61, {"attention_window": 8, "attention_dilation": 2}
    config["global_token_indices"] = [] if causal else [0, 33]
    q, k, v, mask = padded_batch(n)
    results = []
    for implementation in ("reference", "native"):
        core = make_core("longformer", causal=causal, implementation=implementation, **config)
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = core(*leaves, attention_mask=mask, is_causal=causal).output
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        results.append([out, *torch.autograd.grad((out * weights).sum(), leaves)])
    for want, got in zip(*results, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_auto_takes_the_native_kernel_on_cpu_and_the_reference_while_tracing(monkeypatch):
    """Today's choice: FlexAttention on CUDA only, so on CPU the native kernel, and while torch.export /
    torch.compile trace, the reference (one graph, no loop over chunk groups)."""
    import hf_efficient.attention.base as base_module

    core = make_core("longformer")
    q = make_qkv()[0]
    assert core.kernel_for(q, None) is longformer_kernels.NATIVE
    monkeypatch.setattr(base_module, "is_tracing", lambda: True)
    assert core.kernel_for(q, None) is None
    with pytest.raises(ValueError, match="cannot compute this call"):
        make_core("longformer", implementation="native").kernel_for(q, None)


@pytest.mark.parametrize("keys_too", [False, True])
@pytest.mark.parametrize(("n", "window", "dilation"), [(23, 4, 1), (50, 4, 2), (23, 6, 3)])
def test_relative_positions_over_the_band_and_the_global_tokens(n, window, dilation, keys_too):
    """BERT's relative position scores on every pair the pattern forms: window (dilated), global columns and
    rows, past the covered length: outputs and gradients equal the dense oracle with those scores; the
    kernels pass such calls to the reference, and a forced kernel says why it cannot take them."""
    core = make_core(
        "longformer", attention_window=window, attention_dilation=dilation, global_token_indices=[]
    )
    q, k, v, mask = padded_batch(n)
    global_mask = torch.zeros(2, n, dtype=torch.bool)
    global_mask[0, [0, n - 2]] = True
    global_mask[1, 5] = True
    table = relative_table()
    relative = RelativePositions(table, keys_too)
    out = core(q, k, v, attention_mask=mask, global_attention_mask=global_mask, relative_positions=relative)
    allowed = longformer_pattern(n, window, dilation, global_mask & mask)
    bias = relative_bias(table, q, k, keys_too)
    expected = reference_attention(q, k, v, mask, bias=bias, allowed=allowed)
    expected = expected.masked_fill(~mask[:, None, :, None], 0.0)
    torch.testing.assert_close(out.output.double(), expected, atol=1e-5, rtol=1e-5)
    weights = torch.randn_like(out.output)
    grads = torch.autograd.grad((out.output * weights).sum(), (q, k, v, table))
    expected_grads = torch.autograd.grad((expected * weights.double()).sum(), (q, k, v, table))
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad.double(), expected_grad.double(), atol=1e-5, rtol=1e-5)
    forced = make_core("longformer", attention_window=window, implementation="native")
    with pytest.raises(ValueError, match="'native' cannot compute this call: it adds no relative"):
        forced(q, k, v, relative_positions=relative)
