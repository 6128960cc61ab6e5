"""swin_window: shifted 2-D windows against a hand-written oracle, the exact limit, grid errors."""

from __future__ import annotations

import functools

import pytest
import torch

from hf_efficient.attention import AttentionInputs, AttentionSpec, build_attention

from .helpers import make_qkv, reference_attention


def make_swin(grid, prefix=1, window=2, layer_idx=0, shift=True, heads=2, head_dim=8):
    """A swin_window core called on a patch grid (the inputs a vision model passes): core(q, k, v, ...)."""
    spec = AttentionSpec(num_heads=heads, head_dim=head_dim, layer_idx=layer_idx)
    core = build_attention("swin_window", spec, {"window_size": window, "shift_windows": shift}, "vision")
    return functools.partial(core.eval(), grid_size=grid, num_prefix_tokens=prefix)


def swin_pattern(grid, prefix, window, shift):
    """(n, n) bool allowed pattern, written in image coordinates independently of the core's roll+mask.

    Patch (r, c) of a layer with shift (s_h, s_w) lies in window (floor((r - s_h) / M_h), floor((c - s_w) /
    M_w)): rolling by -s, cutting M-windows and masking the wrapped-around regions apart is that partition.
    Prefix tokens are global.
    """
    (height, width), (mh, mw), (sh, sw) = grid, window, shift
    rows, cols = torch.arange(height).repeat_interleave(width), torch.arange(width).repeat(height)
    win_r = torch.div(rows - sh, mh, rounding_mode="floor")
    win_c = torch.div(cols - sw, mw, rounding_mode="floor")
    same = (win_r[:, None] == win_r[None]) & (win_c[:, None] == win_c[None])
    n = prefix + height * width
    allowed = torch.ones(n, n, dtype=torch.bool)
    allowed[prefix:, prefix:] = same
    return allowed


@pytest.mark.parametrize(
    ("grid", "window", "layer_idx", "prefix"),
    [((4, 4), 2, 0, 1), ((4, 4), 2, 1, 1), ((6, 5), 2, 1, 1), ((5, 7), 3, 1, 2), ((4, 6), [2, 3], 1, 0)],
)
def test_matches_shifted_window_oracle(grid, window, layer_idx, prefix):
    core = make_swin(grid, prefix, window, layer_idx)
    mh, mw = (window, window) if isinstance(window, int) else window
    shifted = layer_idx % 2 == 1
    shift = (mh // 2 if shifted else 0, mw // 2 if shifted else 0)
    n = prefix + grid[0] * grid[1]
    q, k, v = make_qkv(b=2, n=n)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, -3:] = False  # some patches marked as padding must be ignored as keys
    out = core(q, k, v, attention_mask=mask, output_attentions=True)
    allowed = swin_pattern(grid, prefix, (mh, mw), shift)
    expected = reference_attention(q, k, v, mask=mask, allowed=allowed[None, None]).float()
    expected = expected.masked_fill(~mask[:, None, :, None], 0.0)
    torch.testing.assert_close(out.output, expected, atol=1e-5, rtol=1e-5)
    # the dense weights are the same softmax: zero outside the pattern, rows of real queries sum to 1
    assert out.weights.shape == (2, 2, n, n)
    real_rows = out.weights[1][:, mask[1]]  # (h, real queries, n)
    assert (real_rows[:, :, ~mask[1]] == 0).all()
    assert (out.weights[0][:, ~allowed] == 0).all()
    torch.testing.assert_close(out.weights[0].sum(-1), torch.ones(2, n))


def test_shift_changes_windows_on_odd_layers_only():
    q, k, v = make_qkv(b=1, n=17)
    even, odd = make_swin((4, 4), layer_idx=2), make_swin((4, 4), layer_idx=3)
    unshifted = make_swin((4, 4), layer_idx=3, shift=False)
    assert torch.equal(even(q, k, v).output, unshifted(q, k, v).output)
    assert not torch.allclose(even(q, k, v).output, odd(q, k, v).output)


