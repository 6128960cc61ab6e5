"""EfficientViT: the vision encoder (ViT, ViT-MAE) with any attention type meant for images."""

from .configuration_efficient_vit import EfficientViTConfig
from .image_processing import EfficientViTImageProcessor
from .modeling_efficient_vit import (
    EfficientViTForImageClassification,
    EfficientViTMAEForPreTraining,
    EfficientViTModel,
    EfficientViTPreTrainedModel,
)

__all__ = [
    "EfficientViTConfig",
    "EfficientViTForImageClassification",
    "EfficientViTImageProcessor",
    "EfficientViTMAEForPreTraining",
    "EfficientViTModel",
    "EfficientViTPreTrainedModel",
]
