"""The fields every vision family's config shares (ViT, DeiT, DINOv2): the images, the patches, the layers'
sizes, and how many tokens come before the patches."""

from typing import ClassVar

from huggingface_hub.dataclasses import strict

from ...errors import InputError
from ...modeling.config import EfficientEncoderConfig


@strict(accept_kwargs=True)
class EfficientVisionConfig(EfficientEncoderConfig):
    """Base of the vision configs: square images of ``image_size`` cut into ``patch_size`` patches, the
    prefix tokens before them ([CLS], DeiT's distillation token), and a pre-LayerNorm encoder.

    Field names and defaults are those of transformers' ViT config; a family's config overrides what differs
    (DINOv2's ``patch_size=14``, ``layer_norm_eps=1e-6``). Attention types not meant for images
    (``graph_sparse``) raise.
    """

    modality = "vision"
    # Tokens before the patch grid: [CLS] (ViT, DINOv2), [CLS] + distillation (DeiT). Read by the embeddings
    # and by the attention types that attend by 2-D position (swin_window keeps them global).
    num_prefix_tokens: ClassVar[int] = 1

    image_size: int = 224
    patch_size: int = 16
    num_channels: int = 3
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    hidden_act: str = "gelu"
    hidden_dropout_prob: float | int = 0.0
    attention_probs_dropout_prob: float | int = 0.0
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    qkv_bias: bool = True

    @property
    def grid_size(self) -> tuple[int, int]:
        """(height, width) of the patch grid at ``image_size``."""
        return (self.image_size // self.patch_size, self.image_size // self.patch_size)

    @property
    def max_position_embeddings(self) -> int:
        """Prefix tokens + patches at ``image_size``: the length that fixed-length attention types
        (Linformer) get."""
        height, width = self.grid_size
        return self.num_prefix_tokens + height * width

    def validate_vision_fields(self):
        """Class validator: square images and patches that tile them, and no option we do not implement
        silently dropped. (Whether hidden_size splits into num_attention_heads is checked when a model is
        built, as transformers' configs accept any sizes.)"""
        for name in ("image_size", "patch_size"):
            if not isinstance(getattr(self, name), int):
                raise InputError(
                    f"{name} must be one int (square images and patches), got {getattr(self, name)!r}."
                )
        if self.image_size % self.patch_size:
            raise InputError(
                f"image_size={self.image_size} must be a multiple of patch_size={self.patch_size}."
            )
        if not self.qkv_bias:
            raise InputError("qkv_bias=False is not supported: the query/key/value projections have biases.")
