"""The task models of every text family: what a task does (its inputs, loss and output), once.

A family's head is ``class EfficientXForTask(EfficientXPreTrainedModel, TaskClass)`` (the family first, so
that what it defines overrides the task's defaults) with ``bare_model_class`` (its encoder, built under
``base_model_prefix``) and, where its head modules differ from the defaults here, ``build_head`` (the
modules, under the family's parameter names) and the task's logits method (``sequence_logits``,
``token_logits``, ``span_logits``, ``choice_logits``, ``lm_features``).

Every forward names ``input_ids``, ``attention_mask`` and ``token_type_ids`` and the task's labels (so that
``Trainer`` keeps those dataset columns) and passes the other inputs (:class:`TextInputs`) on to the encoder
unchanged, as transformers' heads pass their ``**kwargs``.

Shapes: b = batch, n = sequence length, c = choices, D = hidden_size, V = vocab_size, M = masked positions.
"""

from __future__ import annotations

from typing import ClassVar, TypedDict

import torch
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    GenerationMixin,
)
from transformers.modeling_outputs import (
    BaseModelOutputWithPoolingAndCrossAttentions,
    CausalLMOutputWithCrossAttentions,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.modeling_utils import slice_logits_to_keep
from transformers.processing_utils import Unpack
from transformers.utils import logging
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import can_return_tuple

from ...attention.cache import EfficientCache
from ...attention.inputs import is_tracing
from ...compat import runs_plain_forward
from ...errors import InputError
from ...modeling.checks import check_class_labels, check_rank, check_same_shape
from ...modeling.heads import (
    CAUSAL_LM_LOSS_KWARGS,
    FirstTokenClassifier,
    causal_lm_targets,
    check_loss_kwargs,
    classification_loss,
    classifier_dropout,
    mean_cross_entropy,
    per_item_loss,
    span_loss,
)
from ...modeling.losses import chunked_cross_entropy
from .encoder import EfficientTextModel, EfficientTextPreTrainedModel, packed_sequences

logger = logging.get_logger(__name__)


class TextInputs(TypedDict, total=False):
    """What a text head passes on to its encoder unchanged besides ``input_ids``, ``attention_mask`` and
    ``token_type_ids`` (see :meth:`EfficientTextModel.forward`)."""

    position_ids: torch.Tensor | None  # (b, n)
    inputs_embeds: torch.Tensor | None  # (b, n, D), instead of input_ids
    global_attention_mask: torch.Tensor | None  # (b, n) 1 = global token (Longformer's)
    output_attentions: bool | None
    output_hidden_states: bool | None


Outputs = BaseModelOutputWithPoolingAndCrossAttentions


class TextTaskModel(EfficientTextPreTrainedModel):
    """A task model: the family's bare encoder (``bare_model_class``, with BERT's pooler when
    ``add_pooling_layer``) under ``base_model_prefix``, then the head :meth:`build_head` builds."""

    bare_model_class: ClassVar[type[EfficientTextModel]]
    add_pooling_layer: ClassVar[bool] = False
    # One output per sequence: a packed row (DataCollatorWithFlattening's) is read as the batch of its
    # sequences (see unpack_row); token-level tasks keep the row as it is.
    per_sequence: ClassVar[bool] = False
    auto_class: ClassVar[type | None] = None  # the Auto class of the task (a family registers it there)

    def __init__(self, config):
        super().__init__(config)
        encoder = self.bare_model_class(config, add_pooling_layer=self.add_pooling_layer)
        setattr(self, self.base_model_prefix, encoder)
        self.build_head(config)
        self.post_init()

    def build_head(self, config) -> None:
        """The head's modules, under the family's parameter names."""
        raise NotImplementedError

    def encode(self, input_ids, attention_mask, token_type_ids, inputs: TextInputs) -> Outputs:
        """The encoder's outputs for the head's inputs."""
        return self.base_model(
            input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, **inputs
        )

    def task_output(self, outputs: Outputs, labels: torch.Tensor | None, inputs: dict):
        """The head on the encoder's outputs: the task's ``ModelOutput`` (and loss, with ``labels``).
        ``inputs``: what the forward was given (a multiple-choice head reads its number of choices, ELECTRA's
        discriminator the attention mask)."""
        raise NotImplementedError

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **inputs: Unpack[TextInputs],
    ):
        """The task's logits and, with ``labels``, its loss (the task class says what they hold).

        Args:
            input_ids: (b, n) token ids (a multiple-choice head: (b, c, n)).
            attention_mask: (b, n) 1 = real token, 0 = padding.
            token_type_ids: (b, n) segment ids, for the families that have them.
            labels: the task's targets.
            inputs: :class:`TextInputs`, passed on to the encoder.
        """
        if self.per_sequence:
            input_ids, attention_mask, token_type_ids, inputs = unpack_row(
                input_ids, attention_mask, token_type_ids, inputs
            )
        outputs = self.encode(input_ids, attention_mask, token_type_ids, inputs)
        given = dict(inputs, input_ids=input_ids, attention_mask=attention_mask)
        return self.task_output(outputs, labels, given)


