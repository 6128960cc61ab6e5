"""The one place that maps an ``attention_type`` name to a core class, and the facts it carries.

Variants register themselves with ``@register_attention("name")`` in their own module; every module in
``hf_efficient.attention`` is imported by the package ``__init__``, so adding a variant is adding a file.
Everything that lists types reads them from here, and every fact of a type is an attribute of its core
(:class:`AttentionCore`): the encoders (by modality and capability), the scripts' config files (each
family's settings), the export table, the benchmarks (type lists, settings, FLOP models), the lab's ListOps
runs (LRA's figures) and the docs table (:func:`attention_table`).
"""

from __future__ import annotations

from typing import Any

from ._catalog import ATTENTION_REGISTRY, list_attention_types, rotary_attention_types
from ._catalog import causal_attention_types as causal_attention_types  # the registry's API
from ._catalog import relative_position_types as relative_position_types
from .base import MODALITIES, AttentionCore, AttentionSpec
from .config import AttentionConfig


def register_attention(name: str):
    """Class decorator: register an :class:`AttentionCore` subclass under ``name`` (snake_case paper name)."""

    def decorator(cls: type[AttentionCore]) -> type[AttentionCore]:
        if name in ATTENTION_REGISTRY and ATTENTION_REGISTRY[name] is not cls:
            raise ValueError(f"attention_type {name!r} is already registered by {ATTENTION_REGISTRY[name]}")
        if not issubclass(cls, AttentionCore):
            raise TypeError(f"{cls} must subclass AttentionCore")
        cls.attention_type = name
        ATTENTION_REGISTRY[name] = cls
        return cls

    return decorator


def unregister_attention(name: str) -> None:
    """Remove ``name`` from the registry (for mechanisms registered for a while, e.g. inside a test)."""
    if ATTENTION_REGISTRY.pop(name, None) is None:
        raise ValueError(f"attention_type {name!r} is not registered.")


def cross_attention_types(modality: str | None = None) -> list[str]:
    """Sorted names of the types that can attend from one sequence to another (``capabilities.
    cross_attention``): the ``cross_attention_type`` choices of a decoder with ``add_cross_attention``."""
    return [
        name
        for name in list_attention_types(modality)
        if ATTENTION_REGISTRY[name].capabilities.cross_attention
    ]


def check_cross_attention_type(attention_type: str, modality: str | None = None) -> type[AttentionCore]:
    """The core class of ``attention_type`` for cross-attention; a type that cannot attend to another
    sequence raises with the reason its core declares (``cross_attention_refusal``) and the types that can."""
    return _capable_class(
        attention_type, modality, "cross_attention", "serve cross-attention",
        cross_attention_types(modality), " (set cross_attention_type to one)",
    )  # fmt: skip


def check_rotary_type(attention_type: str, modality: str | None = None) -> type[AttentionCore]:
    """The core class of ``attention_type`` for a model with rotary positions; a type that cannot carry them
    raises with the reason its core declares (``rotary_refusal``) and the types that can."""
    return _capable_class(
        attention_type, modality, "rotary", "carry rotary positions", rotary_attention_types(modality)
    )


def _capable_class(
    attention_type: str, modality: str | None, capability: str, use: str, able: list[str], fix: str = ""
) -> type[AttentionCore]:
    """The core class of ``attention_type`` when it declares ``capability``, else a ValueError: it cannot
    ``use``, why (its ``<capability>_refusal``), the types that can (``able``) and ``fix``."""
    cls = get_attention_class(attention_type, modality)
    if not getattr(cls.capabilities, capability):
        raise ValueError(
            f"attention_type {attention_type!r} cannot {use}: {getattr(cls, f'{capability}_refusal')}. "
            f"Types that can: {', '.join(able)}{fix}."
        )
    return cls


def check_relative_positions_type(attention_type: str, modality: str | None = None) -> type[AttentionCore]:
    """The core class of ``attention_type`` for BERT's relative position scores (``relative_key`` /
    ``relative_key_query``); a type that cannot add them raises with the reason its core declares
    (``relative_positions_refusal``) and the types that can."""
    return _capable_class(
        attention_type, modality, "relative_positions", "add relative position scores",
        relative_position_types(modality), " (or position_embedding_type='absolute')",
    )  # fmt: skip


def get_attention_class(attention_type: str, modality: str | None = None) -> type[AttentionCore]:
    """The core class registered under ``attention_type``; a clear error lists the valid names. With
    ``modality``, a type not meant for it (``graph_sparse`` for text) raises, listing the types that are."""
    try:
        cls = ATTENTION_REGISTRY[attention_type]
    except KeyError:
        valid = ", ".join(list_attention_types())
        raise ValueError(f"Unknown attention_type {attention_type!r}. Registered types: {valid}.") from None
    if modality is not None and modality not in MODALITIES:
        raise ValueError(f"Unknown modality {modality!r}; choose one of {', '.join(MODALITIES)}.")
    if modality is not None and attention_type not in (allowed := list_attention_types(modality)):
        raise ValueError(
            f"attention_type {attention_type!r} is not available for {modality} models. "
            f"Types for {modality}: {', '.join(allowed)}."
        )
    return cls


def validate_attention_config(
    attention_type: str, attention_config: dict[str, Any] | None
) -> AttentionConfig:
    """Parse and validate an ``attention_config`` dict for ``attention_type`` (unknown keys raise)."""
    cls = get_attention_class(attention_type)
    config = cls.config_class.from_dict(attention_type, attention_config)
    cls.check_implementation(config.implementation)
    return config


def build_attention(
    attention_type: str,
    spec: AttentionSpec,
    attention_config: dict[str, Any] | AttentionConfig | None = None,
    modality: str | None = None,
) -> AttentionCore:
    """Build the core for ``attention_type``.

    Args:
        attention_type: a registered name (see :func:`list_attention_types`).
        spec: the model-level sizes (heads, head_dim, dropout, kernel, max length, layer index).
        attention_config: the variant's own hyperparameters, as a dict (validated) or its config object.
        modality: ``"text"``, ``"vision"`` or ``"graph"``; a core not meant for it raises.
    """
    if not isinstance(spec, AttentionSpec):
        raise TypeError(
            f"build_attention: spec must be an AttentionSpec(num_heads=..., head_dim=...), got "
            f"{type(spec).__name__}: {spec!r}."
        )
    cls = get_attention_class(attention_type, modality)
    if spec.cross_attention:
        check_cross_attention_type(attention_type, modality)
    if not isinstance(attention_config, AttentionConfig):
        attention_config = cls.config_class.from_dict(attention_type, attention_config)
    elif not isinstance(attention_config, cls.config_class):
        raise TypeError(
            f"{attention_type} expects a {cls.config_class.__name__}, got {type(attention_config)}"
        )
    return cls(spec, attention_config)


def attention_table(modality: str | None = None) -> str:
    """The markdown table of the registered types (the README's and the docs'), from each core's facts."""
    rows = ["| `attention_type` | paper | cost in n | modalities | notes |", "|---|---|---|---|---|"]
    for name in list_attention_types(modality):
        cls = ATTENTION_REGISTRY[name]
        modalities = ", ".join(m for m in MODALITIES if m in cls.capabilities.modalities)
        rows.append(f"| `{name}` | {cls.paper} | {cls.cost} | {modalities} | {cls.summary} |")
    return "\n".join(rows) + "\n"
