"""What every vision family shares: patch embeddings, prefix tokens and position embeddings, the checks of
the images and of ``bool_masked_pos``, and the bare encoder's forward; a family (ViT, DeiT, DINOv2) states
only what differs: its embeddings (DeiT's distillation token, DINOv2's always-resized positions), its layers,
its pooled output.

A family's bare model is ``class EfficientXModel(EfficientXPreTrainedModel, EfficientVisionModel)`` with its
``embeddings_class`` (and ``layer_class`` when its layers are not ViT's, ``pooler_class`` when its pooler is
not ViT's); its task models are in :mod:`hf_efficient.models.vision.tasks`. Every family's layers live under
``encoder.layer.N`` and its final norm is ``layernorm``, as in its checkpoints. Attention types that attend
by 2-D position (``swin_window``) get the patch grid of the current images and the number of prefix tokens
before it in the call's ``AttentionInputs``.

Shapes: b = batch, C = channels, H x W = image size, p = patch size, h x w = patch grid, N = h * w,
P = prefix tokens, D = hidden_size.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn
from transformers import AutoModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.utils.generic import can_return_tuple

from ...errors import InputError
from ...modeling.blocks import EfficientEncoder, EfficientPreNormLayer
from ...modeling.checks import check_binary_mask, check_float_input, check_not_empty
from ...modeling.memory import CompactDropout
from ...modeling.pretrained import EfficientPreTrainedModel


def check_pixel_values(owner: str, pixel_values: torch.Tensor | None, config) -> None:
    """What every vision model's forward takes: (b, C, H, W) floating, finite images with ``num_channels``
    channels, at least one image, each side a positive multiple of ``patch_size``."""
    if pixel_values is None:
        raise ValueError(f"{owner}: pixel_values (batch, num_channels, height, width) is required.")
    channels, p = config.num_channels, config.patch_size
    if pixel_values.dim() != 4 or pixel_values.shape[1] != channels:
        raise ValueError(
            f"{owner}: pixel_values must have shape (batch, num_channels={channels}, height, width), got "
            f"{tuple(pixel_values.shape)}. Convert the images (PIL .convert('L') for 1 channel, "
            "EfficientViTImageProcessor does it) or build the model with the right num_channels."
        )
    check_not_empty(owner, "pixel_values", pixel_values.shape, "batch, num_channels, height, width")
    height, width = pixel_values.shape[-2:]
    if height % p or width % p:
        raise ValueError(
            f"{owner}: the image size {height}x{width} is not a multiple of patch_size={p}. Resize the "
            "images (the image processor does)."
        )
    fix = (
        "Pass finite, normalised float pixels: the output of the model's image processor "
        "(EfficientViTImageProcessor), not raw 0-255 integers."
    )
    check_float_input(owner, "pixel_values", pixel_values, fix)


class EfficientPatchEmbeddings(nn.Module):
    """Non-overlapping p x p patches -> D by one strided convolution (``patch_embeddings.projection``)."""

    def __init__(self, config):
        super().__init__()
        self.num_channels, self.patch_size = config.num_channels, config.patch_size
        self.projection = nn.Conv2d(
            config.num_channels, config.hidden_size, config.patch_size, config.patch_size
        )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(b, C, H, W) images, as checked by :func:`check_pixel_values` -> (b, N, D) patch embeddings."""
        projection = self.projection(pixel_values.to(self.projection.weight.dtype))  # (b, D, h, w)
        return projection.flatten(2).transpose(1, 2)  # (b, D, h, w) -> (b, N, D)


