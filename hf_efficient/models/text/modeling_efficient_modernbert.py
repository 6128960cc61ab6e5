"""EfficientModernBert: ModernBERT (Warner et al. 2024, "Smarter, Better, Faster, Longer") with any attention
that carries rotary positions; what differs from BERT lives here.

ModernBERT is a pre-norm encoder: ``x + Attn(attn_norm(x))`` (no norm before the first layer's attention),
then ``h + MLP(mlp_norm(h))``, a final norm after the last layer; its positions are rotary (RoPE, no position
table), with one theta for its global layers and another for its window layers; its attention projects
queries, keys and values with one fused ``Wqkv``, its feed-forward is a GeGLU (``Wi`` gives 2 x
intermediate_size: act(input) * gate), its norms and linear maps are bias-free as configured. Names are
transformers': ``model.embeddings.{tok_embeddings, norm}``, ``model.layers.N.{attn_norm, attn.Wqkv, attn.Wo,
mlp_norm, mlp.Wi, mlp.Wo}``, ``model.final_norm``; the heads' ``head.{dense, norm}``, ``decoder`` (tied to
the token embeddings), ``classifier``.

Its layers keep the checkpoint's pattern through our kernels: the window layers (``local_attention`` 128 =
64 keys on each side) run the Longformer window, the global ones exact attention, unless the config names
other types (:class:`EfficientModernBertConfig`). Padded batches are computed padded (as transformers' sdpa
path), or on the real tokens only with ``config.padding_free``; packed rows (``position_ids`` restarting at 0)
rotate each sequence by its own positions (docs/padding_free.md).

Shapes: b = batch, n = sequence length, D = hidden_size, I = intermediate_size, V = vocab_size.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer

from ...attention.inputs import AttentionInputs
from ...attention.rotary import RotaryPositions
from ...errors import InputError
from ...modeling.blocks import CoreAttention, EfficientLayerStack, check_heads_divide
from ...modeling.memory import CompactDropout, memory_saving_feed_forward
from .configuration_efficient_modernbert import EfficientModernBertConfig
from .encoder import EfficientTextModel, EfficientTextPreTrainedModel
from .tasks import (
    MaskedLMTask,
    MultipleChoiceTask,
    QuestionAnsweringTask,
    SequenceClassificationTask,
    TokenClassificationTask,
)


def norm(config: EfficientModernBertConfig) -> nn.LayerNorm:
    """ModernBERT's LayerNorm: ``norm_eps``, a bias only with ``norm_bias``."""
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


