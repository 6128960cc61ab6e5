"""EfficientElectra: ELECTRA (Clark et al. 2020) with any registered attention; what differs from BERT lives
here.

ELECTRA is BERT's encoder under ``electra`` with embeddings of their own width (``embedding_size``), projected
to ``hidden_size`` by ``embeddings_project`` when the two differ, and no pooler. Its heads: the
discriminator (``discriminator_predictions``: is each token the original or a replacement?), the generator's
LM head (``generator_predictions`` at ``embedding_size``, then ``generator_lm_head`` tied to the word
embeddings; the masked and the causal LM), a gelu classifier on the first token, and the multiple-choice
head's sequence summary. The heads' activations are ELECTRA's: the discriminator uses ``hidden_act``, the
generator and the classifier gelu whatever ``hidden_act`` says.

Shapes: b = batch, n = sequence length, D = hidden_size, E = embedding_size, V = vocab_size.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from transformers import AutoModelForPreTraining
from transformers.activations import ACT2FN
from transformers.models.electra.modeling_electra import ElectraForPreTrainingOutput

from ...modeling.checks import IGNORE_INDEX, check_class_labels
from .configuration_efficient_electra import EfficientElectraConfig
from .encoder import EfficientTextModel, EfficientTextPreTrainedModel
from .modeling_efficient_bert import EfficientBertEmbeddings
from .tasks import (
    CausalLMTask,
    FirstTokenSequenceClassificationTask,
    LanguageModelTask,
    MaskedLMTask,
    MultipleChoiceTask,
    QuestionAnsweringTask,
    TextTaskModel,
    TokenClassificationTask,
)


class EfficientElectraPreTrainedModel(EfficientTextPreTrainedModel):
    config_class = EfficientElectraConfig
    base_model_prefix = "electra"


class EfficientElectraModel(EfficientElectraPreTrainedModel, EfficientTextModel):
    """The bare encoder: BERT's embeddings at ``embedding_size``, ``embeddings_project`` (E -> D, only when
    E != D), BERT's layers (``encoder.layer.N``); hidden states (b, n, D). No pooler (ELECTRA has none:
    ``add_pooling_layer`` is accepted and ignored)."""

    embeddings_class = EfficientBertEmbeddings
    has_pooler = False

    def build_layers(self, config) -> None:
        """The projection of the embeddings to the layers' width (where it is another), then BERT's layers."""
        self.embeddings_project = None
        if config.embedding_size != config.hidden_size:
            self.embeddings_project = nn.Linear(config.embedding_size, config.hidden_size)
        super().build_layers(config)

    def project(self, embeddings: torch.Tensor) -> torch.Tensor:
        """(b, n, E) -> (b, n, D)."""
        return embeddings if self.embeddings_project is None else self.embeddings_project(embeddings)


class EfficientElectraGeneratorPredictions(nn.Module):
    """The generator's head before its decoder (``generator_predictions``): dense (D -> E), gelu,
    ``LayerNorm``."""

    def __init__(self, config):
        super().__init__()
        self.activation = ACT2FN["gelu"]  # ELECTRA's generator head is gelu whatever hidden_act says
        self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.activation(self.dense(hidden_states)))  # (..., D) -> (..., E)


class EfficientElectraLanguageModel(EfficientElectraPreTrainedModel, LanguageModelTask):
    """The encoder under ELECTRA's generator head (``electra.*``, ``generator_predictions.*``,
    ``generator_lm_head``: E -> V, its weight the word embeddings), shared by the masked and the causal LM."""

    bare_model_class = EfficientElectraModel
    _tied_weights_keys = {"generator_lm_head.weight": "electra.embeddings.word_embeddings.weight"}

    def build_head(self, config) -> None:
        self.generator_predictions = EfficientElectraGeneratorPredictions(config)
        self.generator_lm_head = nn.Linear(config.embedding_size, config.vocab_size)

    def lm_features(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.generator_predictions(hidden_states)

    def get_output_embeddings(self):
        return self.generator_lm_head

    def set_output_embeddings(self, new_embeddings):
        self.generator_lm_head = new_embeddings


class EfficientElectraForMaskedLM(EfficientElectraLanguageModel, MaskedLMTask):
    """ELECTRA's generator, a masked language model (transformers' ``ElectraForMaskedLM``)."""


class EfficientElectraForCausalLM(EfficientElectraLanguageModel, CausalLMTask):
    """ELECTRA's generator as a causal language model (transformers' ``ElectraForCausalLM``:
    ``is_decoder=True``)."""


class EfficientElectraDiscriminatorPredictions(nn.Module):
    """The discriminator's head (``discriminator_predictions``): dense (D -> D), ``hidden_act``,
    ``dense_prediction`` (D -> 1): one logit per token, > 0 = replaced. (b, n, D) -> (b, n)."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACT2FN[config.hidden_act]
        self.dense_prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dense_prediction(self.activation(self.dense(hidden_states))).squeeze(-1)


