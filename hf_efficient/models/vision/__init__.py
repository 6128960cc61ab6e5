"""The vision encoders (ViT, ViT-MAE, DeiT, DINOv2) with any attention type meant for images."""

from transformers.utils import is_vision_available

from ...extras import requires_extra
from .configuration_efficient_deit import EfficientDeiTConfig
from .configuration_efficient_dinov2 import EfficientDinov2Config
from .configuration_efficient_vit import EfficientViTConfig

if is_vision_available():  # Pillow, the [vision] extra
    from .image_processing import EfficientViTImageProcessor
else:
    EfficientViTImageProcessor = requires_extra("EfficientViTImageProcessor", "vision", "Pillow")
from .modeling_efficient_deit import (
    EfficientDeiTForImageClassification,
    EfficientDeiTForImageClassificationWithTeacher,
    EfficientDeiTForMaskedImageModeling,
    EfficientDeiTModel,
    EfficientDeiTPreTrainedModel,
)
from .modeling_efficient_dinov2 import (
    EfficientDinov2ForImageClassification,
    EfficientDinov2Model,
    EfficientDinov2PreTrainedModel,
)
from .modeling_efficient_vit import (
    EfficientViTForImageClassification,
    EfficientViTForMaskedImageModeling,
    EfficientViTMAEForPreTraining,
    EfficientViTModel,
    EfficientViTPreTrainedModel,
)

__all__ = [
    "EfficientDeiTConfig",
    "EfficientDeiTForImageClassification",
    "EfficientDeiTForImageClassificationWithTeacher",
    "EfficientDeiTForMaskedImageModeling",
    "EfficientDeiTModel",
    "EfficientDeiTPreTrainedModel",
    "EfficientDinov2Config",
    "EfficientDinov2ForImageClassification",
    "EfficientDinov2Model",
    "EfficientDinov2PreTrainedModel",
    "EfficientViTConfig",
    "EfficientViTForImageClassification",
    "EfficientViTForMaskedImageModeling",
    "EfficientViTImageProcessor",
    "EfficientViTMAEForPreTraining",
    "EfficientViTModel",
    "EfficientViTPreTrainedModel",
]