@pytest.mark.parametrize("layer_idx", [0, 1])
def test_one_window_covering_the_grid_is_full_attention(layer_idx):
    """Exact limit: a window as large as the grid (so no shift either) equals exact attention."""
    core = make_swin((3, 4), prefix=1, window=4, layer_idx=layer_idx)
    full = build_attention("full", AttentionSpec(num_heads=2, head_dim=8, attn_implementation="eager")).eval()
    q, k, v = make_qkv(b=2, n=13)
    mask = torch.ones(2, 13, dtype=torch.bool)
    mask[1, 10:] = False
    torch.testing.assert_close(
        core(q, k, v, attention_mask=mask).output,
        full(q, k, v, attention_mask=mask).output,
        atol=1e-6,
        rtol=1e-5,
    )
    got, want = core(q, k, v, output_attentions=True).weights, full(q, k, v, output_attentions=True).weights
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_grid_must_match_sequence_length():
    core = make_swin((4, 4), prefix=1)
    q, k, v = make_qkv(b=1, n=10)  # e.g. [CLS] + 9 visible patches of MAE's encoder
    with pytest.raises(ValueError, match="patch grid 4x4 plus 1 prefix token"):
        core(q, k, v)


def test_invalid_grid_or_window_raise():
    with pytest.raises(ValueError, match="grid_size"):
        AttentionInputs(grid_size=(0, 4))
    with pytest.raises(ValueError, match="window_size"):
        make_swin((4, 4), window=0)
    with pytest.raises(ValueError, match="not available for text"):
        build_attention("swin_window", AttentionSpec(2, 8), None, "text")


def test_without_grid_a_sequence_is_one_row():
    """A core used on a plain sequence (no grid_size) sees one row of n patches: 1-D windows."""
    core = build_attention("swin_window", AttentionSpec(num_heads=2, head_dim=8), {"window_size": 4}).eval()
    q, k, v = make_qkv(b=1, n=10)
    allowed = swin_pattern((1, 10), 0, (1, 4), (0, 0))
    expected = reference_attention(q, k, v, allowed=allowed).float()
    torch.testing.assert_close(core(q, k, v).output, expected, atol=1e-5, rtol=1e-5)


def test_each_call_follows_its_own_grid():
    """One core serves images of several sizes: the grid comes with each call, the spec never changes."""
    core = build_attention("swin_window", AttentionSpec(2, 8), {"window_size": 2}, "vision").eval()
    spec = core.spec
    for grid in [(2, 2), (4, 4), (3, 5)]:
        n = 1 + grid[0] * grid[1]
        q, k, v = make_qkv(b=1, n=n)
        expected = reference_attention(q, k, v, allowed=swin_pattern(grid, 1, (2, 2), (0, 0))).float()
        out = core(q, k, v, grid_size=grid, num_prefix_tokens=1).output
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert core.spec is spec


def test_backward_and_dropout_in_training():
    spec = AttentionSpec(num_heads=2, head_dim=8, dropout=0.5, layer_idx=1)
    core = build_attention("swin_window", spec, {"window_size": 2}, "vision").train()
    q, k, v = make_qkv(b=2, n=17, requires_grad=True)
    grid = AttentionInputs(grid_size=(4, 4), num_prefix_tokens=1)
    out = core(q, k, v, grid).output
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0 for t in (q, k, v))


@pytest.mark.parametrize("implementation", ["auto", "reference", "native", "flex"])
def test_saved_implementations_load(implementation):
    """Configs saved before the reference/kernel split name "native" or "flex"; both still load."""
    core = build_attention("swin_window", AttentionSpec(2, 8), {"implementation": implementation}, "vision")
    assert core.config.implementation == implementation
    assert "implementation" in core.config.to_dict()


def test_auto_computes_the_windowed_reference_on_cpu():
    """On the CPU "auto" runs the windowed softmax itself (FlexAttention only on CUDA), with or without
    gradients; a forced "flex" there runs forward only."""
    q = make_qkv(b=1, n=17)[0]
    grid = AttentionInputs(grid_size=(4, 4), num_prefix_tokens=1)
    core = build_attention("swin_window", AttentionSpec(2, 8), {"window_size": 2}, "vision").eval()
    assert core.kernel_for(q, grid) is None and core.kernel_for(q.requires_grad_(), grid) is None
    flex = build_attention("swin_window", AttentionSpec(2, 8), {"implementation": "flex"}, "vision")
    with pytest.raises(ValueError, match="no CPU backward"):
        flex.kernel_for(q, grid)