def replaced_token_loss(
    owner: str, logits: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """ELECTRA's discriminator loss, as transformers': binary cross-entropy of the (b, n) logits against the
    (b, n) labels (1 = replaced, 0 = original), averaged over the real tokens (``attention_mask`` 1; every
    token without a mask). A label of -100 is no target; 0, not NaN, where no position has one."""
    check_class_labels(
        owner, labels, 2, logits.shape, "(batch, seq) of the inputs",
        classes="2 classes (0 = original token, 1 = replaced)",
        fix="Discriminator labels hold one id per input token: 1 where the generator replaced the token, 0 "
        "where it is the original (-100: no target).",
    )  # fmt: skip
    scored = labels != IGNORE_INDEX  # (b, n)
    if attention_mask is not None:
        scored = scored & (attention_mask.reshape(logits.shape) == 1)
    targets = labels.clamp(min=0).to(logits.dtype)
    per_token = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    return (per_token * scored).sum() / scored.sum().clamp(min=1)


class EfficientElectraForPreTraining(EfficientElectraPreTrainedModel, TextTaskModel):
    """ELECTRA's discriminator (transformers' ``ElectraForPreTraining``): for every token, a logit that it
    was replaced by the generator (> 0) rather than original."""

    auto_class = AutoModelForPreTraining
    bare_model_class = EfficientElectraModel

    def build_head(self, config) -> None:
        self.discriminator_predictions = EfficientElectraDiscriminatorPredictions(config)

    def task_output(self, outputs, labels, inputs) -> ElectraForPreTrainingOutput:
        """``labels``: (b, n) 1 where the token was replaced, 0 where original (-100: no target); the loss is
        :func:`replaced_token_loss`."""
        logits = self.discriminator_predictions(outputs.last_hidden_state)  # (b, n)
        loss = None
        if labels is not None:
            loss = replaced_token_loss(type(self).__name__, logits, labels, inputs["attention_mask"])
        return ElectraForPreTrainingOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class EfficientElectraForSequenceClassification(
    EfficientElectraPreTrainedModel, FirstTokenSequenceClassificationTask
):
    """The first token -> dropout -> dense -> gelu -> dropout -> ``out_proj`` (``classifier``, transformers'
    ``ElectraClassificationHead``: gelu whatever ``hidden_act`` says)."""

    bare_model_class = EfficientElectraModel
    classifier_activation = "gelu"


class EfficientElectraSequenceSummary(nn.Module):
    """The multiple-choice head's summary of a sequence (``sequence_summary``, transformers'
    ``ElectraSequenceSummary``): the vector at the position ``summary_type`` picks, ``summary_first_dropout``,
    the ``summary`` projection (D -> D, with ``summary_use_proj``), ``summary_activation``,
    ``summary_last_dropout``. (b, n, D) -> (b, D).

    ``"last"`` and ``"mean"`` read every position, padding included, as transformers' do (``"last"`` is a
    real token under left padding only). A padded position holds another value here than in transformers
    (its attention row is 0 under every type, where transformers attends to the real tokens), so with
    padding these two summaries differ from transformers'; on unpadded inputs, and ``"first"`` (which
    checkpoints use) always, they are equal.
    """

    def __init__(self, config):
        super().__init__()
        self.summary_type = config.summary_type
        # transformers' summary_proj_to_labels would project to num_labels, which its classifier (D -> 1)
        # cannot read unless num_labels == hidden_size: the projection is D -> D wherever that head works.
        self.summary = nn.Linear(config.hidden_size, config.hidden_size) if config.summary_use_proj else None
        self.activation = ACT2FN[config.summary_activation] if config.summary_activation else nn.Identity()
        self.first_dropout = nn.Dropout(getattr(config, "summary_first_dropout", 0.0))
        self.last_dropout = nn.Dropout(config.summary_last_dropout)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.summary_type == "first":
            summary = hidden_states[:, 0]
        elif self.summary_type == "mean":
            summary = hidden_states.mean(dim=1)
        else:  # "last", and "cls_index" without an index (the multiple-choice head gives none): the last one
            summary = hidden_states[:, -1]
        summary = self.first_dropout(summary)
        if self.summary is not None:
            summary = self.summary(summary)
        return self.last_dropout(self.activation(summary))


class EfficientElectraForMultipleChoice(EfficientElectraPreTrainedModel, MultipleChoiceTask):
    """The sequence summary -> ``classifier`` (D -> 1), one score per choice (transformers'
    ``ElectraForMultipleChoice``)."""

    bare_model_class = EfficientElectraModel

    def build_head(self, config) -> None:
        self.sequence_summary = EfficientElectraSequenceSummary(config)
        self.classifier = nn.Linear(config.hidden_size, 1)

    def choice_logits(self, outputs) -> torch.Tensor:
        return self.classifier(self.sequence_summary(outputs.last_hidden_state))  # (b * c, 1)


class EfficientElectraForTokenClassification(EfficientElectraPreTrainedModel, TokenClassificationTask):
    """Every token -> dropout -> linear (transformers' ``ElectraForTokenClassification``)."""

    bare_model_class = EfficientElectraModel


class EfficientElectraForQuestionAnswering(EfficientElectraPreTrainedModel, QuestionAnsweringTask):
    """Start and end logits of every token (transformers' ``ElectraForQuestionAnswering``)."""

    bare_model_class = EfficientElectraModel
