"""FlexAttention paths: the same pattern as each core's native path, and block masks that cover it exactly.

On CPU, FlexAttention runs its eager reference (forward only) and applies the token-level ``mask_mod`` to
every pair, ignoring which blocks the ``BlockMask`` keeps; so the outputs check the token pattern, and
:func:`check_blocks` checks the block-level pattern the CUDA kernel relies on: every block pair holding an
allowed (query, key) pair is kept, and blocks marked full hold only allowed pairs.
"""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

from hf_efficient.attention import AttentionInputs, AttentionSpec, build_attention
from hf_efficient.attention.kernels import bigbird as bigbird_module
from hf_efficient.attention.kernels import full as full_module
from hf_efficient.attention.kernels import longformer as longformer_module
from hf_efficient.attention.kernels import window_2d as window_module
from hf_efficient.attention.kernels.flex import FLEX_BLOCK, dense_pattern

from .helpers import make_qkv, padding_mask, reference_attention

MODULES = {"full": full_module, "longformer": longformer_module, "bigbird": bigbird_module}
MODULES["swin_window"] = window_module


@contextlib.contextmanager
def captured_block_masks(attention_type, monkeypatch):
    """Record every BlockMask the core hands to FlexAttention."""
    module, seen = MODULES[attention_type], []
    real = module.flex_attend

    def spy(query, key, value, mask, scale, score_mod=None):
        seen.append(mask)
        return real(query, key, value, mask, scale, score_mod)

    monkeypatch.setattr(module, "flex_attend", spy)
    yield seen


def dense_blocks(counts, indices):
    """(B, H, nq) counts and (B, H, nq, nk) indices -> (B, H, nq, nk) bool of the listed blocks."""
    listed = torch.arange(indices.shape[-1]) < counts[..., None].long()
    return torch.zeros(indices.shape, dtype=torch.bool).scatter_(-1, indices.long(), listed)


