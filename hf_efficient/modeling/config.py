"""Configuration fields shared by every hf_efficient encoder: which attention each layer uses.

One saved field, ``attention_type``, swaps the attention of the whole encoder; ``attention_config`` holds
that type's own hyperparameters (validated by the type: unknown keys raise and list the valid ones).
``layer_attention_types`` optionally names a type per layer (for example exact attention in the last
layer, Longformer below), with ``layer_attention_configs`` holding the hyperparameters of the other types.
"""

from __future__ import annotations

from typing import Any, ClassVar

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

from ..attention.registry import get_attention_class, validate_attention_config


@strict(accept_kwargs=True)
class EfficientEncoderConfig(PreTrainedConfig):
    """Base of the text, vision and graph configs: the attention fields and their validation.

    Attributes:
        attention_type: registered attention type of every layer (see ``hf_efficient.list_attention_types``).
        attention_config: hyperparameters of ``attention_type`` (a dict; ``None`` = the type's defaults).
        layer_attention_types: optional list with one attention type per layer, overriding
            ``attention_type`` layer by layer.
        layer_attention_configs: hyperparameters of the types in ``layer_attention_types`` other than
            ``attention_type``, keyed by type name.
    """

    # The modality whose attention types this config accepts ("text", "vision" or "graph").
    modality: ClassVar[str] = "text"
    # Checkpoint model types whose weights map onto this architecture without renaming.
    compatible_model_types: ClassVar[tuple[str, ...]] = ()

    attention_type: str = "full"
    attention_config: dict | None = None
    layer_attention_types: list | None = None
    layer_attention_configs: dict | None = None

    def attention_for_layer(self, layer_idx: int) -> tuple[str, dict[str, Any]]:
        """The (attention_type, attention_config) of layer ``layer_idx``."""
        if self.layer_attention_types is None:
            return self.attention_type, dict(self.attention_config or {})
        attention_type = self.layer_attention_types[layer_idx]
        # Per-type configs; the model's main type always uses ``attention_config``.
        configs = {**(self.layer_attention_configs or {}), self.attention_type: self.attention_config}
        return attention_type, dict(configs.get(attention_type) or {})

    def validate_attention(self):
        """Class validator (run by ``@strict``): every named type exists for this modality, configs parse."""
        for attention_type in [self.attention_type, *(self.layer_attention_types or [])]:
            get_attention_class(attention_type, self.modality)  # the registry: exists, and for this modality?
        if self.layer_attention_types is not None:
            num_layers = getattr(self, "num_hidden_layers", None)
            if num_layers is not None and len(self.layer_attention_types) != num_layers:
                raise ValueError(
                    f"layer_attention_types names {len(self.layer_attention_types)} types but the model has "
                    f"num_hidden_layers={num_layers}; give exactly one type per layer."
                )
        extra = set(self.layer_attention_configs or {}) - set(self.layer_attention_types or [])
        extra |= {self.attention_type} & set(self.layer_attention_configs or {})
        if extra:
            raise ValueError(
                f"layer_attention_configs has entries for {sorted(extra)}, which no layer uses apart from "
                "attention_type (whose hyperparameters belong in attention_config). Remove them."
            )
        for layer_idx in range(len(self.layer_attention_types or [None])):
            validate_attention_config(*self.attention_for_layer(layer_idx))

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs):
        """Load a saved config; a checkpoint of another architecture raises instead of loading silently."""
        source = config_dict.get("model_type")
        if source is not None and source not in (cls.model_type, *cls.compatible_model_types):
            supported = ", ".join((cls.model_type, *cls.compatible_model_types))
            raise ValueError(
                f"A checkpoint of model_type {source!r} cannot be mapped onto {cls.__name__}: its weights "
                f"have another architecture. Supported checkpoint types: {supported}."
            )
        # The instance keeps this class's model_type: a BERT config loads as an efficient_bert config.
        config_dict = {key: value for key, value in config_dict.items() if key != "model_type"}
        result = super().from_dict(config_dict, **kwargs)
        # transformers applies from_pretrained's overrides (attention_type=..., layer_attention_types=...)
        # with setattr after construction, which skips the class validators: run them on the final config.
        (result[0] if isinstance(result, tuple) else result).validate()
        return result
