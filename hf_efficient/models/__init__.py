"""The encoders, one sub-package per modality, and their registration with transformers' Auto classes."""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from .text import (
    EfficientBertConfig,
    EfficientBertForMaskedLM,
    EfficientBertForSequenceClassification,
    EfficientBertForTokenClassification,
    EfficientBertModel,
)


def _register(config_class, mapping: dict) -> None:
    """Register with the Auto classes (idempotent: a second import of the package is a no-op)."""
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    for auto_class, model_class in mapping.items():
        auto_class.register(config_class, model_class, exist_ok=True)


_register(
    EfficientBertConfig,
    {
        AutoModel: EfficientBertModel,
        AutoModelForMaskedLM: EfficientBertForMaskedLM,
        AutoModelForSequenceClassification: EfficientBertForSequenceClassification,
        AutoModelForTokenClassification: EfficientBertForTokenClassification,
    },
)

__all__ = [
    "EfficientBertConfig",
    "EfficientBertForMaskedLM",
    "EfficientBertForSequenceClassification",
    "EfficientBertForTokenClassification",
    "EfficientBertModel",
]
