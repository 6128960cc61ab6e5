"""The registered attention types by name: the dictionary :mod:`.registry` fills and the lists read from it.

A leaf (it imports nothing of the package): the input checks (:mod:`.inputs`) and the contract
(:mod:`.base`) list the causal types in their errors from here, without importing the registry, which
imports them. Use the names through :mod:`.registry` or the package.
"""

from __future__ import annotations

from typing import Any

ATTENTION_REGISTRY: dict[str, Any] = {}  # name -> AttentionCore subclass (filled by register_attention)


def list_attention_types(modality: str | None = None) -> list[str]:
    """Sorted names of the registered attention types, optionally only those usable for a modality."""
    return sorted(
        name
        for name, cls in ATTENTION_REGISTRY.items()
        if modality is None or modality in cls.capabilities.modalities
    )


def causal_attention_types(modality: str | None = None) -> list[str]:
    """Sorted names of the types with a causal form and incremental decoding (``capabilities.causal``): the
    attention types a decoder (``is_decoder=True``, ``EfficientBertForCausalLM``) can use."""
    return [name for name in list_attention_types(modality) if ATTENTION_REGISTRY[name].capabilities.causal]


def relative_position_types(modality: str | None = None) -> list[str]:
    """Sorted names of the types that add learned relative position scores to theirs
    (``capabilities.relative_positions``): the ``attention_type`` choices of a BERT with
    ``position_embedding_type="relative_key"`` or ``"relative_key_query"``."""
    return [
        name
        for name in list_attention_types(modality)
        if ATTENTION_REGISTRY[name].capabilities.relative_positions
    ]
