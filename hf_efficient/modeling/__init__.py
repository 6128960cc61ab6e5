"""Building blocks shared by the text, vision and graph encoders."""

from .blocks import EfficientAttention, EfficientEncoder, EfficientLayer, EfficientSelfAttention
from .config import EfficientEncoderConfig
from .heads import Pooler, classification_loss
from .pretrained import EfficientPreTrainedModel

__all__ = [
    "EfficientAttention",
    "EfficientEncoder",
    "EfficientEncoderConfig",
    "EfficientLayer",
    "EfficientPreTrainedModel",
    "EfficientSelfAttention",
    "Pooler",
    "classification_loss",
]
