"""EfficientBert: the text encoder."""

from .configuration_efficient_bert import EfficientBertConfig
from .modeling_efficient_bert import (
    EfficientBertForMaskedLM,
    EfficientBertForSequenceClassification,
    EfficientBertForTokenClassification,
    EfficientBertModel,
    EfficientBertPreTrainedModel,
)

__all__ = [
    "EfficientBertConfig",
    "EfficientBertForMaskedLM",
    "EfficientBertForSequenceClassification",
    "EfficientBertForTokenClassification",
    "EfficientBertModel",
    "EfficientBertPreTrainedModel",
]
