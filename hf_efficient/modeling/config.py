"""Configuration fields shared by every hf_efficient encoder: which attention each layer uses.

One saved field, ``attention_type``, swaps the attention of the whole encoder; ``attention_config`` holds
that type's own hyperparameters (validated by the type: unknown keys raise and list the valid ones).
``layer_attention_types`` optionally names a type per layer (for example exact attention in the last
layer, Longformer below), with ``layer_attention_configs`` holding the hyperparameters of the other types.
"""

from typing import Any, ClassVar

from huggingface_hub.dataclasses import strict
from huggingface_hub.errors import StrictDataclassError
from transformers import PreTrainedConfig
from transformers.activations import ACT2FN

from ..attention.registry import get_attention_class, validate_attention_config
from ..compat import without_registered_pipelines
from ..errors import InputError
from .checkpoint_files import check_pretrained_path
from .loading import OTHER_TYPE_WARNING, dropped_log_message, source_model_type

# Sizes that must be positive ints wherever a config declares them (types are @strict's: the configs' modules
# keep real annotations, no `from __future__ import annotations`, which would turn them into strings that
# @strict cannot check).
POSITIVE_SIZES = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "embedding_size",
    "image_size",
    "patch_size",
    "num_channels",
    "decoder_hidden_size",
    "decoder_num_hidden_layers",
    "decoder_num_attention_heads",
    "decoder_intermediate_size",
    "max_position_embeddings",  # last: ViT derives it from image_size // patch_size
)
# Token type rows: 0 is a family without segments (DistilBERT: no token type table, token_type_ids refused).
SIZES_FROM_ZERO = ("type_vocab_size",)
PROBABILITIES = (
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "classifier_dropout",
    "summary_first_dropout",  # ELECTRA's multiple-choice summary
    "summary_last_dropout",
    "qa_dropout",  # DistilBERT's heads
    "seq_classif_dropout",
)

