"""Attention cores behind one contract (see :mod:`hf_efficient.attention.base`; the inputs of a call in
:mod:`~hf_efficient.attention.inputs`, hyperparameters in :mod:`~hf_efficient.attention.config`).

Every module in this package registers its core on import; importing the package imports them all, so a
new variant is one new file.
"""

import importlib
import pkgutil

from .base import AttentionCapabilities, AttentionCore, AttentionOutput, AttentionSpec, Kernel
from .config import AttentionConfig
from .inputs import AttentionInputs, GraphEdges
from .registry import (
    ATTENTION_REGISTRY,
    attention_table,
    build_attention,
    causal_attention_types,
    cross_attention_types,
    get_attention_class,
    list_attention_types,
    register_attention,
    relative_position_types,
    unregister_attention,
    validate_attention_config,
)
from .relative import RelativePositions

_INFRASTRUCTURE = {"base", "cache", "config", "inputs", "kernels", "registry", "relative", "utils"}
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in _INFRASTRUCTURE and not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "ATTENTION_REGISTRY",
    "AttentionCapabilities",
    "AttentionConfig",
    "AttentionCore",
    "AttentionInputs",
    "AttentionOutput",
    "AttentionSpec",
    "GraphEdges",
    "Kernel",
    "RelativePositions",
    "attention_table",
    "build_attention",
    "causal_attention_types",
    "cross_attention_types",
    "get_attention_class",
    "list_attention_types",
    "register_attention",
    "relative_position_types",
    "unregister_attention",
    "validate_attention_config",
]