def unpack_row(input_ids, attention_mask, token_type_ids, inputs: TextInputs):
    """A packed row (one row of several sequences, position_ids restarting at 0: DataCollatorWithFlattening's)
    as the padded batch of its B sequences, (B, L) with their padding mask; other inputs as they are. A
    sequence-level head then gives each sequence its output alone (labels (B,)); with
    ``config.padding_free`` the padding costs nothing."""
    ids_or_embeds = input_ids if input_ids is not None else inputs.get("inputs_embeds")
    b = ids_or_embeds.shape[0] if ids_or_embeds is not None else 0
    packed = packed_sequences(b, attention_mask, inputs.get("position_ids"), None, None)
    if packed is None:
        return input_ids, attention_mask, token_type_ids, inputs
    # The row's positions count each sequence from 0 (checked by from_position_ids): as a batch, each
    # sequence takes its family's own positions (RoBERTa's start past the padding id).
    inputs = {name: value for name, value in inputs.items() if name != "position_ids"}
    for name in ("inputs_embeds", "global_attention_mask"):
        if inputs.get(name) is not None:
            inputs[name] = packed.row_to_padded(inputs[name])
    unpack = packed.row_to_padded
    ids = None if input_ids is None else unpack(input_ids)
    types = None if token_type_ids is None else unpack(token_type_ids)
    return ids, packed.padding_mask().long(), types, inputs


def build_linear_classifier(model: nn.Module, config) -> None:
    """BERT's classifier: ``dropout`` (``classifier_dropout``, else ``hidden_dropout_prob``) and
    ``classifier`` (D -> num_labels)."""
    model.num_labels = config.num_labels
    model.dropout = classifier_dropout(config)
    model.classifier = nn.Linear(config.hidden_size, config.num_labels)


class SequenceClassificationTask(TextTaskModel):
    """One label per sequence: single-label, multi-label or regression as transformers does
    (:func:`~hf_efficient.modeling.heads.classification_loss`). Default head: BERT's, the pooled [CLS] ->
    dropout -> ``classifier``."""

    auto_class = AutoModelForSequenceClassification
    add_pooling_layer = True
    per_sequence = True

    def build_head(self, config) -> None:
        build_linear_classifier(self, config)

    def sequence_logits(self, outputs: Outputs) -> torch.Tensor:
        return self.classifier(self.dropout(outputs.pooler_output))  # (b, num_labels)

    def task_output(self, outputs, labels, inputs) -> SequenceClassifierOutput:
        """``labels``: (b,) class ids, (b, num_labels) 0/1 floats (multi-label) or floats (regression)."""
        logits = self.sequence_logits(outputs)
        loss = None
        if labels is not None:
            loss = classification_loss(self.config, logits, labels, owner=type(self).__name__)
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class FirstTokenSequenceClassificationTask(SequenceClassificationTask):
    """RoBERTa's and ELECTRA's sentence classifier: no pooler, the first token through
    :class:`~hf_efficient.modeling.heads.FirstTokenClassifier` (``classifier.dense``, ``classifier.out_proj``)
    with the family's fixed ``classifier_activation``."""

    add_pooling_layer = False
    classifier_activation: ClassVar[str]

    def build_head(self, config) -> None:
        self.num_labels = config.num_labels
        self.classifier = FirstTokenClassifier(config, self.classifier_activation)

    def sequence_logits(self, outputs: Outputs) -> torch.Tensor:
        return self.classifier(outputs.last_hidden_state)  # (b, num_labels)


