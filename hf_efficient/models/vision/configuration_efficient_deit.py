"""Configuration of EfficientDeiT: DeiT's fields (ViT's, a distillation token) and the attention fields."""

from huggingface_hub.dataclasses import strict

from .configuration_efficient_vision import EfficientVisionConfig


@strict(accept_kwargs=True)
class EfficientDeiTConfig(EfficientVisionConfig):
    """A DeiT encoder (Touvron et al. 2021: ViT's layers, a distillation token after [CLS]) whose attention is
    chosen by ``attention_type``. DeiT's fields keep their names and defaults, so a DeiT ``config.json``
    loads as an ``EfficientDeiTConfig``.

    Example:
        >>> config = EfficientDeiTConfig(attention_type="swin_window", attention_config={"window_size": 7})
    """

    model_type = "efficient_deit"
    compatible_model_types = ("deit",)
    weight_shape_fields = ("image_size", "patch_size", "num_channels", "hidden_size", "intermediate_size")
    num_prefix_tokens = 2  # [CLS], then the distillation token

    intermediate_size: int = 3072
    # masked image modeling (EfficientDeiTForMaskedImageModeling): each patch becomes encoder_stride^2 pixels
    encoder_stride: int = 16
    pooler_output_size: int | None = None  # None: hidden_size
    pooler_act: str = "tanh"
