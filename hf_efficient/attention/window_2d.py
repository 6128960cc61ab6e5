"""Shifted-window attention over a 2-D patch grid (Liu et al. 2021, Swin Transformer, section 3.2).

The patch grid (H x W) is cut into non-overlapping windows of M_h x M_w patches; each patch attends only to
the patches of its own window:

    Attention(Q_w, K_w, V_w) = softmax(Q_w K_w^T / sqrt(d) + M) V_w        for every window w

On odd layers (``spec.layer_idx`` odd) the grid is first rolled by (-M_h // 2, -M_w // 2) (Swin's cyclic
shift), so the windows straddle the previous layer's borders; the mask M keeps patches that the roll brought
together from different image regions apart (Swin's "attention mask for shifted windows"). Equivalently, in
image coordinates, row r of a layer with shift s falls into window floor((r - s) / M_h) (the tests' oracle).

Cost in n: O(n · (M_h·M_w + P) · d) time and memory for n patches, P prefix tokens; O(P · n · d) for the
prefix rows.

The reference (:meth:`SwinWindowAttention.reference`) computes exactly this: the grid gathered into windows
(:func:`window_plan`), one masked softmax per window. Its kernels
(:mod:`~hf_efficient.attention.kernels.window_2d`): ``"flex"``, the same windows as a FlexAttention block
mask (``"auto"`` takes it on CUDA where it can serve the call), and ``"native"``, the reference under the
name saved configs use for it.

How the grid reaches the core: the vision model passes ``grid_size = (H, W)`` and ``num_prefix_tokens``
(1 for ViT's [CLS]) in the call's ``AttentionInputs``, for the size of the current images. The sequence is
then ``num_prefix_tokens + H * W`` tokens: the prefix tokens first, then the patches in row-major order;
any other length raises. Deviations from the paper:

- Prefix tokens ([CLS], which Swin does not have) are global: they attend to every token, and every patch
  attends to them besides its window. Without that, ViT's [CLS] classification head would see only itself.
- A grid side not divisible by the window is padded inside (bottom/right) and the padding is masked out
  (Swin pads with zeros that do take part in attention). A side no larger than the window gets one window
  and no shift on that side (Swin does this for the whole layer when min(H, W) <= M).
- Only Swin's attention: no patch merging (hierarchy), the encoder stays a plain ViT at one resolution.
- No relative position bias table (Swin's B): the ViT encoders add absolute position embeddings instead.
- Without ``grid_size`` (a core used on its own, e.g. on a plain sequence) the sequence is taken as one
  row of n patches, i.e. 1-D non-overlapping windows of M_w tokens, shifted on odd layers.
- ``output_attentions`` scatters the window probabilities into a dense (b, h, n, n) matrix (O(n^2) memory,
  only when asked for).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
from torch.nn import functional as F

from .base import AttentionCapabilities, AttentionCore, AttentionOutput
from .config import AttentionConfig
from .dropout import fast_dropout
from .inputs import AttentionInputs, is_tracing
from .kernels.flex import BlockMaskCache
from .kernels.window_2d import WINDOW_KERNELS
from .registry import register_attention


@dataclass
class SwinWindowConfig(AttentionConfig):
    """Hyperparameters of ``swin_window``.

    Attributes:
        window_size: window side M in patches (int), or [M_h, M_w].
        shift_windows: shift the windows by half a window on odd layers (Swin's SW-MSA); False keeps every
            layer on the same windows.
    """

    window_size: int | list = 7
    shift_windows: bool = True

    def validate(self) -> None:
        sizes = self.window_size if isinstance(self.window_size, list | tuple) else [self.window_size]
        if len(sizes) not in (1, 2) or not all(isinstance(s, int) and s >= 1 for s in sizes):
            raise ValueError(
                f"window_size must be a positive int or [height, width], got {self.window_size!r}"
            )

    def window_hw(self) -> tuple[int, int]:
        if isinstance(self.window_size, list | tuple):
            return (self.window_size[0], self.window_size[-1])
        return (self.window_size, self.window_size)


@lru_cache(maxsize=64)
def window_plan(height: int, width: int, window: tuple[int, int], shift: tuple[int, int]):
    """Index maps of the shifted-window partition of a height x width grid (CPU tensors, cached).

    Returns:
        slot_token: (num_windows, M) int64, the row-major grid index of the patch in each window slot, or
            height * width for a slot of the inner padding.
        token_slot: (height * width,) int64, the flat slot (window * M + position) of every patch.
        same_region: (num_windows, M, M) bool, Swin's shifted-window mask: True where two slots come from the
            same image region (always True without shift).
    """
    (mh, mw), (sh, sw) = window, shift
    hp, wp = -(-height // mh) * mh, -(-width // mw) * mw  # padded grid, multiples of the window
    index = torch.full((hp, wp), height * width, dtype=torch.long)
    index[:height, :width] = torch.arange(height * width).view(height, width)
    index = torch.roll(index, shifts=(-sh, -sw), dims=(0, 1))  # Swin's cyclic shift
    # Regions of the rolled grid (Swin's img_mask): the last window row/column mixes wrapped-around patches.
    region = torch.zeros(hp, wp, dtype=torch.long)
    label = 0
    for rows in (slice(0, hp - mh), slice(hp - mh, hp - sh), slice(hp - sh, hp)):
        for cols in (slice(0, wp - mw), slice(wp - mw, wp - sw), slice(wp - sw, wp)):
            region[rows, cols] = label
            label += 1

    def partition(grid):  # (hp, wp) -> (num_windows, mh * mw)
        return grid.view(hp // mh, mh, wp // mw, mw).permute(0, 2, 1, 3).reshape(-1, mh * mw)

    slot_token, region = partition(index), partition(region)
    same_region = region[:, :, None] == region[:, None, :]  # (num_windows, M, M)
    flat = slot_token.reshape(-1)
    real = flat < height * width
    token_slot = torch.empty(height * width, dtype=torch.long)
    token_slot[flat[real]] = torch.arange(flat.numel())[real]
    return slot_token, token_slot, same_region


@register_attention("swin_window")
class SwinWindowAttention(AttentionCore):
    config_class = SwinWindowConfig
    kernels = WINDOW_KERNELS
    cross_attention_refusal = "its windows pair patches of one 2-D patch grid"
    capabilities = AttentionCapabilities(
        output_attentions=True, patch_grid=True, modalities=frozenset({"vision"})
    )
    paper = "Liu et al. 2021, Swin Transformer: Hierarchical Vision Transformer using Shifted Windows"
    cost = "O(n·M²)"
    summary = "2-D windows over the patch grid, shifted on odd layers, [CLS] global"
    small_config = {"window_size": 4}
    export_note = "the model's image size (the window plan is a constant of the graph)"
    script_configs = {
        "vision": {"attention_config": {"window_size": 4, "shift_windows": True}}
    }  # 7x7 patches

    def __init__(self, spec, config=None):
        super().__init__(spec, config)
        self.flex_masks = BlockMaskCache()  # FlexAttention masks of unpadded grids, rebuilt on demand

    @classmethod
    def forward_flops(cls, n, head_dim, config, num_edges=None):
        """4 n min(n, M_w) d: without a patch grid (as benchmarked) the sequence is one row of 1-D windows."""
        return 4.0 * n * min(n, config.window_hw()[-1]) * head_dim

    def layout(self, n: int, inputs: AttentionInputs) -> tuple[int, int, int]:
        """(prefix tokens P, grid height H, grid width W) of a sequence of n tokens; a mismatch raises."""
        if inputs.grid_size is None:
            return 0, 1, n  # a plain sequence: one row of n patches
        (height, width), prefix = inputs.grid_size, inputs.num_prefix_tokens
        if n != prefix + height * width:
            raise ValueError(
                f"{self.attention_type}: the patch grid {height}x{width} plus {prefix} prefix token(s) makes "
                f"{prefix + height * width} tokens, but the sequence has {n}. The sequence must be the "
                "prefix tokens followed by every patch in row-major order (a random subset of patches, as in "
                "MAE's encoder, has no grid); the vision models pass grid_size for each image size."
            )
        return prefix, height, width

    def window_and_shift(self, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """Window (M_h, M_w) clipped to the grid, and this layer's shift (half a window on odd layers)."""
        window = tuple(min(m, side) for m, side in zip(self.config.window_hw(), (height, width), strict=True))
        shifted = self.config.shift_windows and self.spec.layer_idx % 2 == 1
        shift = tuple(
            m // 2 if shifted and side > m else 0 for m, side in zip(window, (height, width), strict=True)
        )
        return window, shift

    def plan(self, n: int, inputs: AttentionInputs, device):
        """This call's prefix P, (H, W, window, shift), and :func:`window_plan`'s maps on ``device``."""
        prefix, height, width = self.layout(n, inputs)
        window, shift = self.window_and_shift(height, width)
        # While tracing, not through the cache: tensors made inside a trace are placeholders of that trace.
        make = window_plan.__wrapped__ if is_tracing() else window_plan
        maps = tuple(t.to(device) for t in make(height, width, window, shift))
        return prefix, (height, width, window, shift), maps

    def reference(self, query, key, value, inputs: AttentionInputs) -> AttentionOutput:
        """softmax(Q_w K_w^T / sqrt(d) + M) V_w in every window w (prefix tokens global); weights (b, h, n, n)
        scattered from the windows when asked for."""
        attention_mask = inputs.attention_mask
        b, h, n, d = query.shape
        prefix, _, (slot_token, token_slot, same_region) = self.plan(n, inputs, query.device)
        num_windows, m = slot_token.shape
        dropout = self.spec.dropout if self.training else 0.0
        real = attention_mask if attention_mask is not None else query.new_ones(b, n, dtype=torch.bool)

        def to_windows(x):  # (b, h, n, d) -> (b, h, num_windows, M, d), the inner padding slots zero
            grid = F.pad(x[:, :, prefix:], (0, 0, 0, 1))  # (b, h, H*W + 1, d): a zero row for padding slots
            return grid.index_select(2, slot_token.reshape(-1)).view(b, h, num_windows, m, d)

        q_win, k_win, v_win = to_windows(query), to_windows(key), to_windows(value)
        slot_real = F.pad(real[:, prefix:], (0, 1), value=False)[:, slot_token]  # (b, num_windows, M)
        allowed = same_region & slot_real[:, :, None, :]  # (b, num_windows, M, M)
        scores = (q_win @ k_win.transpose(-1, -2)) * self.scaling  # (b, h, num_windows, M, M)
        if prefix:
            k_pre, v_pre = key[:, :, :prefix], value[:, :, :prefix]  # (b, h, P, d)
            pre_scores = (q_win.view(b, h, -1, d) @ k_pre.transpose(-1, -2)) * self.scaling  # (b, h, nW*M, P)
            scores = torch.cat([scores, pre_scores.view(b, h, num_windows, m, prefix)], dim=-1)
            pre_real = real[:, None, None, :prefix].expand(b, num_windows, m, prefix)
            allowed = torch.cat([allowed, pre_real], dim=-1)  # (b, num_windows, M, M + P)
        scores = scores.masked_fill(~allowed[:, None], torch.finfo(scores.dtype).min)
        work = torch.promote_types(query.dtype, torch.float32)  # float32 for half inputs; float64 stays
        probs = torch.softmax(scores, dim=-1, dtype=work).to(query.dtype)
        probs = fast_dropout(probs, dropout, self.training)
        out_win = probs[..., :m] @ v_win  # (b, h, num_windows, M, d)
        if prefix:
            out_win = out_win + probs[..., m:] @ v_pre[:, :, None]
        out_grid = out_win.view(b, h, num_windows * m, d).index_select(2, token_slot)  # (b, h, H*W, d)
        out_pre = pre_probs = None
        if prefix:  # prefix queries attend to every real token
            pre_scores = (query[:, :, :prefix] @ key.transpose(-1, -2)) * self.scaling  # (b, h, P, n)
            pre_scores = pre_scores.masked_fill(~real[:, None, None, :], torch.finfo(pre_scores.dtype).min)
            pre_probs = torch.softmax(pre_scores, dim=-1, dtype=work).to(query.dtype)
            pre_probs = fast_dropout(pre_probs, dropout, self.training)
            out_pre = pre_probs @ value  # (b, h, P, d)
        output = out_grid if out_pre is None else torch.cat([out_pre, out_grid], dim=2)  # (b, h, n, d)
        weights = None
        if inputs.output_attentions:
            weights = self.dense_weights(probs, pre_probs, slot_token, prefix, n)
        return AttentionOutput(output, weights)

    @staticmethod
    def dense_weights(probs, pre_probs, slot_token, prefix: int, n: int) -> torch.Tensor:
        """Scatter window probabilities (b, h, num_windows, M, M + P) into a dense (b, h, n, n) matrix."""
        b, h, num_windows, m, _ = probs.shape
        dense = probs.new_zeros(b, h, n + 1, n + 1)  # row/column n collects the inner padding slots
        slots = prefix + slot_token  # sequence index of each slot; the padding slots land on n
        dense[:, :, slots[:, :, None], slots[:, None, :]] = probs[..., :m]
        if prefix:
            dense[:, :, slots[:, :, None], torch.arange(prefix, device=probs.device)] = probs[..., m:]
            dense[:, :, :prefix, :n] = pre_probs
        return dense[:, :, :n, :n]
