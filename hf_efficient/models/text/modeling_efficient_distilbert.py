"""EfficientDistilBert: DistilBERT (Sanh et al. 2019) with any registered attention; what differs from BERT
lives here.

DistilBERT is a post-LayerNorm encoder with BERT's embeddings less the token types, its own names
(``distilbert.transformer.layer.N.attention.{q_lin, k_lin, v_lin, out_lin}``, ``sa_layer_norm``,
``ffn.{lin1, lin2}``, ``output_layer_norm``), no dropout after the attention's output projection, optional
sinusoidal positions, no pooler, and heads of its own (``vocab_transform`` / ``vocab_layer_norm`` /
``vocab_projector``; ``pre_classifier`` -> relu -> ``classifier``).

Shapes: b = batch, n = sequence length, D = dim (hidden_size), V = vocab_size.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer

from ...attention.inputs import AttentionInputs
from ...modeling.blocks import CoreAttention, EfficientEncoder, EfficientLayerStack
from ...modeling.memory import CompactDropout, memory_saving_feed_forward
from .configuration_efficient_distilbert import EfficientDistilBertConfig
from .encoder import EfficientTextModel, EfficientTextPreTrainedModel
from .modeling_efficient_bert import EfficientBertEmbeddings
from .tasks import (
    MaskedLMTask,
    MultipleChoiceTask,
    QuestionAnsweringTask,
    SequenceClassificationTask,
    TokenClassificationTask,
)

LAYER_NORM_EPS = 1e-12  # every DistilBERT LayerNorm's: not a field of its config


class EfficientDistilBertEmbeddings(EfficientBertEmbeddings):
    """BERT's embeddings (``word_embeddings``, ``position_embeddings``, ``LayerNorm``) without token types
    (``type_vocab_size`` 0), at DistilBERT's fixed LayerNorm epsilon."""

    layer_norm_eps = LAYER_NORM_EPS