def check_blocks(mask, batch, heads, n, tight=True):
    """The block mask keeps every block pair that holds an allowed pair (exactly those when ``tight``),
    and its full blocks hold allowed pairs only."""
    allowed = dense_pattern(mask.mask_mod, batch, heads, n)  # (b, h, n, n)
    nb = -(-n // FLEX_BLOCK)
    pad = (0, nb * FLEX_BLOCK - n, 0, nb * FLEX_BLOCK - n)
    blocks = (batch, heads, nb, FLEX_BLOCK, nb, FLEX_BLOCK)
    any_allowed = torch.nn.functional.pad(allowed, pad).view(blocks).any(-1).any(-2)
    all_allowed = torch.nn.functional.pad(allowed, pad, value=True).view(blocks).all(-1).all(-2)
    kept = mask.to_dense().bool().expand(batch, heads, nb, nb)
    assert (kept | ~any_allowed).all(), "a block holding allowed pairs is dropped"
    if tight:
        assert torch.equal(kept, any_allowed), "blocks without an allowed pair are computed"
    if mask.full_kv_num_blocks is not None:
        full = dense_blocks(mask.full_kv_num_blocks, mask.full_kv_indices).expand(batch, heads, nb, nb)
        assert (all_allowed | ~full).all(), "a block marked full holds pairs that are not allowed"


def both_paths(attention_type, config=None, heads=2, head_dim=8, layer_idx=1):
    spec = AttentionSpec(heads, head_dim, layer_idx=layer_idx)
    cores = []
    for implementation in ("native", "flex"):
        settings = {**(config or {}), "implementation": implementation}
        cores.append(build_attention(attention_type, spec, settings).eval())
    return cores


CASES = [
    ("longformer", {"attention_window": 64}, {}),
    ("longformer", {"attention_window": 300, "global_token_indices": [0, 130]}, {}),
    ("longformer", {"attention_window": 32, "attention_dilation": 3}, {}),
    ("bigbird", {"block_size": 64}, {}),
    ("bigbird", {"block_size": 48, "num_random_blocks": 2}, {}),
    ("bigbird", {"block_size": 256}, {}),
    ("swin_window", {"window_size": 4}, {"grid_size": (20, 20), "num_prefix_tokens": 1}),
    ("swin_window", {"window_size": [3, 5]}, {"grid_size": (13, 17), "num_prefix_tokens": 1}),
]


# The edit loop (`make test-fast`) checks one layout per type here, padded and not; the others (globals,
# dilation, random blocks, a block past the sequence, a rectangular window) are `slow` (make test): each
# type's flex kernel against its reference, padding included, is test_kernels.py's in the fast loop too.
FAST_LAYOUTS = {0, 3, 6}
LAYOUTS = [
    pytest.param(*case, marks=() if i in FAST_LAYOUTS else pytest.mark.slow) for i, case in enumerate(CASES)
]


@pytest.mark.parametrize(("attention_type", "config", "grid"), LAYOUTS)
@pytest.mark.parametrize("padded", [False, True])
def test_flex_equals_native_with_the_same_layout(attention_type, config, grid, padded, monkeypatch):
    native, flex = both_paths(attention_type, config)
    n = 1 + grid["grid_size"][0] * grid["grid_size"][1] if grid else 700
    q, k, v = make_qkv(b=2, n=n)
    extra = dict(grid, attention_mask=padding_mask([n, n - 150], n) if padded else None)
    with torch.no_grad(), captured_block_masks(attention_type, monkeypatch) as masks:
        expected = native(q, k, v, **extra).output
        got = flex(q, k, v, **extra).output
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert len(masks) == 1
    check_blocks(masks[0], 2, masks[0].kv_num_blocks.shape[1], n, tight=not padded)


def test_longformer_per_example_global_tokens_on_flex(monkeypatch):
    native, flex = both_paths("longformer", {"attention_window": 16})
    q, k, v = make_qkv(b=2, n=400)
    is_global = torch.zeros(2, 400, dtype=torch.bool)
    is_global[0, [5, 300]], is_global[1, 390] = True, True
    extra = dict(attention_mask=padding_mask([400, 395], 400), global_attention_mask=is_global)
    with torch.no_grad(), captured_block_masks("longformer", monkeypatch) as masks:
        torch.testing.assert_close(flex(q, k, v, **extra).output, native(q, k, v, **extra).output)
    check_blocks(masks[0], 2, 1, 400, tight=False)


@pytest.mark.parametrize(
    "config", [{"attention_window": 64}, {"attention_window": 32, "attention_dilation": 3}]
)
@pytest.mark.parametrize("padded", [False, True])
def test_causal_longformer_on_flex(config, padded, monkeypatch):
    """The causal window (w earlier keys) as a block mask: key blocks at or before the query's only."""
    native, flex = both_paths("longformer", config)
    q, k, v = make_qkv(b=2, n=700)
    extra = dict(attention_mask=padding_mask([700, 550], 700) if padded else None, is_causal=True)
    with torch.no_grad(), captured_block_masks("longformer", monkeypatch) as masks:
        expected = native(q, k, v, **extra).output
        got = flex(q, k, v, **extra).output
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    check_blocks(masks[0], 2, 1, 700, tight=not padded)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias_shape", [None, (1, 1), (2, 3)])
def test_full_on_flex_honours_padding_causal_and_per_head_bias(causal, bias_shape, monkeypatch):
    """transformers' own flex function reads the padding mask per query and the bias of head 0 only."""
    b, h, n = 2, 3, 300
    q, k, v = make_qkv(b=b, h=h, n=n)
    mask = padding_mask([n, 200], n)
    bias = None if bias_shape is None else torch.randn(*bias_shape, n, n)
    sdpa = build_attention("full", AttentionSpec(h, 8)).eval()
    flex = build_attention("full", AttentionSpec(h, 8, attn_implementation="flex_attention")).eval()
    extra = dict(attention_mask=mask, attention_bias=bias, is_causal=causal)
    with torch.no_grad(), captured_block_masks("full", monkeypatch) as masks:
        got = flex(q, k, v, **extra).output
    expected = reference_attention(q, k, v, mask=mask, bias=bias, causal=causal).float()
    expected = expected.masked_fill(~mask[:, None, :, None], 0.0)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, sdpa(q, k, v, **extra).output, atol=1e-5, rtol=1e-5)
    check_blocks(masks[0], b, 1, n, tight=False)


