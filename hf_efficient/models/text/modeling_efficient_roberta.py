"""EfficientRoberta and EfficientXLMRoberta: RoBERTa (Liu et al. 2019) and XLM-RoBERTa (Conneau et al. 2020)
with any registered attention; what differs from BERT lives here.

RoBERTa is BERT's encoder with BERT's parameter names under ``roberta``; it differs in its positions
(fairseq's: counted from ``pad_token_id + 1`` over the real tokens, padding at ``pad_token_id``), its LM
head (``lm_head``: dense, gelu, ``layer_norm``, decoder) and its sentence classifier on ``<s>``
(``classifier.dense``, ``classifier.out_proj``) in place of BERT's pooler. XLM-RoBERTa is the
same model with another vocabulary: its classes are RoBERTa's with its config.

Shapes: b = batch, n = sequence length, D = hidden_size, V = vocab_size.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.activations import ACT2FN

from .configuration_efficient_roberta import EfficientRobertaConfig, EfficientXLMRobertaConfig
from .encoder import EfficientTextModel, EfficientTextPreTrainedModel
from .modeling_efficient_bert import EfficientBertEmbeddings
from .tasks import (
    CausalLMTask,
    FirstTokenSequenceClassificationTask,
    LanguageModelTask,
    MaskedLMTask,
    MultipleChoiceTask,
    QuestionAnsweringTask,
    TokenClassificationTask,
)


class EfficientRobertaEmbeddings(EfficientBertEmbeddings):
    """BERT's embeddings with RoBERTa's positions: real tokens count from ``pad_token_id + 1``, padding
    tokens sit at ``pad_token_id`` (a row that gets no gradient), so a left-padded batch gives every sequence
    the positions it has alone."""

    def __init__(self, config):
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.position_offset = self.padding_idx + 1  # rows below it are not positions of real tokens
        width = self.position_embeddings.embedding_dim
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, width, self.padding_idx)

    def default_position_ids(self, input_ids, n: int, past_length: int, device) -> torch.Tensor:
        """(b, n) positions from the ids (fairseq's ``make_positions``: ``pad_token_id`` at padding, the
        real tokens from ``pad_token_id + 1 + past_length`` on), or (1, n) sequential ones for
        ``inputs_embeds``."""
        self.check_length(n, past_length)
        if input_ids is None:
            start = self.position_offset + past_length
            return torch.arange(start, start + n, device=device)[None]
        real = input_ids.ne(self.padding_idx).int()  # (b, n)
        return ((torch.cumsum(real, dim=1) + past_length) * real).long() + self.padding_idx


class EfficientRobertaPreTrainedModel(EfficientTextPreTrainedModel):
    config_class = EfficientRobertaConfig
    base_model_prefix = "roberta"

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, EfficientRobertaLMHead):
            nn.init.zeros_(module.bias)


class EfficientRobertaModel(EfficientRobertaPreTrainedModel, EfficientTextModel):
    """The bare encoder: hidden states (b, n, D) and, with ``add_pooling_layer``, the pooled ``<s>``."""

    embeddings_class = EfficientRobertaEmbeddings


class EfficientRobertaLMHead(nn.Module):
    """RoBERTa's MLM head (``lm_head``): dense -> gelu -> ``layer_norm`` -> decoder tied to the word
    embeddings."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.activation = ACT2FN["gelu"]  # RoBERTa's head is gelu whatever hidden_act says

    def transformed(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(self.activation(self.dense(hidden_states)))  # (..., D) -> (..., D)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transformed(hidden_states))  # (..., D) -> (..., V)


class EfficientRobertaLanguageModel(EfficientRobertaPreTrainedModel, LanguageModelTask):
    """The encoder under RoBERTa's LM head (``roberta.*``, ``lm_head.*``), shared by the masked and the causal
    language model."""

    bare_model_class = EfficientRobertaModel
    _tied_weights_keys = {
        "lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight",
        "lm_head.decoder.bias": "lm_head.bias",
    }

    def build_head(self, config) -> None:
        self.lm_head = EfficientRobertaLMHead(config)

    def lm_features(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head.transformed(hidden_states)

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        self.lm_head.decoder = new_embeddings
        self.lm_head.bias = new_embeddings.bias


class EfficientRobertaForMaskedLM(EfficientRobertaLanguageModel, MaskedLMTask):
    """RoBERTa's masked language model (transformers' ``RobertaForMaskedLM``)."""


class EfficientRobertaForCausalLM(EfficientRobertaLanguageModel, CausalLMTask):
    """RoBERTa as a causal language model (transformers' ``RobertaForCausalLM``: ``is_decoder=True``)."""


class EfficientRobertaForSequenceClassification(
    EfficientRobertaPreTrainedModel, FirstTokenSequenceClassificationTask
):
    """``<s>`` -> dense -> tanh -> linear (``classifier``, transformers' ``RobertaClassificationHead``)."""

    bare_model_class = EfficientRobertaModel
    classifier_activation = "tanh"


class EfficientRobertaForMultipleChoice(EfficientRobertaPreTrainedModel, MultipleChoiceTask):
    """The pooled ``<s>`` -> dropout -> linear, one score per choice (transformers'
    ``RobertaForMultipleChoice``, whose dropout is ``hidden_dropout_prob``)."""

    bare_model_class = EfficientRobertaModel

    def build_head(self, config) -> None:
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, 1)


class EfficientRobertaForTokenClassification(EfficientRobertaPreTrainedModel, TokenClassificationTask):
    """Every token -> dropout -> linear (transformers' ``RobertaForTokenClassification``)."""

    bare_model_class = EfficientRobertaModel


class EfficientRobertaForQuestionAnswering(EfficientRobertaPreTrainedModel, QuestionAnsweringTask):
    """Start and end logits of every token (transformers' ``RobertaForQuestionAnswering``)."""

    bare_model_class = EfficientRobertaModel


class XLMRobertaFamily:
    """XLM-RoBERTa's classes are RoBERTa's with XLM-RoBERTa's config (transformers' are copies of
    RoBERTa's)."""

    config_class = EfficientXLMRobertaConfig


class EfficientXLMRobertaModel(XLMRobertaFamily, EfficientRobertaModel):
    """The bare XLM-RoBERTa encoder (transformers' ``XLMRobertaModel``)."""


class EfficientXLMRobertaLanguageModel(XLMRobertaFamily, EfficientRobertaLanguageModel):
    bare_model_class = EfficientXLMRobertaModel


class EfficientXLMRobertaForMaskedLM(EfficientXLMRobertaLanguageModel, MaskedLMTask):
    """transformers' ``XLMRobertaForMaskedLM``."""


class EfficientXLMRobertaForCausalLM(EfficientXLMRobertaLanguageModel, CausalLMTask):
    """transformers' ``XLMRobertaForCausalLM``."""


class EfficientXLMRobertaForSequenceClassification(
    XLMRobertaFamily, EfficientRobertaForSequenceClassification
):
    """transformers' ``XLMRobertaForSequenceClassification``."""

    bare_model_class = EfficientXLMRobertaModel


class EfficientXLMRobertaForMultipleChoice(XLMRobertaFamily, EfficientRobertaForMultipleChoice):
    """transformers' ``XLMRobertaForMultipleChoice``."""

    bare_model_class = EfficientXLMRobertaModel


class EfficientXLMRobertaForTokenClassification(XLMRobertaFamily, EfficientRobertaForTokenClassification):
    """transformers' ``XLMRobertaForTokenClassification``."""

    bare_model_class = EfficientXLMRobertaModel


class EfficientXLMRobertaForQuestionAnswering(XLMRobertaFamily, EfficientRobertaForQuestionAnswering):
    """transformers' ``XLMRobertaForQuestionAnswering``."""

    bare_model_class = EfficientXLMRobertaModel
