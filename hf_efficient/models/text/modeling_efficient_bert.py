"""EfficientBert: BERT with any registered attention; what only BERT has lives here.

The encoder is the shared text encoder (:mod:`hf_efficient.models.text.encoder`, over the blocks of
:mod:`hf_efficient.modeling.blocks`) and the heads are the shared tasks
(:mod:`hf_efficient.models.text.tasks`); BERT states its embeddings, its MLM head (``cls.predictions``) and
its pretraining heads (next sentence).
Parameter names are BERT's, so ``EfficientBertForMaskedLM.from_pretrained(bert_checkpoint,
attention_type="performer")`` loads every BERT weight and initialises only the attention's own parameters.

Shapes: b = batch, n = sequence length, D = hidden_size, V = vocab_size.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AutoModelForNextSentencePrediction, AutoModelForPreTraining
from transformers.activations import ACT2FN
from transformers.modeling_outputs import NextSentencePredictorOutput
from transformers.models.bert.modeling_bert import BertForPreTrainingOutput
from transformers.processing_utils import Unpack
from transformers.utils.generic import can_return_tuple

from ...modeling.blocks import CompactDropout
from ...modeling.checks import check_class_labels
from ...modeling.heads import mean_cross_entropy
from .configuration_efficient_bert import EfficientBertConfig
from .encoder import EfficientTextModel, EfficientTextPreTrainedModel
from .tasks import (
    CausalLMTask,
    LanguageModelTask,
    MaskedLMTask,
    MultipleChoiceTask,
    QuestionAnsweringTask,
    SequenceClassificationTask,
    TextInputs,
    TextTaskModel,
    TokenClassificationTask,
)


class EfficientBertEmbeddings(nn.Module):
    """Word + learned absolute position + token type embeddings, LayerNorm, dropout (BERT's). Their width is
    ``config.embedding_size`` where a family has one (ELECTRA's), else ``hidden_size``; a family without
    segments has ``type_vocab_size=0`` and no token type table (DistilBERT's). With relative positions
    (``position_embedding_type`` ``"relative_key"`` / ``"relative_key_query"``) the position table is kept
    (checkpoints hold it) but not added, as BERT's: positions enter the attention scores instead, and
    ``position_ids`` are not read."""

    def __init__(self, config):
        super().__init__()
        self.absolute_positions = getattr(config, "position_embedding_type", "absolute") == "absolute"
        width = getattr(config, "embedding_size", None) or config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, width, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, width)
        if config.type_vocab_size:
            self.token_type_embeddings = nn.Embedding(config.type_vocab_size, width)
        eps = config.layer_norm_eps if self.layer_norm_eps is None else self.layer_norm_eps
        self.LayerNorm = nn.LayerNorm(width, eps=eps)
        self.dropout = CompactDropout(config.hidden_dropout_prob)

    # A family's fixed LayerNorm epsilon, not a field of its config (DistilBERT's 1e-12); None: the config's
    # layer_norm_eps.
    layer_norm_eps: float | None = None
    # The position of the first token: 0, or RoBERTa's pad_token_id + 1 (its lower rows are not positions of
    # real tokens, which resize_position_embeddings keeps as they are).
    position_offset = 0

    def check_length(self, n: int, past_length: int) -> None:
        """Raise unless ``past_length + n`` tokens have positions in the table."""
        max_positions = self.position_embeddings.num_embeddings
        room = max_positions - self.position_offset
        if past_length + n > room:
            context = f" after {past_length} earlier tokens (the cache)" if past_length else ""
            held = (
                f" (positions for {room} tokens: the first is {self.position_offset})"
                if room != max_positions
                else ""
            )
            raise ValueError(
                f"The input has {n} tokens{context} but max_position_embeddings={max_positions}{held}. "
                f"Truncate it (tokenizer(..., truncation=True, max_length={room}); generate(): fewer "
                "max_new_tokens) or extend the model with model.resize_position_embeddings(new_length), "
                "which copies the learned table (as Longformer did)."
            )

    def default_position_ids(self, input_ids, n: int, past_length: int, device) -> torch.Tensor:
        """Positions when none are given: ``past_length .. past_length + n - 1``, (1, n)."""
        self.check_length(n, past_length)
        return torch.arange(past_length, past_length + n, device=device)[None]

    def forward(
        self, input_ids, token_type_ids, position_ids, inputs_embeds, past_length: int = 0
    ) -> torch.Tensor:
        """Embeddings of n tokens (inputs as checked by ``EfficientTextModel.check_inputs``) following
        ``past_length`` earlier ones (decoding with a cache): positions from :meth:`default_position_ids`
        unless ``position_ids`` are given."""
        embeds = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds  # (b, n, E)
        b, n, _ = embeds.shape
        if position_ids is None:
            position_ids = self.default_position_ids(input_ids, n, past_length, embeds.device)
        if self.absolute_positions:
            embeds = embeds + self.position_embeddings(position_ids)
        if hasattr(self, "token_type_embeddings"):
            if token_type_ids is None:
                token_type_ids = torch.zeros(b, n, dtype=torch.long, device=embeds.device)
            embeds = embeds + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(embeds))


class EfficientBertPreTrainedModel(EfficientTextPreTrainedModel):
    config_class = EfficientBertConfig
    base_model_prefix = "bert"

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, EfficientBertLMPredictionHead):
            nn.init.zeros_(module.bias)


class EfficientBertModel(EfficientBertPreTrainedModel, EfficientTextModel):
    """The bare encoder: hidden states (b, n, D) and, with ``add_pooling_layer``, BERT's pooled output."""

    embeddings_class = EfficientBertEmbeddings


class EfficientBertLMPredictionHead(nn.Module):
    """BERT's MLM head: dense + act + LayerNorm, then a decoder tied to the word embeddings."""

    def __init__(self, config: EfficientBertConfig):
        super().__init__()
        self.transform = nn.Module()
        self.transform.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform.transform_act_fn = ACT2FN[config.hidden_act]
        self.transform.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=True)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def transformed(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The decoder's input: LayerNorm(act(dense(h))), (..., D) -> (..., D)."""
        t = self.transform
        return t.LayerNorm(t.transform_act_fn(t.dense(hidden_states)))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transformed(hidden_states))  # (..., D) -> (..., V)


def next_sentence_loss(owner: str, logits: torch.Tensor, labels: torch.Tensor, name: str) -> torch.Tensor:
    """Cross-entropy of (b, 2) next-sentence logits against (b,) labels (the argument ``name``)."""
    fix = (
        "Next-sentence labels hold one id per sentence pair: 0 when sentence B follows sentence A, 1 when B "
        "is a random sentence."
    )
    classes = "2 next-sentence classes (0 = is next, 1 = is random)"
    check_class_labels(owner, labels, 2, logits.shape[:1], "(batch,)", classes=classes, fix=fix, name=name)
    return mean_cross_entropy(logits, labels)


class EfficientBertLanguageModel(EfficientBertPreTrainedModel, LanguageModelTask):
    """The encoder under BERT's LM head, its decoder tied to the word embeddings: what the masked and the
    causal language model and BERT's pretraining model share (parameter names ``bert.*``,
    ``cls.predictions.*``, as BERT's). ``with_next_sentence_head``: the pretraining model's pooler and its
    next-sentence head ``cls.seq_relationship`` (pooled [CLS] -> (b, 2)) too."""

    bare_model_class = EfficientBertModel
    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }
    with_next_sentence_head = False

    def build_head(self, config) -> None:
        self.cls = nn.Module()
        self.cls.predictions = EfficientBertLMPredictionHead(config)
        if self.with_next_sentence_head:
            self.cls.seq_relationship = nn.Linear(config.hidden_size, 2)

    def lm_features(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.cls.predictions.transformed(hidden_states)

    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings):
        self.cls.predictions.decoder = new_embeddings
        self.cls.predictions.bias = new_embeddings.bias


class EfficientBertForMaskedLM(EfficientBertLanguageModel, MaskedLMTask):
    """BERT's masked language model (transformers' ``BertForMaskedLM``)."""


class EfficientBertForCausalLM(EfficientBertLanguageModel, CausalLMTask):
    """BERT as a causal language model (transformers' ``BertLMHeadModel``: ``is_decoder=True``); with
    ``add_cross_attention=True``, the decoder of a bert2bert ``EncoderDecoderModel``.

    Example:
        >>> config = EfficientBertConfig(is_decoder=True, attention_type="linear", vocab_size=8000)
        >>> model = EfficientBertForCausalLM(config)
        >>> model.generate(input_ids, max_new_tokens=50)
    """


class EfficientBertForPreTraining(EfficientBertLanguageModel):
    """BERT's pretraining model (transformers' ``BertForPreTraining``): the masked-LM head, tied to the word
    embeddings, and the next-sentence head on the pooled [CLS] (``cls.seq_relationship``)."""

    auto_class = AutoModelForPreTraining
    with_next_sentence_head = True
    add_pooling_layer = True  # the next-sentence head reads the pooled [CLS]

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        **inputs: Unpack[TextInputs],
    ) -> BertForPreTrainingOutput:
        """Masked-LM logits (b, n, V) and next-sentence logits (b, 2).

        Args:
            labels: (b, n) token ids at masked positions, -100 elsewhere (the MLM collator's).
            next_sentence_label: (b,) 0 when sentence B follows sentence A, 1 when B is random.

        Returns:
            ``BertForPreTrainingOutput``; ``loss`` is the masked-LM loss (averaged over the masked positions)
            plus the next-sentence loss, as BERT's. Given only one of the two labels, the loss is that one
            alone (transformers returns no loss then).
        """
        outputs = self.encode(input_ids, attention_mask, token_type_ids, inputs)
        hidden = outputs.last_hidden_state  # (b, n, D)
        if labels is not None:
            self.check_mlm_labels(labels, hidden.shape[:2])
        prediction_logits = self.lm_logits(hidden)  # (b, n, V)
        seq_relationship_logits = self.cls.seq_relationship(outputs.pooler_output)  # (b, 2)
        losses = []
        if labels is not None:
            losses.append(mean_cross_entropy(prediction_logits, labels))
        if next_sentence_label is not None:
            owner, name = type(self).__name__, "next_sentence_label"
            losses.append(next_sentence_loss(owner, seq_relationship_logits, next_sentence_label, name))
        return BertForPreTrainingOutput(
            loss=sum(losses) if losses else None,
            prediction_logits=prediction_logits,
            seq_relationship_logits=seq_relationship_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class EfficientBertForNextSentencePrediction(EfficientBertPreTrainedModel, TextTaskModel):
    """BERT's next-sentence head alone (transformers' ``BertForNextSentencePrediction``): pooled [CLS] ->
    ``cls.seq_relationship`` -> (b, 2) logits, 0 = sentence B follows sentence A, 1 = B is random."""

    auto_class = AutoModelForNextSentencePrediction
    bare_model_class = EfficientBertModel
    add_pooling_layer = True
    per_sequence = True

    def build_head(self, config) -> None:
        self.cls = nn.Module()
        self.cls.seq_relationship = nn.Linear(config.hidden_size, 2)

    def task_output(self, outputs, labels, inputs) -> NextSentencePredictorOutput:
        """``labels``: (b,) 0 when sentence B follows sentence A, 1 when B is random."""
        logits = self.cls.seq_relationship(outputs.pooler_output)  # (b, 2)
        loss = None
        if labels is not None:
            loss = next_sentence_loss(type(self).__name__, logits, labels, "labels")
        return NextSentencePredictorOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class EfficientBertForSequenceClassification(EfficientBertPreTrainedModel, SequenceClassificationTask):
    """Pooled [CLS] -> dropout -> linear (transformers' ``BertForSequenceClassification``)."""

    bare_model_class = EfficientBertModel


class EfficientBertForTokenClassification(EfficientBertPreTrainedModel, TokenClassificationTask):
    """Every token -> dropout -> linear (transformers' ``BertForTokenClassification``)."""

    bare_model_class = EfficientBertModel


class EfficientBertForMultipleChoice(EfficientBertPreTrainedModel, MultipleChoiceTask):
    """BERT's multiple-choice head (transformers' ``BertForMultipleChoice``): pooled [CLS] -> dropout ->
    linear, one score per choice."""

    bare_model_class = EfficientBertModel


class EfficientBertForQuestionAnswering(EfficientBertPreTrainedModel, QuestionAnsweringTask):
    """Extractive question answering as transformers' ``BertForQuestionAnswering``: the encoder (no pooler)
    and ``qa_outputs``, a linear map of every token to a start and an end logit."""

    bare_model_class = EfficientBertModel