def sinusoidal_positions(num_positions: int, dim: int) -> torch.Tensor:
    """(num_positions, dim) float32 table: sin(p / 10000^(2i / dim)) at column 2i, cos at 2i + 1 (DistilBERT's
    ``sinusoidal_pos_embds``; computed in float64, as transformers' numpy table)."""
    positions = torch.arange(num_positions, dtype=torch.float64)[:, None]  # (P, 1)
    rates = torch.pow(10000.0, 2 * (torch.arange(dim, dtype=torch.float64) // 2) / dim)  # (dim,)
    angles = positions / rates  # (P, dim)
    table = torch.empty(num_positions, dim, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(angles[:, 0::2]), torch.cos(angles[:, 1::2])
    return table.float()


class EfficientDistilBertAttention(CoreAttention):
    """DistilBERT's ``attention``: ``q_lin`` / ``k_lin`` / ``v_lin`` around one attention core, then
    ``out_lin`` (no dropout after it, unlike BERT). Cores that share queries and keys (Reformer) have no
    ``k_lin``."""

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        dim = config.hidden_size
        self.q_lin = nn.Linear(dim, dim)
        self.k_lin = None if self.shares_query_key else nn.Linear(dim, dim)
        self.v_lin = nn.Linear(dim, dim)
        self.out_lin = nn.Linear(dim, dim)

    def forward(
        self, hidden_states: torch.Tensor, inputs: AttentionInputs
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attended, weights = self.attend_projected(hidden_states, inputs, self.q_lin, self.k_lin, self.v_lin)
        return self.out_lin(attended), weights  # (b, n, D)


class EfficientDistilBertFeedForward(nn.Module):
    """DistilBERT's ``ffn``: ``lin1`` (D -> hidden_dim), ``activation``, ``lin2`` (hidden_dim -> D),
    ``dropout``; its layer adds the residual and the norm."""

    def __init__(self, config):
        super().__init__()
        self.dropout = CompactDropout(config.dropout)
        self.lin1 = nn.Linear(config.dim, config.hidden_dim)
        self.lin2 = nn.Linear(config.hidden_dim, config.dim)
        self.activation = ACT2FN[config.activation]


class EfficientDistilBertLayer(GradientCheckpointingLayer):
    """One DistilBERT layer (transformers' ``TransformerBlock``), post-LayerNorm:
    h = sa_layer_norm(x + out_lin(Attn(x))), then output_layer_norm(h + dropout(lin2(act(lin1(h)))))."""

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.attention = EfficientDistilBertAttention(config, layer_idx)
        self.sa_layer_norm = nn.LayerNorm(config.dim, eps=LAYER_NORM_EPS)
        self.ffn = EfficientDistilBertFeedForward(config)
        self.output_layer_norm = nn.LayerNorm(config.dim, eps=LAYER_NORM_EPS)

    def forward(
        self, hidden_states: torch.Tensor, inputs: AttentionInputs
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attended, weights = self.attention(hidden_states, inputs)
        attended = self.sa_layer_norm(attended + hidden_states)
        ffn = self.ffn
        return memory_saving_feed_forward(
            self, ffn.lin1, ffn.activation, self.finish, attended, attended
        ), weights

    def finish(self, activated: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """The feed-forward's end: (b, n, hidden_dim) -> (b, n, D), residual and norm."""
        return self.output_layer_norm(self.ffn.dropout(self.ffn.lin2(activated)) + residual)


class EfficientDistilBertPreTrainedModel(EfficientTextPreTrainedModel):
    config_class = EfficientDistilBertConfig
    base_model_prefix = "distilbert"
    _no_split_modules = ["EfficientDistilBertLayer"]

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        # The table itself, not the embeddings module: transformers skips the init of a module of code outside
        # its package whose own parameters (none, for the embeddings) are all initialised.
        if self.config.sinusoidal_pos_embds and module is self.get_position_embeddings():
            init.copy_(module.weight, sinusoidal_positions(*module.weight.shape).to(module.weight))

    @torch.no_grad()
    def resize_position_embeddings(self, new_length: int, reinitialize_fixed_length_attention: bool = False):
        """Serve longer inputs: a learned table is extended by copying its rows
        (:meth:`EfficientTextPreTrainedModel.resize_position_embeddings`); a sinusoidal one
        (``sinusoidal_pos_embds``) gets the sinusoids of the new positions, as transformers' DistilBERT."""
        super().resize_position_embeddings(new_length, reinitialize_fixed_length_attention)
        if self.config.sinusoidal_pos_embds:
            table = self.base_model.embeddings.position_embeddings.weight
            table.copy_(sinusoidal_positions(*table.shape).to(table))


class EfficientDistilBertModel(EfficientDistilBertPreTrainedModel, EfficientTextModel):
    """The bare encoder: BERT's embeddings without token types, DistilBERT's layers under
    ``transformer.layer.N``; hidden states (b, n, D). No pooler (``add_pooling_layer`` is accepted and
    ignored)."""

    embeddings_class = EfficientDistilBertEmbeddings
    layer_class = EfficientDistilBertLayer
    has_pooler = False

    def build_layers(self, config) -> None:
        self.transformer = EfficientEncoder(config, self.layer_class)

    def layer_stack(self) -> EfficientLayerStack:
        return self.transformer.layer


class EfficientDistilBertForMaskedLM(EfficientDistilBertPreTrainedModel, MaskedLMTask):
    """DistilBERT's masked language model (transformers' ``DistilBertForMaskedLM``): ``vocab_transform``
    (D -> D), ``activation``, ``vocab_layer_norm``, then ``vocab_projector`` (D -> V) tied to the word
    embeddings."""

    bare_model_class = EfficientDistilBertModel
    _tied_weights_keys = {"vocab_projector.weight": "distilbert.embeddings.word_embeddings.weight"}

    def build_head(self, config) -> None:
        self.activation = ACT2FN[config.activation]
        self.vocab_transform = nn.Linear(config.dim, config.dim)
        self.vocab_layer_norm = nn.LayerNorm(config.dim, eps=LAYER_NORM_EPS)
        self.vocab_projector = nn.Linear(config.dim, config.vocab_size)

    def lm_features(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.vocab_layer_norm(self.activation(self.vocab_transform(hidden_states)))  # (..., D)

    def get_output_embeddings(self):
        return self.vocab_projector

    def set_output_embeddings(self, new_embeddings):
        self.vocab_projector = new_embeddings


def build_pre_classifier_head(model: nn.Module, config, outputs: int) -> None:
    """DistilBERT's head on the first token: ``pre_classifier`` (D -> D), relu, ``dropout``
    (``seq_classif_dropout``), ``classifier`` (D -> ``outputs``)."""
    model.pre_classifier = nn.Linear(config.dim, config.dim)
    model.classifier = nn.Linear(config.dim, outputs)
    model.dropout = nn.Dropout(config.seq_classif_dropout)


def pre_classifier_logits(model: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """(b, n, D) -> (b, outputs): the head :func:`build_pre_classifier_head` built, on the first token."""
    first = torch.relu(model.pre_classifier(hidden_states[:, 0]))  # (b, D)
    return model.classifier(model.dropout(first))


class EfficientDistilBertForSequenceClassification(
    EfficientDistilBertPreTrainedModel, SequenceClassificationTask
):
    """The first token -> ``pre_classifier`` -> relu -> dropout -> ``classifier`` (transformers'
    ``DistilBertForSequenceClassification``)."""

    bare_model_class = EfficientDistilBertModel

    def build_head(self, config) -> None:
        self.num_labels = config.num_labels
        build_pre_classifier_head(self, config, config.num_labels)

    def sequence_logits(self, outputs) -> torch.Tensor:
        return pre_classifier_logits(self, outputs.last_hidden_state)  # (b, num_labels)


class EfficientDistilBertForMultipleChoice(EfficientDistilBertPreTrainedModel, MultipleChoiceTask):
    """The first token of every choice -> ``pre_classifier`` -> relu -> dropout -> ``classifier`` (D -> 1)
    (transformers' ``DistilBertForMultipleChoice``)."""

    bare_model_class = EfficientDistilBertModel

    def build_head(self, config) -> None:
        build_pre_classifier_head(self, config, 1)

    def choice_logits(self, outputs) -> torch.Tensor:
        return pre_classifier_logits(self, outputs.last_hidden_state)  # (b * c, 1)


class EfficientDistilBertForTokenClassification(EfficientDistilBertPreTrainedModel, TokenClassificationTask):
    """Every token -> dropout (``dropout``) -> ``classifier`` (transformers'
    ``DistilBertForTokenClassification``)."""

    bare_model_class = EfficientDistilBertModel

    def build_head(self, config) -> None:
        self.num_labels = config.num_labels
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(config.dim, config.num_labels)


class EfficientDistilBertForQuestionAnswering(EfficientDistilBertPreTrainedModel, QuestionAnsweringTask):
    """Every token -> dropout (``qa_dropout``) -> ``qa_outputs``: start and end logits (transformers'
    ``DistilBertForQuestionAnswering``)."""

    bare_model_class = EfficientDistilBertModel

    def build_head(self, config) -> None:
        self.dropout = nn.Dropout(config.qa_dropout)
        self.qa_outputs = nn.Linear(config.dim, 2)

    def span_logits(self, outputs) -> torch.Tensor:
        return self.qa_outputs(self.dropout(outputs.last_hidden_state))  # (b, n, 2)
