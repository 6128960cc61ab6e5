"""Pictures of attention: which patches one patch of a vision model attends to, as a PNG (matplotlib).

Only for attention types that form attention weights (``capabilities.output_attentions``: ``full``,
``swin_window``...); the others never build the matrix and raise with that explanation.
"""

from __future__ import annotations

from pathlib import Path

import torch


def patch_attention_map(model, pixel_values: torch.Tensor, patch: int | tuple[int, int], layer: int = -1):
    """Attention of one patch (averaged over heads) to every patch, as an (h, w) grid, plus its weight on the
    prefix tokens ([CLS]; DeiT's distillation token too).

    Args:
        model: an hf_efficient vision model (ViT, DeiT, DINOv2: the bare encoder or a task model).
        pixel_values: (1, C, H, W) one image, preprocessed.
        patch: the query patch, a flat index in row-major order or (row, column).
        layer: which layer's attention (Python indexing).

    Returns:
        (grid (h, w) float tensor, weight on the prefix tokens as a float).
    """
    encoder = model.base_model
    cores = encoder.attention_cores()
    if not cores[layer].capabilities.output_attentions:
        raise ValueError(
            f"{cores[layer].attention_type} never forms the attention matrix, so there is nothing to plot: "
            "output_attentions is not supported. Use a type that returns weights (full, swin_window)."
        )
    if pixel_values.dim() != 4 or pixel_values.shape[0] != 1:
        raise ValueError(f"pass one image of shape (1, C, H, W), got {tuple(pixel_values.shape)}.")
    p = encoder.config.patch_size
    h, w = pixel_values.shape[-2] // p, pixel_values.shape[-1] // p
    row, col = divmod(patch, w) if isinstance(patch, int) else patch
    if not (0 <= row < h and 0 <= col < w):
        raise ValueError(f"patch {patch} is outside the {h}x{w} patch grid.")
    with torch.no_grad():
        interpolate = (h, w) != encoder.config.grid_size
        weights = encoder(
            pixel_values, interpolate_pos_encoding=interpolate, output_attentions=True
        ).attentions
    prefix = encoder.config.num_prefix_tokens  # [CLS] (and DeiT's distillation token) before the patches
    query_row = weights[layer][0, :, prefix + row * w + col].mean(0)  # (P + h*w,): averaged over heads
    return query_row[prefix:].reshape(h, w).float(), float(query_row[:prefix].sum())  # (h*w,) -> (h, w)


def plot_patch_attention(
    model,
    pixel_values: torch.Tensor,
    patch: int | tuple[int, int],
    layer: int = -1,
    path: str | Path = "attention.png",
) -> Path:
    """Write a PNG: the image beside the attention map of ``patch`` (marked with a box) in ``layer``.

    Returns:
        the path written (its folder is created if missing).
    """
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    from matplotlib import pyplot as plt
    from matplotlib.patches import Rectangle

    grid, prefix_weight = patch_attention_map(model, pixel_values, patch, layer)
    h, w = grid.shape
    row, col = divmod(patch, w) if isinstance(patch, int) else patch
    image = pixel_values[0].detach().float()
    image = (image - image.min()) / (image.max() - image.min()).clamp_min(1e-8)  # to [0, 1] for display
    image = image.permute(1, 2, 0).squeeze(-1).numpy()  # (C, H, W) -> (H, W, C) or (H, W)

    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 4))
    left.imshow(image, cmap="gray" if image.ndim == 2 else None)
    p = pixel_values.shape[-1] // w
    left.add_patch(Rectangle((col * p - 0.5, row * p - 0.5), p, p, fill=False, edgecolor="red", linewidth=2))
    left.set_title("image, query patch in red")
    shown = right.imshow(grid.numpy(), cmap="viridis")
    right.add_patch(Rectangle((col - 0.5, row - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2))
    right.set_title(f"layer {layer} attention of patch ({row}, {col}); prefix tokens {prefix_weight:.2f}")
    fig.colorbar(shown, ax=right, fraction=0.046)
    for axis in (left, right):
        axis.set_xticks([])
        axis.set_yticks([])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)  # as save_pretrained does for its folder
    fig.savefig(path, dpi=80, bbox_inches="tight")
    plt.close(fig)
    return path
