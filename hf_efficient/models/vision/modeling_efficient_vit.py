"""EfficientViT: ViT and ViT-MAE with any registered vision attention; only what is visual lives here.

The layers are the shared pre-LayerNorm blocks (:class:`hf_efficient.modeling.blocks.EfficientPreNormLayer`)
with ViT's parameter names (``vit.encoder.layer.N.attention.attention.query``, ``layernorm_before`` ...), so
ViT and ViT-MAE checkpoints load without renaming; transformers 5 writes ViT-MAE's decoder layers as
``decoder.decoder_encoder.layer.N``, which ``EfficientViTMAEForPreTraining.from_pretrained`` maps back to
``decoder.decoder_layers.N`` (the layout of the published MAE checkpoints). Attention types that attend by
2-D position (``swin_window``) get the patch grid of the current images in the call's ``AttentionInputs``.

Shapes: b = batch, C = channels, H x W = image size, p = patch size, h x w = patch grid, N = h * w,
D = hidden_size.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import (
    AutoModel,
    AutoModelForImageClassification,
    AutoModelForMaskedImageModeling,
    AutoModelForPreTraining,
)
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    ImageClassifierOutput,
    MaskedImageModelingOutput,
)
from transformers.models.vit_mae.modeling_vit_mae import (
    ViTMAEForPreTrainingOutput,
    build_2d_sinusoidal_position_embedding,
)
from transformers.utils.generic import can_return_tuple

from ...attention.inputs import AttentionInputs
from ...compat import loaded_from_checkpoint
from ...errors import InputError
from ...modeling.blocks import CompactDropout, EfficientEncoder, EfficientPreNormLayer, check_heads_divide
from ...modeling.checks import check_binary_mask, check_float_input, check_not_empty, checking_values
from ...modeling.heads import classification_loss
from ...modeling.pretrained import EfficientPreTrainedModel
from .configuration_efficient_vit import EfficientViTConfig


def sincos_position_table(height: int, width: int, dim: int) -> torch.Tensor:
    """MAE's fixed 2-D sin-cos table (1, 1 + h * w, dim): a zero row for [CLS], then the patches.

    The layout is that of the published MAE checkpoints ([sin_w | cos_w | sin_h | cos_h], as transformers).
    """
    table = build_2d_sinusoidal_position_embedding(height, width, embed_dim=dim, cls_token=True)
    half = dim // 2
    return torch.cat([table[:, half:], table[:, :half]], dim=-1)[None]  # (1, 1 + h*w, dim)


class EfficientViTPatchEmbeddings(nn.Module):
    """Non-overlapping p x p patches -> D by one strided convolution (ViT's ``patch_embeddings``)."""

    def __init__(self, config: EfficientViTConfig):
        super().__init__()
        self.num_channels, self.patch_size = config.num_channels, config.patch_size
        self.projection = nn.Conv2d(
            config.num_channels, config.hidden_size, config.patch_size, config.patch_size
        )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(b, C, H, W) images, as checked by :func:`check_pixel_values` -> (b, N, D) patch embeddings."""
        projection = self.projection(pixel_values.to(self.projection.weight.dtype))  # (b, D, h, w)
        return projection.flatten(2).transpose(1, 2)  # (b, D, h, w) -> (b, N, D)


def check_pixel_values(owner: str, pixel_values: torch.Tensor | None, config: EfficientViTConfig) -> None:
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


class EfficientViTEmbeddings(nn.Module):
    """[CLS] + patch embeddings + position embeddings (learned for ViT, fixed 2-D sin-cos for MAE).

    Args:
        fixed_positions: MAE's embeddings: a fixed sin-cos table (no gradient) and no dropout.
        use_mask_token: a learned ``mask_token`` that replaces the patches ``bool_masked_pos`` marks
            (masked image modeling, as ViT's).
    """

    def __init__(
        self, config: EfficientViTConfig, fixed_positions: bool = False, use_mask_token: bool = False
    ):
        super().__init__()
        self.config, self.fixed_positions = config, fixed_positions
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.hidden_size))
        self.mask_token = nn.Parameter(torch.zeros(1, 1, config.hidden_size)) if use_mask_token else None
        self.patch_embeddings = EfficientViTPatchEmbeddings(config)
        table = torch.zeros(1, config.max_position_embeddings, config.hidden_size)
        self.position_embeddings = nn.Parameter(table, requires_grad=not fixed_positions)
        # ViT-MAE's embeddings have no dropout (its layers do).
        self.dropout = nn.Identity() if fixed_positions else CompactDropout(config.hidden_dropout_prob)

    def position_table(self, grid: tuple[int, int]) -> torch.Tensor:
        """(1, 1 + h * w, D) positions for a grid: the stored table at the config's size; otherwise the
        sin-cos table rebuilt for the grid (MAE) or the learned one resized bicubically (ViT, as transformers
        does)."""
        if grid == self.config.grid_size:
            return self.position_embeddings
        if self.fixed_positions:
            table = sincos_position_table(*grid, self.position_embeddings.shape[-1])
            return table.to(self.position_embeddings)
        cls_row, patch_rows = self.position_embeddings[:, :1], self.position_embeddings[:, 1:]
        native_h, native_w = self.config.grid_size
        patch_rows = patch_rows.reshape(1, native_h, native_w, -1).permute(0, 3, 1, 2)  # (1, D, h0, w0)
        patch_rows = nn.functional.interpolate(patch_rows, size=grid, mode="bicubic", align_corners=False)
        patch_rows = patch_rows.permute(0, 2, 3, 1).reshape(1, grid[0] * grid[1], -1)  # (1, h*w, D)
        return torch.cat([cls_row, patch_rows], dim=1)

    def forward(
        self,
        pixel_values: torch.Tensor,
        interpolate_pos_encoding: bool = False,
        bool_masked_pos: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[int, int]]:
        """Returns the (b, 1 + N, D) embeddings and the patch grid (h, w); the patches ``bool_masked_pos``
        (b, N) marks (as checked by ``EfficientViTModel.forward``) become the mask token."""
        patches = self.patch_embeddings(pixel_values)  # (b, N, D)
        if bool_masked_pos is not None:
            masked = bool_masked_pos.bool()[..., None]  # (b, N, 1)
            patches = torch.where(masked, self.mask_token.to(patches.dtype), patches)
        p = self.config.patch_size
        grid = (pixel_values.shape[-2] // p, pixel_values.shape[-1] // p)
        if grid != self.config.grid_size and not interpolate_pos_encoding:
            size = self.config.image_size
            raise ValueError(
                f"The image size {tuple(pixel_values.shape[-2:])} does not match the model's {size}x{size}. "
                "Resize the images (the image processor does), or pass interpolate_pos_encoding=True to "
                "resize the position embeddings."
            )
        cls = self.cls_token.expand(patches.shape[0], -1, -1)  # (b, 1, D)
        embeddings = torch.cat([cls, patches], dim=1) + self.position_table(grid)  # (b, 1 + N, D)
        return self.dropout(embeddings), grid


class EfficientViTPooler(nn.Module):
    """ViT's pooler: act(W h_0) on [CLS] (``pooler_act``, ``pooler_output_size``)."""

    def __init__(self, config: EfficientViTConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.pooler_output_size or config.hidden_size)
        self.activation = ACT2FN[config.pooler_act]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(hidden_states[:, 0]))  # (b, 1 + N, D) -> (b, D')


class EfficientViTPreTrainedModel(EfficientPreTrainedModel):
    config_class = EfficientViTConfig
    base_model_prefix = "vit"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    _no_split_modules = ["EfficientPreNormLayer"]

    @torch.no_grad()
    def _init_weights(self, module):
        """ViT's init (truncated normal [CLS] and positions, or the sin-cos table when
        ``position_embedding_init="sincos"``); MAE's (sin-cos tables, xavier patches)."""
        super()._init_weights(module)
        std = self.config.initializer_range
        if isinstance(module, EfficientViTEmbeddings) and module.mask_token is not None:
            init.zeros_(module.mask_token)
        if isinstance(module, EfficientViTEmbeddings) and module.fixed_positions:
            init.copy_(
                module.position_embeddings,
                sincos_position_table(*self.config.grid_size, module.cls_token.shape[-1]),
            )
            weight = module.patch_embeddings.projection.weight
            if not loaded_from_checkpoint(weight):  # a view loses the "loaded" flag
                init.xavier_uniform_(weight.view(weight.shape[0], -1))  # as nn.Linear, like MAE
            init.normal_(module.cls_token, std=std)
        elif isinstance(module, EfficientViTEmbeddings):
            if self.config.position_embedding_init == "sincos":  # learned, starting from MAE's table
                table = sincos_position_table(*self.config.grid_size, module.cls_token.shape[-1])
                init.copy_(module.position_embeddings, table)
            else:
                init.trunc_normal_(module.position_embeddings, mean=0.0, std=std)
            init.trunc_normal_(module.cls_token, mean=0.0, std=std)
        elif isinstance(module, EfficientViTMAEDecoder):
            init.copy_(
                module.decoder_pos_embed,
                sincos_position_table(*self.config.grid_size, module.mask_token.shape[-1]),
            )
            init.normal_(module.mask_token, std=std)


class EfficientViTModel(EfficientViTPreTrainedModel):
    """The bare encoder: final-LayerNorm hidden states (b, 1 + N, D) and, optionally, ViT's pooled [CLS]."""

    auto_class = AutoModel

    def __init__(
        self,
        config: EfficientViTConfig,
        add_pooling_layer: bool = True,
        fixed_positions: bool = False,
        use_mask_token: bool = False,
    ):
        super().__init__(config)
        self.embeddings = EfficientViTEmbeddings(config, fixed_positions, use_mask_token)
        self.encoder = EfficientEncoder(config, EfficientPreNormLayer)
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.pooler = EfficientViTPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.patch_embeddings

    def encode(self, embeddings, grid, output_attentions, output_hidden_states) -> BaseModelOutputWithPooling:
        """Run the layers on (b, n, D) embeddings; ``grid`` is the patch grid of the sequence, or None when
        the tokens are not [CLS] + every patch in order (MAE's visible subset)."""
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        inputs = self.attention_inputs(
            *embeddings.shape[:2],
            output_attentions=output_attentions,
            grid_size=grid,
            num_prefix_tokens=1 if grid is not None else 0,  # [CLS] before the patches
        )
        last, all_hidden, all_attentions = self.encoder(embeddings, inputs, output_hidden_states)
        last = self.layernorm(last)
        return BaseModelOutputWithPooling(
            last_hidden_state=last,
            pooler_output=self.pooler(last) if self.pooler is not None else None,
            hidden_states=all_hidden,
            attentions=all_attentions,
        )

    def check_bool_masked_pos(self, bool_masked_pos: torch.Tensor, pixel_values: torch.Tensor) -> None:
        """A (b, N) 0/1 mask over the patches of ``pixel_values``, for a model with a mask token."""
        owner = type(self).__name__
        if self.embeddings.mask_token is None:
            raise InputError(
                f"{owner}: bool_masked_pos replaces patches by a mask token, which this model does not have. "
                "Use EfficientViTForMaskedImageModeling, or EfficientViTModel(config, use_mask_token=True)."
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
            bool_masked_pos: (b, N) 1 (True) for the patches to replace by the mask token (a model built with
                ``use_mask_token=True``).
            interpolate_pos_encoding: accept another image size (a multiple of the patch size) by resizing
                the position embeddings.
        """
        check_pixel_values(type(self).__name__, pixel_values, self.config)
        if bool_masked_pos is not None:
            self.check_bool_masked_pos(bool_masked_pos, pixel_values)
        # (b, 1 + N, D)
        embeddings, grid = self.embeddings(pixel_values, bool(interpolate_pos_encoding), bool_masked_pos)
        return self.encode(embeddings, grid, output_attentions, output_hidden_states)


class EfficientViTForImageClassification(EfficientViTPreTrainedModel):
    """Final-LayerNorm [CLS] -> linear (ViT's head); single-label, multi-label or regression."""

    auto_class = AutoModelForImageClassification

    def __init__(self, config: EfficientViTConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.vit = EfficientViTModel(config, add_pooling_layer=False)
        self.classifier = (
            nn.Linear(config.hidden_size, config.num_labels) if config.num_labels else nn.Identity()
        )
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
    ) -> ImageClassifierOutput:
        outputs = self.vit(
            pixel_values,
            interpolate_pos_encoding=interpolate_pos_encoding,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        logits = self.classifier(outputs.last_hidden_state[:, 0])  # (b, num_labels)
        loss = None
        if labels is not None and not self.config.num_labels:
            raise ValueError(
                f"{type(self).__name__}: num_labels=0 builds no classifier (the logits are the [CLS] "
                "features), so labels cannot be scored. Load the model with num_labels set to the number of "
                "classes."
            )
        if labels is not None:
            loss = classification_loss(self.config, logits, labels, owner=type(self).__name__)
        return ImageClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class EfficientViTForMaskedImageModeling(EfficientViTPreTrainedModel):
    """Masked image modeling as transformers' ``ViTForMaskedImageModeling`` (SimMIM, Xie et al. 2021): the
    patches ``bool_masked_pos`` marks are replaced by a learned mask token, and every patch's final hidden
    state goes through a 1x1 convolution to ``encoder_stride**2 * num_channels`` values and a PixelShuffle
    (``decoder.0``, ``decoder.1``) back to pixels; the loss is the L1 error over the masked pixels.

    Unlike MAE the encoder sees every patch on the full grid, so every vision attention type serves it
    (``swin_window`` included).
    """

    auto_class = AutoModelForMaskedImageModeling

    def __init__(self, config: EfficientViTConfig):
        super().__init__(config)
        self.vit = EfficientViTModel(config, add_pooling_layer=False, use_mask_token=True)
        stride = config.encoder_stride
        self.decoder = nn.Sequential(
            nn.Conv2d(config.hidden_size, stride**2 * config.num_channels, kernel_size=1),
            nn.PixelShuffle(stride),
        )
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        bool_masked_pos: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
    ) -> MaskedImageModelingOutput:
        """Args:
        pixel_values: (b, C, H, W).
        bool_masked_pos: (b, N) 1 (True) = masked patch, row by row over the patch grid; with it, the loss.

        Returns:
            ``MaskedImageModelingOutput``: ``reconstruction`` (b, C, h * s, w * s), s = ``encoder_stride``
            (the image size when s = patch_size); ``loss``, with ``bool_masked_pos``, the mean absolute error
            over the masked pixels and channels.
        """
        config = self.config
        if bool_masked_pos is not None and config.patch_size != config.encoder_stride:
            raise InputError(
                f"{type(self).__name__}: bool_masked_pos needs a reconstruction of the image's size, but "
                f"encoder_stride={config.encoder_stride} makes each patch of patch_size={config.patch_size} "
                "another size. Build the model with encoder_stride equal to patch_size."
            )
        outputs = self.vit(
            pixel_values,
            bool_masked_pos=bool_masked_pos,
            interpolate_pos_encoding=interpolate_pos_encoding,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        b, _, height, width = pixel_values.shape
        h, w, p = height // config.patch_size, width // config.patch_size, config.patch_size
        patches = outputs.last_hidden_state[:, 1:]  # (b, N, D), [CLS] dropped
        grid_features = patches.transpose(1, 2).contiguous().unflatten(2, (h, w))  # (b, D, h, w)
        reconstruction = self.decoder(grid_features)  # (b, C, h * s, w * s)
        loss = None
        if bool_masked_pos is not None:
            # (b, N) -> (b, 1, H, W): each patch's flag over its p x p pixels
            mask = bool_masked_pos.reshape(b, 1, h, 1, w, 1).expand(-1, -1, -1, p, -1, p)
            mask = mask.reshape(b, 1, height, width).to(reconstruction.dtype)
            error = (pixel_values.to(reconstruction.dtype) - reconstruction).abs()  # (b, C, H, W)
            loss = (error * mask).sum() / (mask.sum() + 1e-5) / config.num_channels
        return MaskedImageModelingOutput(
            loss=loss,
            reconstruction=reconstruction,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class EfficientViTMAEDecoder(nn.Module):
    """MAE's light decoder: visible tokens + mask tokens back in image order, sin-cos positions, a few layers
    (``decoder_*`` sizes, the config's ``attention_type``), then a linear map to p * p * C pixels per patch.

    Parameter names are those of the published MAE checkpoints (``decoder.decoder_layers.N``). Cross-layer
    attention sharing (Linformer's ``sharing="layerwise"``) applies to the encoder only: each decoder layer
    keeps its own attention parameters.
    """

    def __init__(self, config: EfficientViTConfig):
        super().__init__()
        check_heads_divide(config.decoder_hidden_size, config.decoder_num_attention_heads, "decoder_")
        decoder_config = copy.deepcopy(config)
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
            setattr(decoder_config, name, getattr(config, f"decoder_{name}"))
        decoder_config.layer_attention_types = decoder_config.layer_attention_configs = None
        self.config = decoder_config
        hidden = config.decoder_hidden_size
        self.decoder_embed = nn.Linear(config.hidden_size, hidden)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, hidden))
        table = torch.zeros(1, config.max_position_embeddings, hidden)
        self.decoder_pos_embed = nn.Parameter(table, requires_grad=False)  # fixed 2-D sin-cos
        self.decoder_layers = nn.ModuleList(
            EfficientPreNormLayer(decoder_config, i) for i in range(config.decoder_num_hidden_layers)
        )
        self.decoder_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.decoder_pred = nn.Linear(hidden, config.patch_size**2 * config.num_channels)

    def forward(
        self, latent: torch.Tensor, ids_restore: torch.Tensor, grid: tuple[int, int], inputs: AttentionInputs
    ) -> torch.Tensor:
        """(b, 1 + kept, D) encoder output -> (b, N, p * p * C) predicted pixels of every patch; ``inputs``
        are those of the (b, 1 + N) decoder sequence: [CLS] and the full grid."""
        hidden_states = self.decoder_embed(latent)  # (b, 1 + kept, D_dec)
        b, n_kept, dim = hidden_states.shape
        masks = self.mask_token.expand(b, ids_restore.shape[1] + 1 - n_kept, dim)  # (b, N - kept, D_dec)
        shuffled = torch.cat([hidden_states[:, 1:], masks], dim=1)  # (b, N, D_dec), in noise order
        unshuffled = torch.gather(shuffled, 1, ids_restore[..., None].expand(-1, -1, dim))  # image order
        hidden_states = torch.cat([hidden_states[:, :1], unshuffled], dim=1)  # (b, 1 + N, D_dec)
        if grid == self.config.grid_size:
            positions = self.decoder_pos_embed
        else:
            positions = sincos_position_table(*grid, dim).to(self.decoder_pos_embed)
        hidden_states = hidden_states + positions
        for layer in self.decoder_layers:
            hidden_states, _ = layer(hidden_states, inputs)
        return self.decoder_pred(self.decoder_norm(hidden_states))[:, 1:]  # drop [CLS]: (b, N, p*p*C)


class EfficientViTMAEForPreTraining(EfficientViTPreTrainedModel):
    """Masked autoencoder (He et al. 2021): encode a random ``1 - mask_ratio`` of the patches, reconstruct
    the pixels of the others; the loss is the mean squared error on the masked patches only.

    The encoder runs on the visible patches in a random order, which has no patch grid: attention types
    that attend by 2-D position (``swin_window``) raise there; they can still serve the decoder
    (``attention_type``) with other types in the encoder (``layer_attention_types``).
    """

    auto_class = AutoModelForPreTraining

    # transformers 5 saves ViTMAEForPreTraining's decoder layers under this name (see the module docstring).
    _decoder_key_mapping = {r"^decoder\.decoder_encoder\.layer\.": "decoder.decoder_layers."}

    def __init__(self, config: EfficientViTConfig):
        super().__init__(config)
        self.vit = EfficientViTModel(config, add_pooling_layer=False, fixed_positions=True)
        self.decoder = EfficientViTMAEDecoder(config)
        self.post_init()
        self.check_encoder_attention()
        config.kept_patches(config.max_position_embeddings - 1)  # mask_ratio keeps a patch of the native grid

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' ``from_pretrained``, also reading ViT-MAE checkpoints written by transformers 5."""
        kwargs.setdefault("key_mapping", cls._decoder_key_mapping)
        return super().from_pretrained(*args, **kwargs)

    def tracing_blockers(self) -> list[str]:
        return [
            *super().tracing_blockers(),
            "EfficientViTMAEForPreTraining masks a random subset of the patches on every call (a training "
            "objective, not a served model): export its encoder instead, e.g. "
            "EfficientViTModel.from_pretrained(folder) or an image classifier fine-tuned from it.",
        ]

    def check_encoder_attention(self) -> None:
        for core in self.vit.attention_cores():
            if core.capabilities.patch_grid:
                raise ValueError(
                    f"{core.attention_type} attends by 2-D patch position, but MAE's encoder sees a random "
                    "subset of the patches in random order. Use another type in the encoder "
                    f"(layer_attention_types) and keep attention_type={core.attention_type!r} for the "
                    "decoder, which sees the full grid."
                )

    def patchify(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(b, C, H, W) -> (b, N, p * p * C), the patch pixels in MAE's order (row, column, channel)."""
        b, c, height, width = pixel_values.shape
        p = self.config.patch_size
        patches = pixel_values.reshape(b, c, height // p, p, width // p, p)  # (b, C, h, p, w, p)
        return patches.permute(0, 2, 4, 3, 5, 1).reshape(b, (height // p) * (width // p), p * p * c)

    def unpatchify(self, patches: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """(b, N, p * p * C) -> (b, C, H, W), the inverse of :meth:`patchify` (grid (h, w): native one)."""
        (h, w), p, c = grid or self.config.grid_size, self.config.patch_size, self.config.num_channels
        images = patches.reshape(patches.shape[0], h, w, p, p, c)  # (b, N, p*p*C) -> (b, h, w, p, p, C)
        images = images.permute(0, 5, 1, 3, 2, 4)  # (b, C, h, p, w, p)
        return images.reshape(patches.shape[0], c, h * p, w * p)

    def random_masking(self, tokens: torch.Tensor, noise: torch.Tensor | None = None):
        """Keep the ``1 - mask_ratio`` patches with the smallest noise (transformers' ViTMAE, same outputs).

        Args:
            tokens: (b, N, D) patch embeddings.
            noise: optional (b, N) values in any range; random when None.
        Returns:
            kept (b, kept, D), mask (b, N) with 1 = masked, ids_restore (b, N).
        """
        b, n, dim = tokens.shape
        owner = type(self).__name__
        if noise is None:
            noise = torch.rand(b, n, device=tokens.device)
        elif noise.shape != (b, n):
            raise ValueError(
                f"{owner}: noise must have shape (batch, num_patches) = {(b, n)}, got {tuple(noise.shape)}."
            )
        elif checking_values() and noise.is_floating_point() and not bool(torch.isfinite(noise).all()):
            raise ValueError(
                f"{owner}: noise holds NaN or infinite values, which give no order to keep patches by; pass "
                "finite noise (torch.rand(batch, num_patches))."
            )
        n_keep = self.config.kept_patches(n)  # raises when mask_ratio would keep no patch of n
        ids_shuffle = torch.argsort(noise.to(tokens.device), dim=1)  # ascending: smallest noise kept
        ids_restore = torch.argsort(ids_shuffle, dim=1)
        ids_keep = ids_shuffle[:, :n_keep]
        kept = torch.gather(tokens, 1, ids_keep[..., None].expand(-1, -1, dim))  # (b, kept, D)
        mask = torch.ones(b, n, device=tokens.device)
        mask[:, :n_keep] = 0
        return kept, torch.gather(mask, 1, ids_restore), ids_restore

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        noise: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
    ) -> ViTMAEForPreTrainingOutput:
        """Args:
        pixel_values: (b, C, H, W).
        noise: optional (b, N) masking noise (the patches with the smallest values are kept), for
            reproducible masks.
        """
        check_pixel_values(type(self).__name__, pixel_values, self.config)
        self.check_encoder_attention()
        embeddings, grid = self.vit.embeddings(pixel_values, bool(interpolate_pos_encoding))  # (b, 1 + N, D)
        b = embeddings.shape[0]
        kept, mask, ids_restore = self.random_masking(embeddings[:, 1:], noise)
        embeddings = torch.cat([embeddings[:, :1], kept], dim=1)  # (b, 1 + kept, D)
        outputs = self.vit.encode(embeddings, None, output_attentions, output_hidden_states)
        # The decoder sees [CLS] and every patch in order: the full grid, on the model's current kernel.
        decoder_inputs = self.attention_inputs(
            b, 1 + ids_restore.shape[1], grid_size=grid, num_prefix_tokens=1
        )
        logits = self.decoder(outputs.last_hidden_state, ids_restore, grid, decoder_inputs)  # (b, N, p*p*C)
        target = self.patchify(pixel_values.to(logits.dtype))
        if self.config.norm_pix_loss:  # normalise each patch's pixels (MAE's per-patch normalised target)
            target = (target - target.mean(-1, keepdim=True)) / (target.var(-1, keepdim=True) + 1.0e-6) ** 0.5
        loss = ((logits - target) ** 2).mean(-1)  # (b, N)
        # Over the masked patches; mask_ratio=0 masks none (the encoder sees whole images): loss 0, not NaN.
        loss = (loss * mask).sum() / mask.sum().clamp(min=1)
        return ViTMAEForPreTrainingOutput(
            loss=loss,
            logits=logits,
            mask=mask,
            ids_restore=ids_restore,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
