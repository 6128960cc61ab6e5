"""Configuration of EfficientViT: ViT's and ViT-MAE's fields plus the attention fields of every encoder."""

from huggingface_hub.dataclasses import strict

from ...errors import InputError
from .configuration_efficient_vision import EfficientVisionConfig


@strict(accept_kwargs=True)
class EfficientViTConfig(EfficientVisionConfig):
    """A ViT encoder (pre-LayerNorm, [CLS] + patches) whose attention is chosen by ``attention_type``.

    ViT's and ViT-MAE's fields keep their names and defaults, so their ``config.json`` files load as an
    ``EfficientViTConfig`` (with ``attention_type="full"`` unless given). Attention types not meant for
    images (``graph_sparse``) raise.

    Example:
        >>> config = EfficientViTConfig(
        ...     image_size=224,
        ...     patch_size=16,
        ...     attention_type="swin_window",
        ...     attention_config={"window_size": 7},
        ... )
    """

    model_type = "efficient_vit"
    compatible_model_types = ("vit", "vit_mae")
    weight_shape_fields = ("image_size", "patch_size", "num_channels", "hidden_size", "intermediate_size")

    intermediate_size: int = 3072
    pooler_output_size: int | None = None
    pooler_act: str = "tanh"
    # How ViT's learned position embeddings start: "random" (ViT's truncated normal) or "sincos" (MAE's
    # fixed 2-D sine-cosine table, then learned; a spatial prior that helps small data, see
    # benchmarks/docs/results.md).
    position_embedding_init: str = "random"
    # ViT's masked image modeling (EfficientViTForMaskedImageModeling): each patch's hidden state becomes an
    # encoder_stride x encoder_stride block of pixels (PixelShuffle); patch_size gives the image's size.
    encoder_stride: int = 16
    # ViT-MAE (EfficientViTMAEForPreTraining)
    mask_ratio: float | int = 0.75
    norm_pix_loss: bool = False
    decoder_hidden_size: int = 512
    decoder_num_hidden_layers: int = 8
    decoder_num_attention_heads: int = 16
    decoder_intermediate_size: int = 2048

    def kept_patches(self, num_patches: int) -> int:
        """How many of ``num_patches`` patches MAE's encoder sees: ``int(num_patches * (1 - mask_ratio))``,
        as transformers' ViT-MAE; raises when that is none."""
        ratio = self.mask_ratio
        kept = int(num_patches * (1 - ratio))
        if kept < 1:
            raise InputError(
                f"mask_ratio={ratio} keeps int({num_patches} * (1 - {ratio})) = {kept} of {num_patches} "
                f"patches: MAE's encoder would see no patch. Use mask_ratio <= 1 - 1/{num_patches} (larger "
                "images or smaller patches allow higher ratios)."
            )
        return kept

    def validate_vit_fields(self):
        """Class validator: MAE's and ViT's own options (the shared ones: ``validate_vision_fields``)."""
        if not 0.0 <= self.mask_ratio < 1.0:
            raise InputError(
                f"mask_ratio must be in [0, 1), got {self.mask_ratio}: it is the share of patches MAE hides "
                "(0.75 in the paper; 0 shows the encoder every patch)."
            )
        if self.position_embedding_init not in ("random", "sincos"):
            raise InputError(
                f"position_embedding_init must be 'random' (ViT's truncated normal) or 'sincos' (the 2-D "
                f"sine-cosine table, then learned), got {self.position_embedding_init!r}."
            )