# Checkpoint model_type (ours and upstream's) -> the config class of the family that loads it; filled by
# hf_efficient.models.families.register_family, read to name the right family when a checkpoint is offered to
# another's class.
CHECKPOINT_CONFIGS: dict[str, type] = {}


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
        padding_free: compute a padded batch on its real tokens only
            (:mod:`~hf_efficient.modeling.unpadding`): the same outputs at every real token, without the
            time and memory padding costs outside attention. A compute choice, not architecture: any
            checkpoint runs either way.
    """

    # The modality whose attention types this config accepts ("text", "vision" or "graph").
    modality: ClassVar[str] = "text"
    # Checkpoint model types whose weights map onto this architecture without renaming.
    compatible_model_types: ClassVar[tuple[str, ...]] = ()
    # Fields that fix the shapes of a checkpoint's weights: overriding one of them when loading a checkpoint
    # makes its weights not fit (``ModelArguments.load_model`` says so before transformers' load report).
    weight_shape_fields: ClassVar[tuple[str, ...]] = ("hidden_size", "intermediate_size")

    attention_type: str = "full"
    attention_config: dict | None = None
    layer_attention_types: list | None = None
    layer_attention_configs: dict | None = None
    padding_free: bool = False

    def padding_free_refusal(self) -> str | None:
        """Why ``padding_free`` cannot be exact for this config (None: it is; a modality's config says
        otherwise where its inputs need the padded batch)."""
        return None

    def attention_for_layer(self, layer_idx: int) -> tuple[str, dict[str, Any]]:
        """The (attention_type, attention_config) of layer ``layer_idx``."""
        if self.layer_attention_types is None:
            return self.attention_type, dict(self.attention_config or {})
        attention_type = self.layer_attention_types[layer_idx]
        # Per-type configs; the model's main type always uses ``attention_config``.
        configs = {**(self.layer_attention_configs or {}), self.attention_type: self.attention_config}
        return attention_type, dict(configs.get(attention_type) or {})

    def validate_architecture_sizes(self):
        """Class validator: sizes positive, dropouts in [0, 1), a known activation, a padding id inside the
        vocabulary. ``@strict`` runs class validators in alphabetical order, so this one runs before the
        validators that divide by these sizes (``validate_attention``, ``validate_bert_fields``...)."""
        for name in POSITIVE_SIZES:
            value = getattr(self, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value < 1:
                raise InputError(f"{name} must be a positive int, got {value}.")
        for name in SIZES_FROM_ZERO:
            value = getattr(self, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value < 0:
                raise InputError(f"{name} must be an int >= 0 (0: no token type embeddings), got {value}.")
        for name in PROBABILITIES:
            value = getattr(self, name, None)
            if value is not None and not 0.0 <= value < 1.0:
                raise InputError(f"{name} is a dropout probability and must be in [0, 1), got {value}.")
        eps = getattr(self, "layer_norm_eps", None)  # DistilBERT's is fixed: not a field of its config
        if eps is not None and not eps > 0:
            raise InputError(f"layer_norm_eps must be > 0 (LayerNorm divides by it), got {eps}.")
        if self.initializer_range < 0:
            raise InputError(
                f"initializer_range is a standard deviation, >= 0; got {self.initializer_range}."
            )
        if self.hidden_act not in ACT2FN:
            raise InputError(
                f"hidden_act={self.hidden_act!r} is not an activation transformers knows; use one of "
                f"{', '.join(sorted(ACT2FN))}."
            )
        pad, vocab = getattr(self, "pad_token_id", None), getattr(self, "vocab_size", None)
        if isinstance(pad, int) and isinstance(vocab, int) and not 0 <= pad < vocab:
            raise InputError(
                f"pad_token_id={pad} is not a row of the vocab_size={vocab} word embeddings; use the "
                "tokenizer's pad_token_id, in [0, vocab_size)."
            )

    def validate_attention(self):
        """Class validator (run by ``@strict``): every named type exists for this modality, configs parse."""
        for index, name in enumerate(self.layer_attention_types or []):
            if not isinstance(name, str):
                raise InputError(
                    f"layer_attention_types[{index}] must be an attention type name (str), got {name!r}: "
                    "give one name per layer, e.g. ['longformer', 'full']."
                )
        for name, values in (self.layer_attention_configs or {}).items():
            if values is not None and not isinstance(values, dict):
                raise InputError(
                    f"layer_attention_configs[{name!r}] must be a dict of that type's hyperparameters (or "
                    f"None), got {type(values).__name__}: {values!r}."
                )
        for attention_type in [self.attention_type, *(self.layer_attention_types or [])]:
            get_attention_class(attention_type, self.modality)  # the registry: exists, and for this modality?
        if self.layer_attention_types is not None:
            num_layers = getattr(self, "num_hidden_layers", None)
            if num_layers is not None and len(self.layer_attention_types) != num_layers:
                raise InputError(
                    f"layer_attention_types names {len(self.layer_attention_types)} types but the model has "
                    f"num_hidden_layers={num_layers}; give exactly one type per layer."
                )
        extra = set(self.layer_attention_configs or {}) - set(self.layer_attention_types or [])
        extra |= {self.attention_type} & set(self.layer_attention_configs or {})
        if extra:
            raise InputError(
                f"layer_attention_configs has entries for {sorted(extra)}, which no layer uses apart from "
                "attention_type (whose hyperparameters belong in attention_config). Remove them."
            )
        for layer_idx in range(len(self.layer_attention_types or [None])):
            validate_attention_config(*self.attention_for_layer(layer_idx))

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        """transformers' ``from_pretrained``; a local path that does not exist raises saying so, and a field
        of the wrong type or value (an edited config.json, a bad keyword override) names the source."""
        check_pretrained_path(pretrained_model_name_or_path, f"{cls.__name__}.from_pretrained")
        try:
            # A bert / vit config is a supported start (from_dict refuses the others): transformers' warning
            # that another model type "can yield errors" does not apply; the model's load line says so.
            with dropped_log_message(*OTHER_TYPE_WARNING):
                return super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        except StrictDataclassError as error:
            raise InputError(
                f"{cls.__name__}.from_pretrained({str(pretrained_model_name_or_path)!r}): its config.json "
                f"(or a keyword override) is invalid. {error}"
            ) from error

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs):
        """Load a saved config; a checkpoint of another architecture raises instead of loading silently."""
        source = config_dict.get("model_type")
        if source is not None and source not in (cls.model_type, *cls.compatible_model_types):
            supported = ", ".join((cls.model_type, *cls.compatible_model_types))
            family = CHECKPOINT_CONFIGS.get(source)
            prefix = family.__name__.removesuffix("Config") if family is not None else None
            fix = f" Load it with its own family's classes: {prefix}Model, {prefix}For..." if prefix else ""
            raise InputError(
                f"A checkpoint of model_type {source!r} cannot be mapped onto {cls.__name__}: its weights "
                f"have another architecture. Supported checkpoint types: {supported}.{fix}"
            )
        if source is not None and source != cls.model_type:
            source_model_type.set(source)  # for the model's one-line load summary
        # The instance keeps this class's model_type: a BERT config loads as an efficient_bert config.
        config_dict = {key: value for key, value in config_dict.items() if key != "model_type"}
        if "custom_pipelines" in config_dict:  # remote code's pipelines, for where this package is absent
            config_dict["custom_pipelines"] = without_registered_pipelines(config_dict["custom_pipelines"])
        result = super().from_dict(config_dict, **kwargs)
        # transformers applies from_pretrained's overrides (attention_type=..., layer_attention_types=...)
        # with setattr after construction, which skips the class validators: run them on the final config.
        (result[0] if isinstance(result, tuple) else result).validate()
        return result