def test_full_model_on_flex_attention_with_padding():
    """A text model switched to flex_attention gives sdpa's outputs on a padded batch (it crashed before)."""
    from hf_efficient import EfficientBertConfig, EfficientBertModel

    config = EfficientBertConfig(
        vocab_size=60, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32
    )
    model = EfficientBertModel(config).eval()
    ids = torch.randint(0, 60, (2, 11))
    mask = torch.tensor([[1] * 11, [1] * 7 + [0] * 4])
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).last_hidden_state
        model.set_attn_implementation("flex_attention")
        got = model(ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], atol=1e-5, rtol=1e-5)


def _longformer(implementation: str = "auto", dropout: float = 0.0):
    spec = AttentionSpec(2, 4, dropout=dropout)
    return build_attention("longformer", spec, {"implementation": implementation})


def _kernel(core, query) -> str | None:
    kernel = core.kernel_for(query, AttentionInputs())
    return None if kernel is None else kernel.name


def test_path_choice():
    q = torch.randn(1, 2, 8, 4)
    assert _kernel(_longformer("auto"), q) == "native"  # the native path stays the default on CPU
    assert _kernel(_longformer("native"), q) == "native"
    assert _kernel(_longformer("flex"), q) == "flex"
    assert _kernel(_longformer("reference"), q) is None
    with pytest.raises(ValueError, match="no attention dropout"):
        _kernel(_longformer("flex", dropout=0.1).train(), q)
    with pytest.raises(ValueError, match="no CPU backward"):
        _kernel(_longformer("flex"), q.requires_grad_())
    with pytest.raises(ValueError, match="implementation must be one of"):
        build_attention("longformer", AttentionSpec(2, 8), {"implementation": "triton"})


def test_small_heads_on_cuda_take_the_native_path():
    """FlexAttention's CUDA kernel needs head_dim >= 16 (Inductor refuses fewer): "auto" takes the native
    path there, a forced "flex" says so at the call instead of failing inside the compiler."""

    def cuda_query(head_dim: int):  # what the kernels' predicates read of a CUDA query (none exists here)
        return types.SimpleNamespace(
            is_cuda=True, device=torch.device("cuda"), shape=(1, 2, 8, head_dim), requires_grad=False
        )

    assert _kernel(_longformer("auto"), cuda_query(8)) == "native"
    assert _kernel(_longformer("auto"), cuda_query(16)) == "flex"
    with pytest.raises(ValueError, match="head size of at least 16, got head_dim=8"):
        _kernel(_longformer("flex"), cuda_query(8))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(("attention_type", "config", "grid"), CASES)
def test_auto_takes_flex_on_cuda_and_matches_native(attention_type, config, grid, monkeypatch):
    """On CUDA "auto" runs FlexAttention's compiled kernel (block sparsity applied), forward and backward,
    equal to the native path on the same layout."""
    # head size 16: FlexAttention's CUDA kernels want at least 16
    native, auto = (core.cuda() for core in both_paths(attention_type, config, head_dim=16))
    auto.config.implementation = "auto"
    n = 1 + grid["grid_size"][0] * grid["grid_size"][1] if grid else 1000
    q, k, v = (t.cuda().requires_grad_() for t in make_qkv(b=2, n=n, d=16))
    extra = dict(grid, attention_mask=padding_mask([n, n - 150], n).cuda())
    with captured_block_masks(attention_type, monkeypatch) as masks:
        got = auto(q, k, v, **extra).output
    assert len(masks) == 1  # it did take the flex path
    expected = native(q, k, v, **extra).output
    torch.testing.assert_close(got, expected, atol=2e-3, rtol=2e-3)  # TF32 / fused-kernel rounding
    grads = torch.autograd.grad(got.square().sum(), (q, k, v))
    want = torch.autograd.grad(expected.square().sum(), (q, k, v))
    for g, w in zip(grads, want, strict=True):
        torch.testing.assert_close(g, w, atol=5e-3, rtol=5e-3)
