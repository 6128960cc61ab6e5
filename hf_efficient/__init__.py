"""hf_efficient: efficient attention for Hugging Face encoders."""

from . import models
from .attention import (
    AttentionCapabilities,
    AttentionConfig,
    AttentionCore,
    AttentionInputs,
    AttentionOutput,
    AttentionSpec,
    GraphEdges,
    RelativePositions,
    RotaryPositions,
    attention_table,
    build_attention,
    causal_attention_types,
    cross_attention_types,
    get_attention_class,
    list_attention_types,
    register_attention,
    relative_position_types,
    rotary_attention_types,
    validate_attention_config,
)
from .attention.cache import EfficientCache
from .models import *  # noqa: F403  (the encoders, their configs and processors: models.__all__)

__version__ = "0.1.0"

__all__ = [
    *models.__all__,
    "AttentionCapabilities",
    "AttentionConfig",
    "AttentionCore",
    "AttentionInputs",
    "AttentionOutput",
    "AttentionSpec",
    "GraphEdges",
    "RelativePositions",
    "RotaryPositions",
    "attention_table",
    "build_attention",
    "causal_attention_types",
    "cross_attention_types",
    "EfficientCache",
    "get_attention_class",
    "list_attention_types",
    "register_attention",
    "relative_position_types",
    "rotary_attention_types",
    "validate_attention_config",
]
