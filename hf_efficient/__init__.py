"""hf_efficient: efficient attention for Hugging Face encoders."""

from .attention import (
    AttentionCapabilities,
    AttentionConfig,
    AttentionCore,
    AttentionOutput,
    AttentionSpec,
    GraphEdges,
    build_attention,
    get_attention_class,
    list_attention_types,
    register_attention,
    validate_attention_config,
)
from .models import (
    EfficientBertConfig,
    EfficientBertForMaskedLM,
    EfficientBertForSequenceClassification,
    EfficientBertForTokenClassification,
    EfficientBertModel,
)

__version__ = "0.1.0"

__all__ = [
    "EfficientBertConfig",
    "EfficientBertForMaskedLM",
    "EfficientBertForSequenceClassification",
    "EfficientBertForTokenClassification",
    "EfficientBertModel",
    "AttentionCapabilities",
    "AttentionConfig",
    "AttentionCore",
    "AttentionOutput",
    "AttentionSpec",
    "GraphEdges",
    "build_attention",
    "get_attention_class",
    "list_attention_types",
    "register_attention",
    "validate_attention_config",
]
