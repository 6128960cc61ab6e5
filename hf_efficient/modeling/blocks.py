"""Encoder blocks shared by the text, vision and graph models.

Parameter names follow BERT (``attention.self.query``, ``attention.output.dense``, ``intermediate.dense``,
``output.LayerNorm`` ...), so a BERT checkpoint maps onto an encoder of any attention type with no renaming:
only the attention core's own parameters (``attention.self.core.*``) are new.

Every layer takes the hidden states and one :class:`~hf_efficient.attention.inputs.AttentionInputs` (padding
mask, bias, edges, flags, patch grid, kernel), built and checked once by the model's forward and passed
down unchanged to every core.

Training memory: the dropouts are :class:`~hf_efficient.modeling.memory.CompactDropout` and the feed-forward
runs through :func:`~hf_efficient.modeling.memory.feed_forward` (the same maths as ``nn.Dropout`` and
``output(intermediate(x))``, keeping less for backward on large inputs).

Shapes: b = batch, n = sequence length, D = hidden_size, h = heads, d = D / h.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.activations import ACT2FN
from transformers.cache_utils import EncoderDecoderCache
from transformers.modeling_layers import GradientCheckpointingLayer

from ..attention.base import AttentionCore, AttentionSpec
from ..attention.inputs import AttentionInputs
from ..attention.registry import build_attention, get_attention_class
from ..attention.relative import RELATIVE_POSITION_TYPES, RelativePositions
from ..compat import attn_implementation
from ..errors import InputError
from .memory import CompactDropout, feed_forward


def check_heads_divide(hidden_size: int, num_heads: int, prefix: str = "") -> None:
    """Raise unless ``hidden_size`` splits into ``num_heads`` equal heads. Checked when a model is built, as
    transformers' BERT and ViT do (their configs accept any sizes); ``prefix`` names the fields (MAE's
    ``decoder_``)."""
    if hidden_size % num_heads:
        hidden, heads = f"{prefix}hidden_size", f"{prefix}num_attention_heads"
        raise InputError(
            f"{hidden}={hidden_size} is not a multiple of {heads}={num_heads}: each head gets {hidden} / "
            f"{heads} features. Set {hidden} to a multiple of {num_heads} (e.g. "
            f"{num_heads * max(1, round(hidden_size / num_heads))}) or {heads} to a divisor of {hidden_size}."
        )


class CoreAttention(nn.Module):
    """A module that owns one attention core: builds it from the config, splits (b, n, D) projections into
    heads and attends with it (checkpointed when asked). Every family's attention module derives from it and
    adds its projections under its own names: BERT's and ViT's ``query`` / ``key`` / ``value``
    (:class:`EfficientSelfAttention`), DistilBERT's ``q_lin`` ..., ModernBERT's fused ``Wqkv``.

    The core is chosen by ``config.attention_for_layer(layer_idx)``.
    """

    cross_attention = False  # keys and values from another sequence (EfficientCrossAttention)

    def __init__(self, config, layer_idx: int):
        super().__init__()
        check_heads_divide(config.hidden_size, config.num_attention_heads)
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.core: AttentionCore = self.build_core()
        # Set by EfficientPreTrainedModel.attention_checkpointing_enable; a training choice, not saved.
        self.checkpoint_core = False

    @property
    def shares_query_key(self) -> bool:
        """True for cores whose keys are the queries (Reformer): the module builds no key projection."""
        return self.core.capabilities.shared_query_key

    def attention_for_layer(self) -> tuple[str, dict]:
        """(attention_type, attention_config) of this module's core; subclasses may pick another source
        (the graph encoder's local attention reads ``config.local_attention_type``)."""
        return self.config.attention_for_layer(self.layer_idx)

    def build_core(self) -> AttentionCore:
        """A fresh core for this layer from the config (type, hyperparameters, sizes, max length)."""
        config = self.config
        attention_type, attention_config = self.attention_for_layer()
        spec = AttentionSpec(
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            dropout=config.attention_probs_dropout_prob,
            attn_implementation=attn_implementation(config) or "sdpa",
            max_seq_len=getattr(config, "max_position_embeddings", None),
            layer_idx=self.layer_idx,
            causal=getattr(config, "is_decoder", False) and not self.cross_attention,
            cross_attention=self.cross_attention,
        )
        return build_attention(attention_type, spec, attention_config, config.modality)

    def rebuild_core(self) -> None:
        """A fresh core in place of this one, on the device and floating dtype of the module's projections
        (a bf16 model gets a bf16 core): after a change of the length the core is sized by."""
        projection = next(p for name, p in self.named_parameters() if not name.startswith("core."))
        self.core = self.build_core().to(projection)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)  # (b, n, D) -> (b, h, n, d)

    def attend_projected(
        self, hidden_states: torch.Tensor, inputs, query: nn.Module, key: nn.Module | None, value: nn.Module
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The core on the heads of ``query`` / ``key`` / ``value`` (D -> D maps, under the family's names) of
        (b, n, D) hidden states; ``key`` None where the core shares queries and keys (Reformer: the keys are
        the queries). Returns ((b, n, D), weights)."""
        queries = self.split_heads(query(hidden_states))  # (b, h, n, d)
        keys = queries if key is None else self.split_heads(key(hidden_states))
        return self.attend(queries, keys, self.split_heads(value(hidden_states)), inputs)

    def attend(self, query, key, value, inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The core on (b, h, n, d) heads, checkpointed when asked; returns ((b, n, D), weights)."""
        if self.checkpoint_core and self.training and torch.is_grad_enabled():
            # Keep query, key and value only; the core runs again in backward (same RNG state: dropout too).
            # A shared key (Reformer) travels as None: the recomputation may get copies of the arguments,
            # and the core checks that its key *is* its query.
            shared = None if key is query else key
            output, weights = checkpoint(self._core_call, query, shared, value, inputs, use_reentrant=False)
        else:
            output, weights = self.core(query, key, value, inputs)
        b, _, n, _ = output.shape
        return output.transpose(1, 2).reshape(b, n, -1), weights  # (b, h, n, d) -> (b, n, D)

    def _core_call(self, query, key, value, inputs):
        return self.core(query, query if key is None else key, value, inputs)


class EfficientSelfAttention(CoreAttention):
    """Query/key/value projections around one attention core (BERT's ``attention.self``, ViT's
    ``attention.attention``). Cores that share queries and keys (Reformer) have no ``key`` projection: their
    keys are the queries. With BERT's relative positions (``config.position_embedding_type``
    ``"relative_key"`` / ``"relative_key_query"``) the self-attention owns the layer's distance table,
    ``distance_embedding`` ((2 max_position_embeddings - 1, d), BERT's name), and passes it to its core with
    every call (:class:`~hf_efficient.attention.relative.RelativePositions`)."""

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = None if self.shares_query_key else nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        position_type = getattr(config, "position_embedding_type", "absolute")
        self.distance_embedding = None  # BERT builds none for cross-attention either
        if position_type in RELATIVE_POSITION_TYPES and not self.cross_attention:
            self.distance_embedding = nn.Embedding(2 * config.max_position_embeddings - 1, self.head_dim)
            self.relative_keys_too = RELATIVE_POSITION_TYPES[position_type]

    def forward(
        self, hidden_states: torch.Tensor, inputs: AttentionInputs
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.distance_embedding is not None:
            table = self.distance_embedding.weight
            inputs = inputs.replace(relative_positions=RelativePositions(table, self.relative_keys_too))
        return self.attend_projected(hidden_states, inputs, self.query, self.key, self.value)


@dataclass(frozen=True)
class CrossAttentionInputs:
    """What the cross-attention of every decoder layer reads besides the encoder's states (which travel as a
    positional tensor, so that reentrant gradient checkpointing sees them), built once per forward.

    Attributes:
        inputs: the :class:`AttentionInputs` of the keys: the encoder's padding (b, m), the kernel.
        cache: transformers' ``EncoderDecoderCache`` while generating: its ``cross_attention_cache`` keeps
            each layer's projected keys and values, computed at the first step, then reused.
    """

    inputs: AttentionInputs
    cache: EncoderDecoderCache | None = None


class EfficientCrossAttention(EfficientSelfAttention):
    """BERT's ``crossattention.self``: queries of the decoder's states, keys and values of the encoder's, one
    core of ``config.cross_attention_type`` built for cross-attention (``AttentionSpec.cross_attention``: a
    type that cannot attend to another sequence is refused with its reason)."""

    cross_attention = True

    def attention_for_layer(self) -> tuple[str, dict]:
        return self.config.cross_attention_type, dict(self.config.cross_attention_config or {})

    def forward(
        self, hidden_states: torch.Tensor, cross: CrossAttentionInputs, encoder_hidden_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Decoder states (b, n, D) attend to the encoder's (b, m, D)."""
        query = self.split_heads(self.query(hidden_states))  # (b, h, n, d)
        cache, idx = cross.cache, self.layer_idx
        if cache is not None and cache.is_updated.get(idx):  # generating: the keys of the first step
            layer = cache.cross_attention_cache.layers[idx]
            key, value = layer.keys, layer.values  # (b, h, m, d)
        else:
            key = self.split_heads(self.key(encoder_hidden_states))  # (b, h, m, d)
            value = self.split_heads(self.value(encoder_hidden_states))
            if cache is not None:
                key, value = cache.cross_attention_cache.update(key, value, idx)
                cache.is_updated[idx] = True
        return self.attend(query, key, value, cross.inputs)


class EfficientSelfOutput(nn.Module):
    """Output projection, dropout, residual and post-LayerNorm (BERT's ``attention.output``)."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = CompactDropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + residual)


class EfficientAttention(nn.Module):
    """BERT's attention block: ``self`` (projections + core) and ``output`` (dense, residual, LayerNorm).

    ``self_attention_class`` lets a model pick where the core's type comes from (the graph encoder's local
    attention subclasses :class:`EfficientSelfAttention`).
    """

    def __init__(self, config, layer_idx: int, self_attention_class: type[nn.Module] | None = None):
        super().__init__()
        self.self = (self_attention_class or EfficientSelfAttention)(config, layer_idx)
        self.output = EfficientSelfOutput(config)

    def forward(self, hidden_states, inputs, *context) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``inputs``: the :class:`AttentionInputs` (a cross-attention's :class:`CrossAttentionInputs`,
        with the encoder's states as ``context``)."""
        attended, weights = self.self(hidden_states, inputs, *context)
        return self.output(attended, hidden_states), weights


class EfficientIntermediate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(hidden_states))


class EfficientOutput(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = CompactDropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + residual)


class EfficientLayer(GradientCheckpointingLayer):
    """One post-LayerNorm transformer layer: attention, then the feed-forward network. A decoder with
    ``config.add_cross_attention`` attends to the encoder's states in between (BERT's ``crossattention``:
    the same block, its core built for another sequence)."""

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.attention = EfficientAttention(config, layer_idx)
        if getattr(config, "add_cross_attention", False):
            self.crossattention = EfficientAttention(config, layer_idx, EfficientCrossAttention)
        self.intermediate = EfficientIntermediate(config)
        self.output = EfficientOutput(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        inputs: AttentionInputs,
        encoder_hidden_states: torch.Tensor | None = None,
        cross: CrossAttentionInputs | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attention_output, weights = self.attention(hidden_states, inputs)
        if encoder_hidden_states is not None:
            attention_output, _ = self.crossattention(attention_output, cross, encoder_hidden_states)
        return feed_forward(self, attention_output, attention_output), weights


class EfficientPreNormSelfOutput(nn.Module):
    """ViT's ``attention.output``: output projection and dropout; the residual is added by the layer."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = CompactDropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.dense(hidden_states))


class EfficientPreNormAttention(nn.Module):
    """ViT's attention block: ``attention.attention`` (projections + core, as BERT's) and ``output``."""

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.attention = EfficientSelfAttention(config, layer_idx)
        self.output = EfficientPreNormSelfOutput(config)

    def forward(self, hidden_states, inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        context, weights = self.attention(hidden_states, inputs)
        return self.output(context), weights


class EfficientPreNormOutput(nn.Module):
    """ViT's ``output``: the FFN's second projection, dropout and the residual (no LayerNorm)."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.dropout = CompactDropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.dense(hidden_states)) + residual


class EfficientPreNormLayer(GradientCheckpointingLayer):
    """One pre-LayerNorm layer (ViT): x + Attn(LN(x)), then h + FFN(LN(h)).

    Parameter names are ViT's (``attention.attention.query``, ``attention.output.dense``,
    ``layernorm_before``, ``intermediate.dense``, ``output.dense``, ``layernorm_after``), so ViT and ViT-MAE
    checkpoints load without renaming; the projections and the core are the same modules as BERT's layer.
    """

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.attention = EfficientPreNormAttention(config, layer_idx)
        self.layernorm_before = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.intermediate = EfficientIntermediate(config)
        self.output = EfficientPreNormOutput(config)
        self.layernorm_after = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(
        self, hidden_states: torch.Tensor, inputs: AttentionInputs
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attention_output, weights = self.attention(self.layernorm_before(hidden_states), inputs)
        hidden_states = attention_output + hidden_states
        return feed_forward(self, self.layernorm_after(hidden_states), hidden_states), weights


class EfficientLayerStack(nn.ModuleList):
    """The layers of an encoder (``layer_class(config, i)`` for each layer i), run in order; collects hidden
    states and attention weights on request. A module list, so a family names it as its checkpoints do:
    BERT's and ViT's ``encoder.layer.N`` (:class:`EfficientEncoder`), DistilBERT's ``transformer.layer.N``,
    ModernBERT's ``layers.N``.
    """

    def __init__(self, config, layer_class: type[nn.Module] = EfficientLayer):
        super().__init__(layer_class(config, i) for i in range(config.num_hidden_layers))
        self.tie_attention_parameters()

    def self_attentions(self) -> list[CoreAttention]:
        """The projections + core of every layer (``attention.self``, or ViT's ``attention.attention``; a
        decoder's ``crossattention.self`` too)."""
        return [module for module in self.modules() if isinstance(module, CoreAttention)]

    def attention_cores(self) -> list[AttentionCore]:
        return [attention.core for attention in self.self_attentions()]

    def rebuild_fixed_length_cores(self) -> None:
        """Rebuild, freshly initialised, the cores sized by the maximum length (after it changed)."""
        for attention in self.self_attentions():
            if attention.core.capabilities.fixed_max_length:
                attention.rebuild_core()
        self.tie_attention_parameters()

    def tie_attention_parameters(self) -> None:
        """Cross-layer sharing (Linformer layerwise): each core may share the parameters of the first core of
        its type (layer 0's, or with per-layer types the first layer using that type).

        Called at construction and again by the model's ``tie_weights`` (loading on the meta device
        replaces parameters, which would break the sharing).
        """
        first_of_type: dict[type, AttentionCore] = {}
        for core in self.attention_cores():
            first = first_of_type.setdefault(type(core), core)
            if first is not core:
                core.share_parameters_with(first)
        # transformers' save_pretrained refuses shared tensors unless a module declares them in
        # `_tied_weights_keys` ({target: source}, names relative to the declaring module); it then saves the
        # source only, and the model's tie_weights re-ties the target on load.
        self._tied_weights_keys = self.shared_parameter_names()

    def shared_parameter_names(self) -> dict[str, str]:
        """{target: source} names (relative to the stack) of parameters shared by several layers."""
        first_name: dict[int, str] = {}
        shared = {}
        for name, param in self.named_parameters(remove_duplicate=False):
            if id(param) in first_name:
                shared[name] = first_name[id(param)]
            else:
                first_name[id(param)] = name
        return shared

    def forward(
        self,
        hidden_states: torch.Tensor,
        inputs: AttentionInputs,
        output_hidden_states: bool = False,
        encoder_hidden_states: torch.Tensor | None = None,
        cross: CrossAttentionInputs | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None, tuple[torch.Tensor, ...] | None]:
        """Returns (last hidden state (b, n, D), all hidden states or None, attention weights or None); with
        ``encoder_hidden_states`` (b, m, D) and ``cross``, every layer also attends to the encoder's states
        (a decoder with cross-attention)."""
        all_hidden, all_weights = [], []
        for layer in self:
            if output_hidden_states:
                all_hidden.append(hidden_states)
            # hidden_states (and the encoder's) positional: gradient checkpointing (use_reentrant) propagates
            # their gradient. Layers without cross-attention take two arguments.
            extra = () if encoder_hidden_states is None else (encoder_hidden_states, cross)
            hidden_states, weights = layer(hidden_states, inputs, *extra)
            all_weights.append(weights)
        if output_hidden_states:
            all_hidden.append(hidden_states)
        return (
            hidden_states,
            tuple(all_hidden) if output_hidden_states else None,
            tuple(all_weights) if inputs.output_attentions else None,
        )


class EfficientEncoder(nn.Module):
    """BERT's and ViT's ``encoder`` (DistilBERT's ``transformer``): the :class:`EfficientLayerStack` under the
    name ``layer`` (layers of ``layer_class``: BERT's post-LayerNorm :class:`EfficientLayer`, ViT's
    :class:`EfficientPreNormLayer`, DistilBERT's...)."""

    def __init__(self, config, layer_class: type[nn.Module] = EfficientLayer):
        super().__init__()
        self.config = config
        self.layer = EfficientLayerStack(config, layer_class)

    def forward(self, *args, **kwargs):
        """:meth:`EfficientLayerStack.forward`."""
        return self.layer(*args, **kwargs)


def attention_types_in(config) -> list[str]:
    """Distinct attention types used by a config's layers, in layer order."""
    names = [config.attention_for_layer(i)[0] for i in range(config.num_hidden_layers)]
    return list(dict.fromkeys(names))


def papers_of(config) -> dict[str, str]:
    """attention_type -> paper citation, for model cards and error messages."""
    return {name: get_attention_class(name).paper for name in attention_types_in(config)}