class TokenClassificationTask(TextTaskModel):
    """One label per token (named entities, parts of speech). Default head: dropout -> ``classifier``."""

    auto_class = AutoModelForTokenClassification

    def build_head(self, config) -> None:
        build_linear_classifier(self, config)

    def token_logits(self, outputs: Outputs) -> torch.Tensor:
        return self.classifier(self.dropout(outputs.last_hidden_state))  # (b, n, num_labels)

    def task_output(self, outputs, labels, inputs) -> TokenClassifierOutput:
        """``labels``: (b, n) class ids, -100 at positions to ignore (padding, sub-word continuations)."""
        logits = self.token_logits(outputs)
        loss = None
        if labels is not None:
            fix = (
                "Token labels hold one class id per token, -100 at padding and sub-word continuations; load "
                "the model with num_labels set to the number of classes."
            )
            shape = logits.shape[:2]
            check_class_labels(type(self).__name__, labels, self.num_labels, shape, "(batch, seq)", fix=fix)
            loss = mean_cross_entropy(logits, labels)  # over the labelled tokens; 0 if there is none
        return TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class MultipleChoiceTask(TextTaskModel):
    """Every choice of an example is encoded as its own sequence, each gets one score, and the scores of an
    example are its logits (b, c). Default head: BERT's, the pooled [CLS] -> dropout -> ``classifier``."""

    auto_class = AutoModelForMultipleChoice
    add_pooling_layer = True

    def build_head(self, config) -> None:
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, 1)

    def choice_logits(self, outputs: Outputs) -> torch.Tensor:
        return self.classifier(self.dropout(outputs.pooler_output))  # (b * c, 1)

    def tracing_blockers(self) -> list[str]:
        name = type(self).__name__
        scorer = name.replace("ForMultipleChoice", "ForSequenceClassification")
        return [
            *super().tracing_blockers(),
            f"{name} takes (batch, num_choices, seq) inputs, which the export's text signature (batch, seq) "
            "does not serve: score the choices as a batch of sequences with the same weights instead, e.g. "
            f"{scorer}.from_pretrained(folder, num_labels=1) (its classifier is the choice scorer).",
        ]

    def encode(self, input_ids, attention_mask, token_type_ids, inputs: TextInputs) -> Outputs:
        """The (b, c, n) inputs checked and encoded as b * c sequences."""
        owner = type(self).__name__
        fix = (
            "Multiple-choice inputs hold every choice of an example: tokenize each (question, choice) pair, "
            "then stack them per example (a (batch, num_choices, seq) tensor; DataCollatorForMultipleChoice "
            "in transformers' examples does it)."
        )
        embeds = inputs.get("inputs_embeds")
        if input_ids is not None:
            check_rank(owner, "input_ids", input_ids, "(batch, num_choices, seq)", fix)
            shape = input_ids.shape
        elif embeds is not None:
            check_rank(owner, "inputs_embeds", embeds, "(batch, num_choices, seq, hidden_size)", fix)
            shape = embeds.shape[:3]
        else:
            raise InputError(f"{owner}: pass input_ids (batch, num_choices, seq) or inputs_embeds. {fix}")
        per_token = dict(inputs, attention_mask=attention_mask, token_type_ids=token_type_ids)
        flat = {}
        for name in ("attention_mask", "token_type_ids", "position_ids", "global_attention_mask"):
            if per_token.get(name) is not None:
                check_same_shape(
                    owner, name, per_token[name], shape, "(batch, num_choices, seq) of the inputs"
                )
                flat[name] = per_token[name].reshape(-1, shape[-1])
        if embeds is not None:
            flat["inputs_embeds"] = embeds.reshape(-1, *embeds.shape[2:])
        flags = {key: inputs[key] for key in ("output_attentions", "output_hidden_states") if key in inputs}
        ids = input_ids.reshape(-1, shape[-1]) if input_ids is not None else None
        return self.base_model(ids, **flat, **flags)

    def task_output(self, outputs, labels, inputs) -> MultipleChoiceModelOutput:
        """``labels``: (b,) the index of the right choice, in [0, c) (-100: no target). Hidden states and
        attentions are those of the b * c sequences, as transformers'."""
        given = inputs["input_ids"] if inputs["input_ids"] is not None else inputs.get("inputs_embeds")
        num_choices = given.shape[1]
        logits = self.choice_logits(outputs).view(-1, num_choices)  # (b, c)
        loss = None
        if labels is not None:
            fix = "Multiple-choice labels hold the index of the right choice of each example (batch,)."
            classes = f"num_choices={num_choices} (the inputs' second dimension)"
            shape = logits.shape[:1]
            check_class_labels(type(self).__name__, labels, num_choices, shape, "(batch,)", classes, fix)
            loss = mean_cross_entropy(logits, labels)
        return MultipleChoiceModelOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class QuestionAnsweringTask(TextTaskModel):
    """Extractive question answering: every token's start and end logit (default head: ``qa_outputs``, a
    linear map to 2). With a long-context type (Longformer, BigBird) one window reads a whole document,
    where a 512-token model reads it in strided windows (the question-answering pipeline's
    ``doc_stride``)."""

    auto_class = AutoModelForQuestionAnswering

    def build_head(self, config) -> None:
        self.qa_outputs = nn.Linear(config.hidden_size, 2)

    def span_logits(self, outputs: Outputs) -> torch.Tensor:
        return self.qa_outputs(outputs.last_hidden_state)  # (b, n, 2)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        **inputs: Unpack[TextInputs],
    ) -> QuestionAnsweringModelOutput:
        """Start and end logits (b, n); with ``start_positions`` and ``end_positions`` (b,) the loss,
        transformers' (:func:`~hf_efficient.modeling.heads.span_loss`): positions past the input are
        ignored, and the loss is the mean of the start and the end cross-entropies."""
        outputs = self.encode(input_ids, attention_mask, token_type_ids, inputs)
        logits = self.span_logits(outputs)
        start_logits, end_logits = (part.squeeze(-1).contiguous() for part in logits.split(1, dim=-1))
        loss = None
        if start_positions is not None or end_positions is not None:
            owner = type(self).__name__
            loss = span_loss(owner, start_logits, end_logits, start_positions, end_positions, attention_mask)
        return QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class LanguageModelTask(TextTaskModel):
    """A model whose head predicts tokens, its decoder tied to the word embeddings (``_tied_weights_keys``):
    the family builds the head and says which module decodes (``get_output_embeddings``) and what it reads
    (:meth:`lm_features`)."""

    def lm_features(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The decoder's input: (..., D) -> (..., E) (BERT: LayerNorm(act(dense(h))))."""
        raise NotImplementedError

    def lm_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.get_output_embeddings()(self.lm_features(hidden_states))  # (..., D) -> (..., V)

    def lm_loss(self, hidden_states: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss of (M, D) hidden states against (M,) labels without building the (M, V) logits
        (:func:`~hf_efficient.modeling.losses.chunked_cross_entropy`)."""
        decoder = self.get_output_embeddings()
        return chunked_cross_entropy(self.lm_features(hidden_states), decoder.weight, decoder.bias, labels)

    def check_mlm_labels(self, labels: torch.Tensor, shape: torch.Size) -> None:
        """Masked-LM labels: (b, n) of the inputs, token ids below vocab_size or -100."""
        vocab = self.get_output_embeddings().out_features
        check_class_labels(
            type(self).__name__, labels, vocab, shape, "(batch, seq) of the inputs",
            classes=f"vocab_size={vocab}",
            fix="MLM labels hold the original token id at each masked position and -100 elsewhere, one "
            "per input token (DataCollatorForLanguageModeling makes them).",
        )  # fmt: skip


class MaskedLMTask(LanguageModelTask):
    """Masked language modelling: the token at each masked position."""

    auto_class = AutoModelForMaskedLM
    REAL_TOKEN_CHUNK: ClassVar[int] = 1024  # rows of the (T, V) logits computed at a time

    def real_token_logits(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """(b, n, D) -> (b, n, V) logits with the head run on the real tokens only, zeros at padding
        (``config.padding_free``): per token the vocabulary projection costs about what the whole encoder
        costs at MiniLM's size (V = 30,522, D = 384, 6 layers; a third of it at BERT-base's), so skipping the
        padding there matters as much.

        The real rows of the (b * n, V) output come in runs (a right-padded row's tokens, runs of full rows
        merged), 1,024 rows at a time. Without autograd, autocast or anything attached to the decoder
        (hooks, a wrapper such as PEFT's), each chunk's projection is written straight into its rows
        (``torch.addmm(..., out=)``): every element of the output written once and no (chunk, V) tensor
        beside it, whose fresh pages cost as much to touch as the output's (benchmarks/docs/performance.md,
        "Why the kernels are cut the way they are"). Otherwise each chunk goes through the decoder module and
        is copied into its rows."""
        if attention_mask is None or attention_mask.dim() != 2 or is_tracing():
            return self.lm_logits(hidden)
        real = attention_mask.bool().reshape(-1)  # (b * n,)
        if bool(real.all()):
            return self.lm_logits(hidden)
        b, n, d = hidden.shape
        decoder = self.get_output_embeddings()
        features = self.lm_features(hidden.reshape(b * n, d)[real])  # (T, D), the real tokens in batch order
        logits = hidden.new_empty(b * n, decoder.out_features)
        direct = (
            type(decoder) is nn.Linear
            and runs_plain_forward(decoder)
            and not torch.is_grad_enabled()
            and not torch.is_autocast_enabled(hidden.device.type)
            and features.dtype == decoder.weight.dtype == logits.dtype
        )
        edges = nn.functional.pad(real.to(torch.int8), (1, 1)).diff()  # +1 where a run starts, -1 past it
        starts, ends = (edges > 0).nonzero().reshape(-1).tolist(), (edges < 0).nonzero().reshape(-1).tolist()
        written = used = 0  # rows of the output written, rows of the features used
        for start, end in zip(starts, ends, strict=True):
            logits[written:start].zero_()  # the padding before this run
            offset = used - start  # output row r of this run is feature row r + offset
            for first in range(start, end, self.REAL_TOKEN_CHUNK):
                last = min(end, first + self.REAL_TOKEN_CHUNK)
                rows, chunk = logits[first:last], features[first + offset : last + offset]
                if not direct:
                    rows.copy_(decoder(chunk))
                elif decoder.bias is None:
                    torch.mm(chunk, decoder.weight.t(), out=rows)
                else:
                    torch.addmm(decoder.bias, chunk, decoder.weight.t(), out=rows)
            used, written = used + end - start, end
        logits[written:].zero_()
        return logits.view(b, n, -1)

    def task_output(self, outputs, labels, inputs) -> MaskedLMOutput:
        """Masked-LM logits, and with ``labels`` ((b, n) token ids at masked positions, -100 elsewhere: the
        MLM collator's) the loss averaged over the masked positions.

        Without labels, ``logits`` are (b, n, V), as BERT's. With labels, what ``logits`` holds follows
        ``config.sparse_prediction``:

        * ``None`` (the default): in training mode (``model.train()``) only the masked positions reach the
          vocabulary and the loss is computed chunk by chunk without building their logits, so ``logits`` is
          None and no tensor of size n x V exists (the loss and gradients are those of the dense head); in
          eval mode, (b, n, V) as BERT's (``Trainer.evaluate`` with ``compute_metrics`` reads them);
        * ``True``: logits of the masked positions only, (M, V) in batch order (ModernBERT's option);
        * ``False``: (b, n, V) always, as ``BertForMaskedLM`` (n x V floats, twice over in training).
        """
        hidden = outputs.last_hidden_state  # (b, n, D)
        if labels is not None:
            self.check_mlm_labels(labels, hidden.shape[:2])
        sparse = self.config.sparse_prediction
        if labels is not None and (sparse or (sparse is None and self.training)):
            # Only the M masked positions reach the head: hidden (M, D), labels (M,).
            scored = labels.reshape(-1) != -100
            hidden, labels = hidden.reshape(-1, hidden.shape[-1])[scored], labels.reshape(-1)[scored]
            if sparse is None:  # training: the loss without any (M, V) tensor
                loss = self.lm_loss(hidden, labels)
                return MaskedLMOutput(
                    loss=loss, hidden_states=outputs.hidden_states, attentions=outputs.attentions
                )
        if hidden.dim() == 3 and self.config.padding_free:
            logits = self.real_token_logits(hidden, inputs.get("attention_mask"))  # (b, n, V)
        else:
            logits = self.lm_logits(hidden)  # (b, n, V), or (M, V) with sparse_prediction=True
        # Averaged over the masked positions; 0 (not NaN) for a batch in which nothing was masked.
        loss = mean_cross_entropy(logits, labels) if labels is not None else None
        return MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class CausalLMTask(LanguageModelTask, GenerationMixin):
    """A causal language model (a family's ``ForCausalLM``, ``is_decoder=True``) for any attention type with
    a causal form, with ``generate()`` and ``pipeline("text-generation")``.

    Generation decodes token by token from an :class:`~hf_efficient.attention.cache.EfficientCache`: the
    prompt runs through each core's parallel causal form once, then every new token costs what the core's
    state costs: O(n) per token against ``full``'s growing key/value cache, O(1) in the context for
    ``linear``, ``performer`` and ``rfa`` (a fixed-size recurrent state: "Transformers are RNNs") and for
    ``longformer`` (the last w keys). Greedy search, sampling and beam search work as with any transformers
    model; assisted generation, which rolls a cache back, is refused for recurrent and windowed states.

    With ``add_cross_attention=True`` every layer also attends to an encoder's states
    (``encoder_hidden_states``; BERT's ``crossattention``, of ``config.cross_attention_type``): the decoder of
    an ``EncoderDecoderModel`` (bert2bert), whose cache is then transformers' ``EncoderDecoderCache``.
    """

    # forward hands Trainer's num_items_in_batch to the loss (a sum over the targets divided by the count over
    # every device and accumulation step), so Trainer must pass it, and not average the loss again.
    accepts_loss_kwargs = True
    auto_class = AutoModelForCausalLM

    def __init__(self, config):
        if (
            not config.is_decoder
        ):  # builds and warns, as BertLMHeadModel (an encoder checkpoint opens as a LM)
            name = type(self).__name__
            logger.warning_once(
                f"{name} with is_decoder=False attends in both directions (every token sees the later "
                f"ones): add is_decoder=True to use it as a causal language model ({name}.from_pretrained("
                "path, is_decoder=True) for an encoder checkpoint)."
            )
        super().__init__(config)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        """generate() must not build transformers' DynamicCache: the forward makes an EfficientCache, whose
        layers the cores build (running sums and windows as well as keys and values)."""
        return False

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs):
        """Without a cache of the user's, generate() starts from the one the forward would make (none without
        is_decoder; with encoder states an EncoderDecoderCache around this model's EfficientCache): assisted
        decoding reads the cache before the first forward (transformers 5.25 raises "requires a cache"
        without one), then refuses a cache that cannot be cropped."""
        super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
        if model_kwargs.get("cache") is None and generation_config.use_cache is not False:
            cross = model_kwargs.get("encoder_hidden_states") is not None
            model_kwargs["cache"] = self.base_model._generation_cache(None, True, cross)  # the forward's own

    @property
    def _is_stateful(self) -> bool:
        """True when a layer keeps a state that cannot be rolled back (recurrent sums, a window): generate()
        then refuses assisted decoding, which needs to crop the cache."""
        return not all(layer.is_croppable for layer in self.new_cache().layers)

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        cache: EfficientCache | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithCrossAttentions:
        """Next-token logits (b, n, V); with ``labels`` (b, n) the loss of predicting token i + 1 at i
        (labels are the input ids, shifted here; -100 is ignored). In training mode with labels the decoder
        and the loss run fused, a chunk of positions at a time, and ``logits`` is None: no (b, n, V) tensor
        is built (:func:`~hf_efficient.modeling.losses.chunked_cross_entropy`); in eval mode (``Trainer.
        evaluate``, ``generate``) the logits are returned as BERT's.

        Args:
            position_ids: (b, n); ``generate()`` counts them over the real tokens of a padded prompt.
            cache, use_cache: the generation state (see :meth:`EfficientTextModel.forward`); training with
                labels makes none unless one is given.
            logits_to_keep: an int k > 0 computes the logits of the last k positions only (``generate()``
                asks for 1 during the prompt); a 1-D tensor, those of the positions it lists.
            encoder_hidden_states, encoder_attention_mask: a decoder with cross-attention (the decoder of
                an EncoderDecoderModel): the encoder's states and padding (see EfficientTextModel.forward).
            kwargs: :class:`TextInputs` (``inputs_embeds``, ``output_attentions``, ``output_hidden_states``)
                and transformers' causal-LM loss keywords, as ``BertLMHeadModel`` hands them to its
                ``loss_function``: ``shift_labels`` (targets already aligned, used instead of shifting
                ``labels``), ``num_items_in_batch`` (the loss is the sum over the targets divided by it:
                Trainer's count over devices and accumulation steps), ``ignore_index``.
        """
        loss_kwargs = {key: kwargs.pop(key) for key in CAUSAL_LM_LOSS_KWARGS if key in kwargs}
        inputs = {key: kwargs.pop(key) for key in TextInputs.__annotations__ if key in kwargs}
        check_loss_kwargs(type(self).__name__, kwargs)  # what is left is neither
        if labels is not None and cache is None:
            use_cache = False
        outputs = self.base_model(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            **inputs,
        )
        hidden = slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep)  # (b, n | k, D)
        if labels is not None:
            targets, num_items = causal_lm_targets(labels, loss_kwargs)  # (b, n)
            targets = targets.to(hidden.device)
        if self.training and labels is not None and hidden.shape[1] == targets.shape[1]:
            # Training: the decoder and the loss fused chunk by chunk, no (b, n, V) logits (logits None)
            return CausalLMOutputWithCrossAttentions(
                loss=per_item_loss(self.lm_loss(hidden, targets), targets, num_items),
                logits=None,
                cache=outputs.cache,
                hidden_states=outputs.hidden_states,
                attentions=outputs.attentions,
            )
        logits = self.lm_logits(hidden)  # (b, n | k, V)
        loss = None
        if labels is not None:  # over float32 logits, as transformers' ForCausalLMLoss
            loss = per_item_loss(mean_cross_entropy(logits.float(), targets), targets, num_items)
        return CausalLMOutputWithCrossAttentions(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
