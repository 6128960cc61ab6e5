"""Kernels of ``swin_window``: the shifted windows as one FlexAttention block mask, and ``"native"``.

``flex``: every patch attends to the patches of its window (and, on shifted layers, of its image region),
prefix tokens are global, as in the reference; the token-level pattern is a ``mask_mod`` over the window
plan, the block-level pattern is reduced from it (images have at most a few thousand patches). ``"auto"``
takes it on CUDA (:data:`~.flex.FLEX_DEVICES`) where FlexAttention can serve the call (no dropout, no
weights, head size).

``native``: the windowed softmax of the reference itself, under the name saved configs use for it
(``implementation="native"`` forced the windowed path before the reference/kernel split).
"""

from __future__ import annotations

from ..base import AttentionOutput, Kernel
from .flex import (
    FLEX_DEVICES,
    BlockMask,
    dense_pattern,
    flex_attend,
    flex_block_mask,
    flex_unsupported,
    reduce_dense,
)


def flex_attend_windows(core, query, key, value, inputs) -> AttentionOutput:
    """The reference's windows through FlexAttention: (b, h, n, d); no weights."""
    n = query.shape[-2]
    prefix, layout, (_, token_slot, same_region) = core.plan(n, inputs, query.device)
    real = inputs.attention_mask  # (b, n) bool or None
    mask = core.flex_masks.get(
        (n, prefix, *layout, str(query.device)) if real is None else None,  # unpadded: one mask per grid
        lambda: window_mask(n, real, prefix, token_slot, same_region),
    )
    return AttentionOutput(flex_attend(query, key, value, mask, core.scaling), None)


def window_mask(n, real, prefix, token_slot, same_region) -> BlockMask:
    """The windows as one FlexAttention block mask (batch dimension: real's, or 1).

    Patch p sits in window token_slot[p] // M at position token_slot[p] % M; two patches attend to each
    other when they share a window and (shifted layers) an image region; prefix tokens are global. The
    block-level pattern comes from the token pattern.
    """
    b, m = 1 if real is None else real.shape[0], same_region.shape[-1]
    window_of, position = token_slot // m, token_slot % m  # (H*W,) each

    def mask_mod(batch, head, q, k):
        qp, kp = (q - prefix).clamp(min=0), (k - prefix).clamp(min=0)  # grid indices (prefix: unused)
        same = (window_of[qp] == window_of[kp]) & same_region[window_of[qp], position[qp], position[kp]]
        allowed = same | (q < prefix) | (k < prefix)
        return allowed & real[batch, k] if real is not None else allowed

    partial, full = reduce_dense(dense_pattern(mask_mod, b, 1, n, same_region.device))
    return flex_block_mask(partial, mask_mod, n, full=full)


def native_attend(core, query, key, value, inputs) -> AttentionOutput:
    """The windowed softmax: the reference."""
    return core.reference(query, key, value, inputs)


def _never(core, query, inputs) -> bool:  # "auto" falls back to the reference itself
    return False


WINDOW_KERNELS = (
    Kernel("flex", flex_attend_windows, flex_unsupported, traces=True, devices=FLEX_DEVICES),
    Kernel("native", native_attend, chosen=_never, traces=True),
)

__all__ = ["WINDOW_KERNELS", "flex_attend_windows", "native_attend", "window_mask"]