class EfficientModernBertEmbeddings(nn.Module):
    """Token embeddings, norm, dropout (no position table: the positions are rotary, in the attention)."""

    def __init__(self, config: EfficientModernBertConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(
            config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id
        )
        self.norm = norm(config)
        self.drop = CompactDropout(config.embedding_dropout)

    def forward(self, input_ids, token_type_ids, position_ids, inputs_embeds, past_length: int = 0):
        """(b, n, D): the ids' embeddings (or ``inputs_embeds``), normed; positions are the attention's."""
        embeds = self.tok_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        return self.drop(self.norm(embeds))


class EfficientModernBertAttention(CoreAttention):
    """The fused ``Wqkv`` projection, one core of the layer's type (given rotary positions) and ``Wo``."""

    def __init__(self, config: EfficientModernBertConfig, layer_idx: int):
        check_heads_divide(config.hidden_size, config.num_attention_heads)
        if config.head_size % 2:
            raise InputError(
                f"hidden_size / num_attention_heads = {config.head_size} must be even: rotary positions turn "
                "pairs of a head's dimensions. Choose sizes with an even head size."
            )
        super().__init__(config, layer_idx)
        width = config.hidden_size
        self.Wqkv = nn.Linear(width, 3 * width, bias=config.attention_bias)
        self.Wo = nn.Linear(width, width, bias=config.attention_bias)
        self.out_drop = CompactDropout(config.attention_dropout)

    def forward(
        self, hidden_states: torch.Tensor, inputs: AttentionInputs
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        b, n, _ = hidden_states.shape
        qkv = self.Wqkv(hidden_states).view(b, n, 3, self.num_heads, self.head_dim)  # (b, n, 3, h, d)
        query, key, value = (part.transpose(1, 2) for part in qkv.unbind(dim=2))  # (b, h, n, d) each
        attended, weights = self.attend(query, key, value, inputs)  # (b, n, D)
        return self.out_drop(self.Wo(attended)), weights


class EfficientModernBertMLP(nn.Module):
    """GeGLU: ``Wo(drop(act(input) * gate))`` with (input, gate) = ``Wi(x)``, (b, n, 2 I); added to the
    residual, the gated activation recomputed in backward on large inputs (``memory_saving_feed_forward``)."""

    def __init__(self, config: EfficientModernBertConfig):
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.act = ACT2FN[config.hidden_activation]
        self.drop = CompactDropout(config.mlp_dropout)
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def gated(self, projected: torch.Tensor) -> torch.Tensor:
        """(b, n, 2 I) -> (b, n, I): act(input) * gate."""
        input, gate = projected.chunk(2, dim=-1)
        return self.act(input) * gate

    def finish(self, activated: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return residual + self.Wo(self.drop(activated))

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return memory_saving_feed_forward(self, self.Wi, self.gated, self.finish, hidden_states, residual)


class EfficientModernBertLayer(GradientCheckpointingLayer):
    """One pre-norm layer: ``x + Attn(attn_norm(x))`` (``attn_norm`` is the identity in layer 0, whose input
    the embeddings normed), then ``h + MLP(mlp_norm(h))``."""

    def __init__(self, config: EfficientModernBertConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = nn.Identity() if layer_idx == 0 else norm(config)
        self.attn = EfficientModernBertAttention(config, layer_idx)
        self.mlp_norm = norm(config)
        self.mlp = EfficientModernBertMLP(config)

    def forward(
        self, hidden_states: torch.Tensor, inputs: AttentionInputs
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attended, weights = self.attn(self.attn_norm(hidden_states), inputs)
        hidden_states = hidden_states + attended
        return self.mlp(self.mlp_norm(hidden_states), hidden_states), weights


class EfficientModernBertPredictionHead(nn.Module):
    """``head``: dense -> ``classifier_activation`` -> norm, before the decoder or a classifier."""

    def __init__(self, config: EfficientModernBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = ACT2FN[config.classifier_activation]
        self.norm = norm(config)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(hidden_states)))


class EfficientModernBertPreTrainedModel(EfficientTextPreTrainedModel):
    config_class = EfficientModernBertConfig
    base_model_prefix = "model"
    _no_split_modules = ["EfficientModernBertEmbeddings", "EfficientModernBertLayer"]

    @torch.no_grad()
    def _init_weights(self, module):
        """ModernBERT's initialisation: truncated normals (at ``initializer_cutoff_factor`` standard
        deviations), the output maps scaled down by the depth, the classifiers by the width."""
        super()._init_weights(module)
        config = self.config
        std = config.initializer_range
        stds = {
            "in": std,
            "out": std / math.sqrt(2.0 * config.num_hidden_layers),
            "final": config.hidden_size**-0.5,
        }
        if isinstance(module, EfficientModernBertEmbeddings):
            targets = [(module.tok_embeddings, stds["in"])]
        elif isinstance(module, EfficientModernBertMLP):
            targets = [(module.Wi, stds["in"]), (module.Wo, stds["out"])]
        elif isinstance(module, EfficientModernBertAttention):
            targets = [(module.Wqkv, stds["in"]), (module.Wo, stds["out"])]
        elif isinstance(module, EfficientModernBertPredictionHead):
            targets = [(module.dense, stds["out"])]
        elif isinstance(module, EfficientModernBertForMaskedLM):
            targets = [(module.decoder, stds["out"])]
        elif isinstance(module, EfficientModernBertPreTrainedModel) and hasattr(module, "classifier"):
            targets = [(module.classifier, stds["final"])]
        else:
            return
        cutoff = config.initializer_cutoff_factor or 3.0
        for layer, layer_std in targets:
            init.trunc_normal_(
                layer.weight, mean=0.0, std=layer_std, a=-cutoff * layer_std, b=cutoff * layer_std
            )
            if isinstance(layer, nn.Linear) and layer.bias is not None:
                init.zeros_(layer.bias)


class EfficientModernBertModel(EfficientModernBertPreTrainedModel, EfficientTextModel):
    """The bare encoder: hidden states (b, n, D) after the final norm (transformers' ``ModernBertModel``)."""

    embeddings_class = EfficientModernBertEmbeddings
    layer_class = EfficientModernBertLayer
    has_pooler = False

    def build_layers(self, config) -> None:
        """ModernBERT's layout: ``layers.N`` and ``final_norm``."""
        self.layers = EfficientLayerStack(config, self.layer_class)
        self.final_norm = norm(config)

    def layer_stack(self) -> EfficientLayerStack:
        return self.layers

    def finish(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.final_norm(hidden_states)

    def get_input_embeddings(self):
        return self.embeddings.tok_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.tok_embeddings = value

    def layer_attention_inputs(self, inputs, hidden_states, position_ids) -> list[AttentionInputs]:
        """Each layer's inputs with the rotary positions of its kind (the theta of its ``layer_types``
        entry), computed once per kind: positions ``position_ids`` (b | 1, n), else 0 .. n - 1."""
        config, n = self.config, hidden_states.shape[1]
        if position_ids is None:
            position_ids = torch.arange(n, device=hidden_states.device)[None]
        kinds = {}
        for kind in set(config.layer_types):
            frequencies, scaling = config.rotary_frequencies(kind, hidden_states.device)
            kinds[kind] = inputs.replace(
                rotary=RotaryPositions.at(position_ids, frequencies, scaling, hidden_states.dtype)
            )
        return [kinds[kind] for kind in config.layer_types]


class ModernBertHeadModel(EfficientModernBertPreTrainedModel):
    """What every ModernBERT classifier shares: the encoder under ``model`` (no pooler), ``head`` (dense ->
    act -> norm), ``drop`` (``classifier_dropout``) and ``classifier`` (D -> :meth:`classifier_outputs`)."""

    bare_model_class = EfficientModernBertModel
    add_pooling_layer = False

    def classifier_outputs(self, config) -> int:
        """The classifier's outputs: ``num_labels`` (a multiple-choice head: 1, the choice's score)."""
        return config.num_labels

    def build_head(self, config) -> None:
        self.num_labels = config.num_labels
        self.head = EfficientModernBertPredictionHead(config)
        self.drop = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, self.classifier_outputs(config))

    def classify(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., width): classifier(drop(head(h)))."""
        return self.classifier(self.drop(self.head(hidden_states)))


def mean_pooled(hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """(b, n, D) -> (b, D): the mean over the real tokens (every token without a mask)."""
    if attention_mask is None:
        return hidden_states.mean(dim=1)
    mask = attention_mask.to(hidden_states.dtype)[..., None]  # (b, n, 1)
    return (hidden_states * mask).sum(dim=1) / mask.sum(dim=1)


class EfficientModernBertForMaskedLM(EfficientModernBertPreTrainedModel, MaskedLMTask):
    """ModernBERT's masked language model (transformers' ``ModernBertForMaskedLM``): ``head`` then
    ``decoder``, tied to the token embeddings; ``sparse_prediction`` scores the masked positions only."""

    bare_model_class = EfficientModernBertModel
    _tied_weights_keys = {"decoder.weight": "model.embeddings.tok_embeddings.weight"}

    def build_head(self, config) -> None:
        self.head = EfficientModernBertPredictionHead(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=config.decoder_bias)

    def lm_features(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.head(hidden_states)

    def get_output_embeddings(self):
        return self.decoder

    def set_output_embeddings(self, new_embeddings):
        self.decoder = new_embeddings


class EfficientModernBertForSequenceClassification(ModernBertHeadModel, SequenceClassificationTask):
    """The first token (``classifier_pooling="cls"``) or the mean of the real tokens (``"mean"``) -> head ->
    drop -> classifier (transformers' ``ModernBertForSequenceClassification``)."""

    def encode(self, input_ids, attention_mask, token_type_ids, inputs):
        outputs = super().encode(input_ids, attention_mask, token_type_ids, inputs)
        hidden = outputs.last_hidden_state  # (b, n, D)
        pooled = (
            hidden[:, 0] if self.config.classifier_pooling == "cls" else mean_pooled(hidden, attention_mask)
        )
        outputs["pooler_output"] = pooled  # (b, D)
        return outputs

    def sequence_logits(self, outputs) -> torch.Tensor:
        return self.classify(outputs.pooler_output)  # (b, num_labels)


class EfficientModernBertForTokenClassification(ModernBertHeadModel, TokenClassificationTask):
    """Every token -> head -> drop -> classifier (transformers' ``ModernBertForTokenClassification``)."""

    def token_logits(self, outputs) -> torch.Tensor:
        return self.classify(outputs.last_hidden_state)  # (b, n, num_labels)


class EfficientModernBertForQuestionAnswering(ModernBertHeadModel, QuestionAnsweringTask):
    """Every token -> head -> drop -> classifier, a start and an end logit (transformers'
    ``ModernBertForQuestionAnswering``)."""

    def span_logits(self, outputs) -> torch.Tensor:
        return self.classify(outputs.last_hidden_state)  # (b, n, 2)


class EfficientModernBertForMultipleChoice(ModernBertHeadModel, MultipleChoiceTask):
    """Each choice's first real token (``"cls"``: the first token of a right-padded choice, the first after
    the padding of a left-padded one) or mean -> head -> drop -> classifier, one score per choice
    (transformers' ``ModernBertForMultipleChoice``)."""

    def classifier_outputs(self, config) -> int:
        return 1

    def encode(self, input_ids, attention_mask, token_type_ids, inputs):
        outputs = super().encode(input_ids, attention_mask, token_type_ids, inputs)
        hidden = outputs.last_hidden_state  # (b c, n, D)
        mask = None if attention_mask is None else attention_mask.reshape(-1, hidden.shape[1])  # (b c, n)
        if self.config.classifier_pooling == "mean":
            outputs["pooler_output"] = mean_pooled(hidden, mask)
            return outputs
        first = torch.zeros(hidden.shape[0], dtype=torch.long, device=hidden.device)
        if mask is not None:
            first = mask.argmax(dim=-1).to(hidden.device)  # the first real token of each choice
        outputs["pooler_output"] = hidden[torch.arange(hidden.shape[0], device=hidden.device), first]
        return outputs

    def choice_logits(self, outputs) -> torch.Tensor:
        return self.classify(outputs.pooler_output)  # (b c, 1)
