"""EfficientViT: ViT and ViT-MAE with any registered vision attention; what differs from the shared vision
encoder (:mod:`hf_efficient.models.vision.encoder`) lives here.

ViT is the shared encoder with ViT's parameter names (``vit.encoder.layer.N.attention.attention.query``,
``layernorm_before`` ...), so ViT and ViT-MAE checkpoints load without renaming. ViT-MAE differs in its
positions (a fixed 2-D sin-cos table, no dropout), its random masking and its decoder; transformers 5 writes
the decoder layers as ``decoder.decoder_encoder.layer.N``, which ``EfficientViTMAEForPreTraining.
from_pretrained`` maps back to ``decoder.decoder_layers.N`` (the layout of the published MAE checkpoints).

Shapes: b = batch, C = channels, H x W = image size, p = patch size, h x w = patch grid, N = h * w,
D = hidden_size.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import AutoModelForPreTraining
from transformers import initialization as init
from transformers.models.vit_mae.modeling_vit_mae import (
    ViTMAEForPreTrainingOutput,
    build_2d_sinusoidal_position_embedding,
)
from transformers.utils.generic import can_return_tuple

from ...attention.inputs import AttentionInputs
from ...compat import loaded_from_checkpoint
from ...modeling.blocks import EfficientPreNormLayer, check_heads_divide
from ...modeling.checks import checking_values
from .configuration_efficient_vit import EfficientViTConfig
from .encoder import (
    EfficientVisionEmbeddings,
    EfficientVisionModel,
    EfficientVisionPreTrainedModel,
    check_pixel_values,
)
from .tasks import ImageClassificationTask, MaskedImageModelingTask


def sincos_position_table(height: int, width: int, dim: int) -> torch.Tensor:
    """MAE's fixed 2-D sin-cos table (1, 1 + h * w, dim): a zero row for [CLS], then the patches.

    The layout is that of the published MAE checkpoints ([sin_w | cos_w | sin_h | cos_h], as transformers).
    """
    table = build_2d_sinusoidal_position_embedding(height, width, embed_dim=dim, cls_token=True)
    half = dim // 2
    return torch.cat([table[:, half:], table[:, :half]], dim=-1)[None]  # (1, 1 + h*w, dim)


class EfficientViTEmbeddings(EfficientVisionEmbeddings):
    """[CLS] + patch embeddings + position embeddings: learned (ViT), or MAE's fixed 2-D sin-cos table.

    Args:
        use_mask_token: a learned ``mask_token`` for ``bool_masked_pos`` (masked image modeling).
        fixed_positions: MAE's embeddings: a fixed sin-cos table (no gradient, rebuilt for another grid) and
            no dropout (ViT-MAE's embeddings have none; its layers do).
    """

    def __init__(
        self, config: EfficientViTConfig, use_mask_token: bool = False, fixed_positions: bool = False
    ):
        super().__init__(config, use_mask_token)
        self.fixed_positions = fixed_positions
        if fixed_positions:
            self.position_embeddings.requires_grad_(False)
            self.dropout = nn.Identity()

    def position_table(self, grid: tuple[int, int]) -> torch.Tensor:
        """The learned table (resized bicubically for another grid), or MAE's sin-cos table for the grid."""
        if not self.fixed_positions or grid == self.config.grid_size:
            return super().position_table(grid)
        return sincos_position_table(*grid, self.position_embeddings.shape[-1]).to(self.position_embeddings)


class EfficientViTPreTrainedModel(EfficientVisionPreTrainedModel):
    config_class = EfficientViTConfig
    base_model_prefix = "vit"

    @torch.no_grad()
    def _init_weights(self, module):
        """ViT's init (truncated normal [CLS] and positions, or the sin-cos table when
        ``position_embedding_init="sincos"``); MAE's (sin-cos tables, xavier patches)."""
        super()._init_weights(module)
        if isinstance(module, EfficientViTMAEDecoder):
            init.copy_(
                module.decoder_pos_embed,
                sincos_position_table(*self.config.grid_size, module.mask_token.shape[-1]),
            )
            init.normal_(module.mask_token, std=self.config.initializer_range)

    def _init_embeddings(self, module: EfficientViTEmbeddings) -> None:
        table = sincos_position_table(*self.config.grid_size, module.cls_token.shape[-1])
        if not module.fixed_positions:
            super()._init_embeddings(module)
            if self.config.position_embedding_init == "sincos":  # learned, starting from MAE's table
                init.copy_(module.position_embeddings, table)
            return
        init.copy_(module.position_embeddings, table)
        weight = module.patch_embeddings.projection.weight
        if not loaded_from_checkpoint(weight):  # a view loses the "loaded" flag
            init.xavier_uniform_(weight.view(weight.shape[0], -1))  # as nn.Linear, like MAE
        init.normal_(module.cls_token, std=self.config.initializer_range)


class EfficientViTModel(EfficientViTPreTrainedModel, EfficientVisionModel):
    """The bare encoder: final-LayerNorm hidden states (b, 1 + N, D) and, optionally, ViT's pooled [CLS]
    (transformers' ``ViTModel``; ``fixed_positions=True`` gives MAE's encoder its sin-cos positions)."""

    embeddings_class = EfficientViTEmbeddings


class EfficientViTForImageClassification(EfficientViTPreTrainedModel, ImageClassificationTask):
    """Final-LayerNorm [CLS] -> linear (transformers' ``ViTForImageClassification``); single-label,
    multi-label or regression."""

    bare_model_class = EfficientViTModel


class EfficientViTForMaskedImageModeling(EfficientViTPreTrainedModel, MaskedImageModelingTask):
    """SimMIM on ViT (transformers' ``ViTForMaskedImageModeling``): see :class:`MaskedImageModelingTask`."""

    bare_model_class = EfficientViTModel


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
