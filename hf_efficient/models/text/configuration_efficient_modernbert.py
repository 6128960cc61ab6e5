"""Configuration of EfficientModernBert: ModernBERT's fields and defaults, and which attention each layer kind
uses."""

from typing import Any, ClassVar

import torch
from huggingface_hub.dataclasses import strict
from transformers.activations import ACT2FN
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ...attention.registry import check_rotary_type, get_attention_class, validate_attention_config
from ...attention.rotary import default_inverse_frequencies
from ...errors import InputError
from ...modeling.config import EfficientEncoderConfig

GLOBAL, WINDOW = "full_attention", "sliding_attention"  # ModernBERT's layer kinds (its layer_types)
DEFAULT_THETAS = {GLOBAL: 160_000.0, WINDOW: 10_000.0}
# rotary types whose frequencies change with the input's length (transformers' dynamic_rope_update)
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


@strict(accept_kwargs=True)
class EfficientModernBertConfig(EfficientEncoderConfig):
    """A ModernBERT encoder (Warner et al. 2024) whose attention is chosen per layer kind.

    ModernBERT's own fields keep their names and defaults, so a ModernBERT ``config.json`` loads as an
    ``EfficientModernBertConfig``. Its layers are of two kinds (``layer_types``: every
    ``global_attn_every_n_layers``-th layer ``full_attention``, the others ``sliding_attention``), each with
    its rotary theta (``rope_parameters``: 160,000 and 10,000). Which attention each kind uses:

    * the global layers: ``attention_type`` (default ``"full"``, exact) with ``attention_config``;
    * the window layers: ``local_attention_type`` (default ``"longformer"``, our window kernel) with
      ``local_attention_config``; for ``longformer`` its window is ModernBERT's: ``local_attention`` tokens,
      ``local_attention // 2`` keys on each side (transformers' mask |i - j| <= ``local_attention // 2``)
      and no global tokens.

    So a checkpoint loaded with no override keeps its pattern through our kernels, exactly; ``attention_type``
    given at load replaces the global layers' exact attention (``"bigbird"`` or ``"linear"`` to read past
    8,192 tokens), ``local_attention_type`` the window layers', and ``layer_attention_types`` names a type
    per layer (a type equal to ``local_attention_type`` without a config of its own takes the window's). Every
    type must carry rotary positions (``hf_efficient.rotary_attention_types()``).

    Example:
        >>> config = EfficientModernBertConfig.from_pretrained(folder, attention_type="bigbird")
    """

    model_type = "efficient_modernbert"
    modality = "text"
    compatible_model_types = ("modernbert",)
    weight_shape_fields = ("vocab_size", "hidden_size", "intermediate_size")
    # BERT's names of the fields the shared code reads (checks, the cores' dropout)
    attribute_map: ClassVar[dict[str, str]] = {
        "hidden_act": "hidden_activation",
        "layer_norm_eps": "norm_eps",
        "attention_probs_dropout_prob": "attention_dropout",
    }

    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    initializer_cutoff_factor: float = 2.0
    norm_eps: float = 1e-5
    norm_bias: bool = False
    pad_token_id: int | None = 50283
    eos_token_id: int | list[int] | None = 50282
    bos_token_id: int | None = 50281
    cls_token_id: int | None = 50281
    sep_token_id: int | None = 50282
    attention_bias: bool = False
    attention_dropout: float | int = 0.0
    layer_types: list[str] | None = None
    rope_parameters: dict | None = None
    local_attention: int = 128
    embedding_dropout: float | int = 0.0
    mlp_bias: bool = False
    mlp_dropout: float | int = 0.0
    decoder_bias: bool = True
    classifier_pooling: str = "cls"
    classifier_dropout: float | int = 0.0
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    # FlashAttention 2's deterministic backward upstream; no kernel here reads it (kept for round trips)
    deterministic_flash_attn: bool = False
    # A masked LM given labels: True scores the masked positions only, (M, V) logits; False (ModernBERT's
    # default) every position, (b, n, V); None: in training the masked ones through a chunked loss that
    # builds no logits, in eval every position (EfficientBertConfig's default)
    sparse_prediction: bool | None = False
    sparse_pred_ignore_index: int = -100
    tie_word_embeddings: bool = True
    local_attention_type: str = "longformer"
    local_attention_config: dict | None = None

    def __post_init__(self, **kwargs):
        # older configs give the pattern as a period: a global layer every n layers, the first one global
        every = kwargs.pop("global_attn_every_n_layers", 3)
        if self.layer_types is None:
            self.layer_types = [GLOBAL if i % every == 0 else WINDOW for i in range(self.num_hidden_layers)]
        super().__post_init__(**kwargs)

    def convert_rope_params_to_dict(self, **kwargs) -> dict[str, Any]:
        """transformers' hook for the rotary fields: one ``rope_parameters`` dict per layer kind, the thetas
        of older configs (``global_rope_theta``, ``local_rope_theta``) and ``rope_scaling`` read into them."""
        scaling = kwargs.pop("rope_scaling", None)
        parameters = dict(self.rope_parameters or {})
        thetas = {
            GLOBAL: kwargs.pop("global_rope_theta", DEFAULT_THETAS[GLOBAL]),
            WINDOW: kwargs.pop("local_rope_theta", DEFAULT_THETAS[WINDOW]),
        }
        for kind, theta in thetas.items():
            kind_parameters = {"rope_type": "default", **(parameters.get(kind) or {}), **(scaling or {})}
            kind_parameters.setdefault("rope_theta", theta)
            parameters[kind] = kind_parameters
        self.rope_parameters = parameters
        self.standardize_rope_params()
        return kwargs

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def window_attention_config(self) -> dict[str, Any]:
        """The hyperparameters of the window layers' ``local_attention_type``: ``local_attention_config`` over
        the type's own sliding window of ModernBERT's width (``2 (local_attention // 2)`` tokens, no global
        ones: the core's ``sliding_window_config``), where the type has one."""
        return {**self._sliding_window(), **(self.local_attention_config or {})}

    def _sliding_window(self) -> dict[str, Any]:
        """The local type's config entries for ModernBERT's window, {} for a type without a sliding window."""
        core = get_attention_class(self.local_attention_type, self.modality)
        return core.sliding_window_config(2 * (self.local_attention // 2)) or {}

    def attention_for_layer(self, layer_idx: int) -> tuple[str, dict[str, Any]]:
        """The (attention_type, attention_config) of layer ``layer_idx``: by its kind (the class docstring),
        or by ``layer_attention_types``."""
        if self.layer_attention_types is not None:
            attention_type, values = super().attention_for_layer(layer_idx)
            if not values and attention_type == self.local_attention_type:
                values = self.window_attention_config()
            return attention_type, values
        if self.layer_types[layer_idx] == WINDOW:
            return self.local_attention_type, self.window_attention_config()
        return self.attention_type, dict(self.attention_config or {})

    def rotary_frequencies(self, kind: str, device=None) -> tuple[torch.Tensor, float]:
        """(inverse frequencies (head_size / 2,), attention scaling) of the layers of ``kind``, from its
        ``rope_parameters`` (transformers' functions for a scaled rotary type)."""
        parameters = self.rope_parameters[kind]
        if parameters["rope_type"] == "default":
            return default_inverse_frequencies(self.head_size, parameters["rope_theta"]).to(device), 1.0
        return ROPE_INIT_FUNCTIONS[parameters["rope_type"]](self, device, layer_type=kind)

    def validate_modernbert_fields(self):
        """Class validator (after ``validate_attention``): ModernBERT's own fields, and every layer's type
        carries rotary positions (its config parsed), the window's as ModernBERT defines it."""
        for name in ("embedding_dropout", "mlp_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise InputError(f"{name} is a dropout probability, in [0, 1); got {getattr(self, name)}.")
        if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - {GLOBAL, WINDOW}:
            raise InputError(
                f"layer_types must name one kind per layer ({GLOBAL!r} or {WINDOW!r}) for "
                f"num_hidden_layers={self.num_hidden_layers}, got {self.layer_types}."
            )
        if self.local_attention < 2:
            raise InputError(
                f"local_attention={self.local_attention} is the window layers' width in tokens "
                "(local_attention // 2 keys on each side); give at least 2."
            )
        if self.classifier_pooling not in ("cls", "mean"):
            raise InputError(f"classifier_pooling must be 'cls' or 'mean', got {self.classifier_pooling!r}.")
        if self.classifier_activation not in ACT2FN:
            raise InputError(
                f"classifier_activation={self.classifier_activation!r} is not an activation transformers "
                f"knows; use one of {', '.join(sorted(ACT2FN))}."
            )
        if self.sparse_pred_ignore_index != -100:
            raise InputError(
                f"sparse_pred_ignore_index={self.sparse_pred_ignore_index}: the masked-LM labels' ignored "
                "id is -100 here (transformers' losses and the label checks read it); give the ignored "
                "positions the label -100."
            )
        self._validate_rotary_layers()

    def _validate_rotary_layers(self) -> None:
        """Each layer kind's rotary type is one whose frequencies are fixed, and every layer's attention
        carries rotary positions, the window layers' Longformer with ModernBERT's window. (The head size, even
        for rotary positions, is checked when a model is built, as transformers' configs accept any sizes.)"""
        fixed = sorted(set(ROPE_INIT_FUNCTIONS) - set(LENGTH_DEPENDENT_ROPE))
        for kind in set(self.layer_types):
            rope_type = self.rope_parameters[kind]["rope_type"]
            if rope_type != "default" and rope_type not in fixed:
                raise InputError(
                    f"rope_parameters[{kind!r}] has rope_type={rope_type!r}; the rotary types whose "
                    f"frequencies do not change with the length are supported: default, {', '.join(fixed)}."
                )
        window, given = self._sliding_window(), self.local_attention_config or {}
        for name in window.keys() & given.keys() - {"global_token_indices"}:
            if given[name] != window[name]:
                raise InputError(
                    f"local_attention_config {name}={given[name]} differs from ModernBERT's window, "
                    f"local_attention={self.local_attention}: set local_attention (which transformers' "
                    f"ModernBERT reads too) and leave {name} out."
                )
        for layer_idx in range(self.num_hidden_layers):
            attention_type, values = self.attention_for_layer(layer_idx)
            try:
                check_rotary_type(attention_type, self.modality)
            except ValueError as error:
                raise InputError(f"layer {layer_idx} ({self.layer_types[layer_idx]}): {error}") from None
            validate_attention_config(attention_type, values)
