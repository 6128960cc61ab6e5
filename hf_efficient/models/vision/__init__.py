"""EfficientViT: the vision encoder (ViT, ViT-MAE) with any attention type meant for images."""

from transformers.utils import is_vision_available

from ...extras import requires_extra
from .configuration_efficient_vit import EfficientViTConfig

if is_vision_available():  # Pillow, the [vision] extra
    from .image_processing import EfficientViTImageProcessor
else:
    EfficientViTImageProcessor = requires_extra("EfficientViTImageProcessor", "vision", "Pillow")
from .modeling_efficient_vit import (
    EfficientViTForImageClassification,
    EfficientViTForMaskedImageModeling,
    EfficientViTMAEForPreTraining,
    EfficientViTModel,
    EfficientViTPreTrainedModel,
)

__all__ = [
    "EfficientViTConfig",
    "EfficientViTForImageClassification",
    "EfficientViTForMaskedImageModeling",
    "EfficientViTImageProcessor",
    "EfficientViTMAEForPreTraining",
    "EfficientViTModel",
    "EfficientViTPreTrainedModel",
]