class EfficientVisionEmbeddings(nn.Module):
    """The prefix tokens ([CLS]; a family adds its own), the patch embeddings and learned position embeddings
    (one row per prefix token, then one per patch of the grid at ``image_size``).

    A family states what differs: :meth:`prefix_tokens` (DeiT's distillation token), :meth:`resize_positions`
    (DINOv2 resizes in float32), ``always_interpolate`` (DINOv2 fits its table to every image, with no
    ``interpolate_pos_encoding`` flag), ``mask_token_shape`` (DINOv2's is (1, D)).

    Args:
        use_mask_token: a learned ``mask_token`` that replaces the patches ``bool_masked_pos`` marks (masked
            image modeling).
    """

    always_interpolate: ClassVar[bool] = False
    mask_token_shape: ClassVar[tuple[int, ...]] = (1, 1)  # the mask token is (*shape, D)

    def __init__(self, config, use_mask_token: bool = False):
        super().__init__()
        self.config = config
        dim = config.hidden_size
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.mask_token = nn.Parameter(torch.zeros(*self.mask_token_shape, dim)) if use_mask_token else None
        self.patch_embeddings = EfficientPatchEmbeddings(config)
        self.position_embeddings = nn.Parameter(torch.zeros(1, config.max_position_embeddings, dim))
        self.dropout = CompactDropout(config.hidden_dropout_prob)

    def prefix_tokens(self, batch: int) -> torch.Tensor:
        """(b, P, D): the tokens before the patches, [CLS] here."""
        return self.cls_token.expand(batch, -1, -1)

    def position_table(self, grid: tuple[int, int]) -> torch.Tensor:
        """(1, P + h * w, D) positions for a patch grid: the stored table at the config's grid, otherwise its
        patch rows resized to the grid (:meth:`resize_positions`) after the prefix rows, unchanged."""
        if grid == self.config.grid_size:
            return self.position_embeddings
        prefix = self.config.num_prefix_tokens
        prefix_rows, patch_rows = self.position_embeddings[:, :prefix], self.position_embeddings[:, prefix:]
        native_h, native_w = self.config.grid_size
        patch_rows = patch_rows.reshape(1, native_h, native_w, -1).permute(0, 3, 1, 2)  # (1, D, h0, w0)
        patch_rows = self.resize_positions(patch_rows, grid)  # (1, D, h, w)
        patch_rows = patch_rows.permute(0, 2, 3, 1).reshape(1, grid[0] * grid[1], -1)  # (1, h*w, D)
        return torch.cat([prefix_rows, patch_rows], dim=1)

    def resize_positions(self, patch_rows: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """(1, D, h0, w0) -> (1, D, h, w), bicubic without corner alignment, as transformers' ViT and DeiT."""
        return nn.functional.interpolate(patch_rows, size=grid, mode="bicubic", align_corners=False)

    def forward(
        self,
        pixel_values: torch.Tensor,
        interpolate_pos_encoding: bool = False,
        bool_masked_pos: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[int, int]]:
        """Returns the (b, P + N, D) embeddings and the patch grid (h, w); the patches ``bool_masked_pos``
        (b, N) marks (as checked by ``EfficientVisionModel.forward``) become the mask token."""
        patches = self.patch_embeddings(pixel_values)  # (b, N, D)
        if bool_masked_pos is not None:
            masked = bool_masked_pos.bool()[..., None]  # (b, N, 1)
            patches = torch.where(masked, self.mask_token.to(patches.dtype), patches)
        p = self.config.patch_size
        grid = (pixel_values.shape[-2] // p, pixel_values.shape[-1] // p)
        if grid != self.config.grid_size and not (interpolate_pos_encoding or self.always_interpolate):
            size = self.config.image_size
            raise ValueError(
                f"The image size {tuple(pixel_values.shape[-2:])} does not match the model's {size}x{size}. "
                "Resize the images (the image processor does), or pass interpolate_pos_encoding=True to "
                "resize the position embeddings."
            )
        tokens = torch.cat([self.prefix_tokens(patches.shape[0]), patches], dim=1)  # (b, P + N, D)
        return self.dropout(tokens + self.position_table(grid)), grid


class EfficientVisionPooler(nn.Module):
    """ViT's and DeiT's pooler: act(W h_0) on [CLS] (``pooler_act``, ``pooler_output_size``)."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.pooler_output_size or config.hidden_size)
        self.activation = ACT2FN[config.pooler_act]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(hidden_states[:, 0]))  # (b, P + N, D) -> (b, D')


class EfficientVisionPreTrainedModel(EfficientPreTrainedModel):
    """Base of every vision family's models: images in, the shared initialisation of the embeddings."""

    main_input_name = "pixel_values"
    input_modalities = ("image",)
    _no_split_modules = ["EfficientPreNormLayer"]

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, EfficientVisionEmbeddings):
            self._init_embeddings(module)

    def _init_embeddings(self, module: EfficientVisionEmbeddings) -> None:
        """ViT's: truncated normal prefix tokens and positions, a zero mask token."""
        std = self.config.initializer_range
        init.trunc_normal_(module.position_embeddings, mean=0.0, std=std)
        init.trunc_normal_(module.cls_token, mean=0.0, std=std)
        if module.mask_token is not None:
            init.zeros_(module.mask_token)


class EfficientVisionModel(EfficientVisionPreTrainedModel):
    """The bare encoder of a vision family: embeddings, the layers (``encoder.layer.N``), the final
    ``layernorm``; hidden states (b, P + N, D) and the family's pooled output (:meth:`pool`).

    Args:
        add_pooling_layer: build the family's pooler (``pooler_class``; ViT's and DeiT's act(W h_0)).
        use_mask_token: a mask token for ``bool_masked_pos`` (masked image modeling).
        embedding_options: options of the family's embeddings (ViT-MAE's ``fixed_positions``).
    """

    auto_class = AutoModel
    embeddings_class: ClassVar[type[EfficientVisionEmbeddings]] = EfficientVisionEmbeddings
    layer_class: ClassVar[type[nn.Module]] = EfficientPreNormLayer
    pooler_class: ClassVar[type[nn.Module] | None] = EfficientVisionPooler

    def __init__(
        self, config, add_pooling_layer: bool = True, use_mask_token: bool = False, **embedding_options
    ):
        super().__init__(config)
        self.embeddings = self.embeddings_class(config, use_mask_token=use_mask_token, **embedding_options)
        self.encoder = EfficientEncoder(config, self.layer_class)
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        building = add_pooling_layer and self.pooler_class is not None
        self.pooler = self.pooler_class(config) if building else None
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.patch_embeddings

    def pool(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        """The pooled output of the final hidden states (b, P + N, D): the pooler's, None without one."""
        return self.pooler(hidden_states) if self.pooler is not None else None

    def encode(self, embeddings, grid, output_attentions, output_hidden_states) -> BaseModelOutputWithPooling:
        """Run the layers on (b, n, D) embeddings; ``grid`` is the patch grid of the sequence, or None when
        the tokens are not the prefix tokens then every patch in order (MAE's visible subset)."""
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        inputs = self.attention_inputs(
            *embeddings.shape[:2],
            output_attentions=output_attentions,
            grid_size=grid,
            num_prefix_tokens=self.config.num_prefix_tokens if grid is not None else 0,
        )
        last, all_hidden, all_attentions = self.encoder(embeddings, inputs, output_hidden_states)
        last = self.layernorm(last)
        return BaseModelOutputWithPooling(
            last_hidden_state=last,
            pooler_output=self.pool(last),
            hidden_states=all_hidden,
            attentions=all_attentions,
        )

    def check_bool_masked_pos(self, bool_masked_pos: torch.Tensor, pixel_values: torch.Tensor) -> None:
        """A (b, N) 0/1 mask over the patches of ``pixel_values``, for a model with a mask token."""
        owner = type(self).__name__
        if self.embeddings.mask_token is None:
            raise InputError(
                f"{owner}: bool_masked_pos replaces patches by a mask token, which this model was built "
                "without. Use the family's ForMaskedImageModeling model, or build the model with "
                "use_mask_token=True."
            )
        p = self.config.patch_size
        shape = (pixel_values.shape[0], (pixel_values.shape[-2] // p) * (pixel_values.shape[-1] // p))
        fix = "It marks the masked patches, row by row over the patch grid: 1 (True) = masked, 0 = seen."
        check_binary_mask(owner, "bool_masked_pos", bool_masked_pos, shape, "(batch, num_patches)", fix)

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        bool_masked_pos: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
    ) -> BaseModelOutputWithPooling:
        """Encode a batch of images.

        Args:
            pixel_values: (b, C, H, W) images at ``config.image_size`` (the image processor's output).
            bool_masked_pos: (b, N) 1 (True) for the patches to replace by the mask token (a model with a
                mask token).
            interpolate_pos_encoding: accept another image size (a multiple of the patch size) by resizing
                the position embeddings (DINOv2 always does).
        """
        check_pixel_values(type(self).__name__, pixel_values, self.config)
        if bool_masked_pos is not None:
            self.check_bool_masked_pos(bool_masked_pos, pixel_values)
        # (b, P + N, D)
        embeddings, grid = self.embeddings(pixel_values, bool(interpolate_pos_encoding), bool_masked_pos)
        return self.encode(embeddings, grid, output_attentions, output_hidden_states)
