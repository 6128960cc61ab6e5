"""EfficientBert: BERT with any registered attention; only what is textual lives here.

The encoder blocks are shared with the vision and graph models (:mod:`hf_efficient.modeling.blocks`);
parameter names are BERT's, so ``EfficientBertForMaskedLM.from_pretrained(bert_checkpoint,
attention_type="performer")`` loads every BERT weight and initialises only the attention's own parameters.

Shapes: b = batch, n = sequence length, D = hidden_size, V = vocab_size.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.activations import ACT2FN
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import (
    BaseModelOutputWithPoolingAndCrossAttentions,
    CausalLMOutputWithCrossAttentions,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    NextSentencePredictorOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.modeling_utils import slice_logits_to_keep
from transformers.models.bert.modeling_bert import BertForPreTrainingOutput
from transformers.utils import logging
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import can_return_tuple

from ...attention.cache import EfficientCache
from ...errors import InputError
from ...modeling.blocks import CompactDropout, CrossAttentionInputs, EfficientEncoder
from ...modeling.checks import (
    check_class_labels,
    check_float_input,
    check_ids,
    check_not_empty,
    check_rank,
    check_same_shape,
)
from ...modeling.heads import (
    Pooler,
    causal_lm_targets,
    check_loss_kwargs,
    classification_loss,
    classifier_dropout,
    mean_cross_entropy,
    per_item_loss,
    span_loss,
)
from ...modeling.losses import chunked_cross_entropy
from ...modeling.pretrained import EfficientPreTrainedModel
from .configuration_efficient_bert import EfficientBertConfig

logger = logging.get_logger(__name__)


class EfficientBertEmbeddings(nn.Module):
    """Word + learned absolute position + token type embeddings, LayerNorm, dropout (BERT's)."""

    def __init__(self, config: EfficientBertConfig):
        super().__init__()
        hidden = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, hidden, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = CompactDropout(config.hidden_dropout_prob)

    def forward(
        self, input_ids, token_type_ids, position_ids, inputs_embeds, past_length: int = 0
    ) -> torch.Tensor:
        """Embeddings of n tokens (inputs as checked by ``EfficientBertModel.check_inputs``) following
        ``past_length`` earlier ones (decoding with a cache): positions ``past_length .. past_length + n - 1``
        unless ``position_ids`` are given."""
        embeds = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds  # (b, n, D)
        b, n, _ = embeds.shape
        max_positions = self.position_embeddings.num_embeddings
        if position_ids is None:
            if past_length + n > max_positions:
                context = f" after {past_length} earlier tokens (the cache)" if past_length else ""
                raise ValueError(
                    f"The input has {n} tokens{context} but max_position_embeddings={max_positions}. "
                    f"Truncate it (tokenizer(..., truncation=True, max_length={max_positions}); generate(): "
                    "fewer max_new_tokens) or extend the model with model.resize_position_embeddings("
                    "new_length), which copies the learned table (as Longformer did)."
                )
            position_ids = torch.arange(past_length, past_length + n, device=embeds.device)[None]  # (1, n)
        if token_type_ids is None:
            token_type_ids = torch.zeros(b, n, dtype=torch.long, device=embeds.device)
        embeds = embeds + self.token_type_embeddings(token_type_ids) + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(embeds))


class EfficientBertPreTrainedModel(EfficientPreTrainedModel):
    config_class = EfficientBertConfig
    base_model_prefix = "bert"
    # Older BERT checkpoints (bert-base-uncased, all-MiniLM-L6-v2) store BERT's position_ids buffer; positions
    # are built on the fly here, so the key is expected and not reported.
    _keys_to_ignore_on_load_unexpected = [r"embeddings\.position_ids"]

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, EfficientBertLMPredictionHead):
            nn.init.zeros_(module.bias)

    @torch.no_grad()
    def resize_position_embeddings(self, new_length: int, reinitialize_fixed_length_attention: bool = False):
        """Serve longer inputs: extend the learned position table by copying it (Beltagy et al. 2020, 3.5).

        Works on the bare encoder and on every task model (their ``bert``). Rows ``[k * old, (k + 1) * old)``
        repeat the trained rows, so every position keeps a trained embedding and local structure is preserved.
        Attention types built for a fixed length (Linformer) have length-sized parameters of their own: they
        are rebuilt freshly only when ``reinitialize_fixed_length_attention=True``, never silently.
        """
        base = self.base_model  # the encoder itself, or the `bert` inside a task model
        old = base.embeddings.position_embeddings
        if new_length <= old.num_embeddings:
            raise ValueError(f"new_length={new_length} must exceed the current {old.num_embeddings}.")
        fixed = [core for core in self.attention_cores() if core.capabilities.fixed_max_length]
        if fixed and not reinitialize_fixed_length_attention:
            raise ValueError(
                f"{fixed[0].attention_type} has parameters sized by the maximum length, which cannot be "
                "extended without new training. Pass reinitialize_fixed_length_attention=True to rebuild "
                "them freshly, or choose an attention type without a fixed length."
            )
        table = old.weight.new_empty(new_length, old.embedding_dim)
        for start in range(0, new_length, old.num_embeddings):
            rows = min(old.num_embeddings, new_length - start)
            table[start : start + rows] = old.weight[:rows]
        base.embeddings.position_embeddings = nn.Embedding.from_pretrained(table, freeze=False)
        self.config.max_position_embeddings = new_length
        if fixed:
            base.encoder.rebuild_fixed_length_cores()

    def get_position_embeddings(self) -> nn.Embedding:
        return self.base_model.embeddings.position_embeddings


class EfficientBertModel(EfficientBertPreTrainedModel):
    """The bare encoder: hidden states (b, n, D) and, with ``add_pooling_layer``, BERT's pooled output."""

    def __init__(self, config: EfficientBertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = EfficientBertEmbeddings(config)
        self.encoder = EfficientEncoder(config)
        self.pooler = Pooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def check_inputs(self, input_ids, token_type_ids, position_ids, inputs_embeds) -> tuple[int, int]:
        """Shapes, dtypes and (in eager mode) values of the inputs, against the embedding tables; returns
        (b, n). The attention mask is checked with the other attention inputs (``attention_inputs``)."""
        owner, tables = type(self).__name__, self.embeddings
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(f"{owner}: pass exactly one of input_ids (b, n) or inputs_embeds (b, n, D).")
        if input_ids is not None:
            one = "Batch a single sequence as input_ids[None] (the tokenizer's return_tensors='pt' does)."
            check_rank(owner, "input_ids", input_ids, "(batch, seq)", one)
            check_not_empty(owner, "input_ids", input_ids.shape)
            rows = tables.word_embeddings.num_embeddings
            fix = (
                "Tokenize with this model's tokenizer, or give the model the tokenizer's vocabulary: "
                "model.resize_token_embeddings(len(tokenizer))."
            )
            check_ids(owner, "input_ids", input_ids, rows, f"vocab_size={rows} word embeddings", fix)
            b, n = input_ids.shape
        else:
            hidden = tables.word_embeddings.embedding_dim
            check_rank(owner, "inputs_embeds", inputs_embeds, "(batch, seq, hidden_size)")
            check_not_empty(owner, "inputs_embeds", inputs_embeds.shape[:2])
            if inputs_embeds.shape[-1] != hidden:
                raise ValueError(
                    f"{owner}: inputs_embeds must have hidden_size={hidden} features per token, got shape "
                    f"{tuple(inputs_embeds.shape)}."
                )
            check_float_input(owner, "inputs_embeds", inputs_embeds, "Pass finite embeddings.")
            b, n = inputs_embeds.shape[:2]
        if token_type_ids is not None:
            check_same_shape(owner, "token_type_ids", token_type_ids, (b, n), "(batch, seq) of the inputs")
            types = tables.token_type_embeddings.num_embeddings
            fix = f"Segment ids are 0 for a first sentence, 1 for a second (below {types}): the tokenizer's."
            table = f"type_vocab_size={types} token type embeddings"
            check_ids(owner, "token_type_ids", token_type_ids, types, table, fix)
        if position_ids is not None:
            if position_ids.dim() != 2 or position_ids.shape[1] != n or position_ids.shape[0] not in (1, b):
                raise ValueError(
                    f"{owner}: position_ids must have shape (batch, seq) = {(b, n)} or (1, seq), got "
                    f"{tuple(position_ids.shape)}."
                )
            positions = tables.position_embeddings.num_embeddings
            fix = "Positions count from 0; extend the table: model.resize_position_embeddings(new_length)."
            table = f"max_position_embeddings={positions} position embeddings"
            check_ids(owner, "position_ids", position_ids, positions, table, fix)
        return b, n

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        global_attention_mask: torch.Tensor | None = None,
        cache: EfficientCache | EncoderDecoderCache | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
    ) -> BaseModelOutputWithPoolingAndCrossAttentions:
        """Encode a batch; a decoder (``config.is_decoder``) attends causally and can decode from a cache.

        Args:
            input_ids: (b, n) token ids.
            attention_mask: (b, n) 1 = real token, 0 = padding (the tokenizer's mask). With a cache it may
                also cover the tokens before (b, past + n), as ``generate()`` passes it; their padding is
                already in the cache, so only the last n columns are read.
            global_attention_mask: (b, n) 1 = global token, for attention types with per-example global
                tokens (Longformer); others raise when given one.
            cache: decoders only: the generation state of the tokens before these (``model.new_cache()``,
                or the ``cache`` of the previous output), updated in place.
            use_cache: decoders only (default ``config.use_cache``): return the state after these tokens as
                ``cache``, starting a new one if none is given.
            encoder_hidden_states: decoders with cross-attention (``add_cross_attention``): (b, m, D) the
                encoder's states every layer attends to. With a cache the cache is transformers'
                ``EncoderDecoderCache`` (this model's state, and each layer's projected encoder keys and
                values, computed at the first step and reused after, as BERT's).
            encoder_attention_mask: (b, m) the encoder's padding, 1 = real token (the encoder's input mask).
        """
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        b, n = self.check_inputs(input_ids, token_type_ids, position_ids, inputs_embeds)
        cross_states = self.check_encoder_states(b, encoder_hidden_states, encoder_attention_mask)
        cache = self._generation_cache(cache, use_cache, cross_states is not None)
        past = cache.get_seq_length() if cache is not None else 0
        # (b, n, D)
        hidden_states = self.embeddings(
            input_ids, token_type_ids, position_ids, inputs_embeds, past_length=past
        )
        if cache is not None and attention_mask is not None and attention_mask.shape[-1] == past + n != n:
            attention_mask = attention_mask[:, past:]  # generate()'s mask covers the cached tokens too
        inputs = self.attention_inputs(
            b,
            n,
            attention_mask=attention_mask,
            global_attention_mask=global_attention_mask,
            output_attentions=output_attentions,
            is_causal=self.config.is_decoder,
            cache=cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache,
        )
        cross = None
        if cross_states is not None:
            keys = self.attention_inputs(b, cross_states.shape[1], attention_mask=encoder_attention_mask)
            cross_cache = cache if isinstance(cache, EncoderDecoderCache) else None
            cross = CrossAttentionInputs(keys, cross_cache)
        last, all_hidden, all_attentions = self.encoder(
            hidden_states, inputs, output_hidden_states, cross_states, cross
        )
        return BaseModelOutputWithPoolingAndCrossAttentions(
            last_hidden_state=last,
            pooler_output=self.pooler(last) if self.pooler is not None else None,
            cache=cache,
            hidden_states=all_hidden,
            attentions=all_attentions,
        )

    def check_encoder_states(
        self, b: int, states: torch.Tensor | None, mask: torch.Tensor | None
    ) -> torch.Tensor | None:
        """``encoder_hidden_states`` (b, m, D) and ``encoder_attention_mask`` (b, m) against this model: given
        exactly when it has cross-attention, of its batch and width; returns the states."""
        owner, width = type(self).__name__, self.config.hidden_size
        if not self.config.add_cross_attention:
            if states is not None or mask is not None:
                raise InputError(
                    f"{owner}: encoder_hidden_states / encoder_attention_mask were given, but this model has "
                    "no cross-attention. Build the decoder with is_decoder=True, add_cross_attention=True "
                    "(an EncoderDecoderModel sets both), or drop them."
                )
            return None
        if states is None:
            raise InputError(
                f"{owner}: this decoder has cross-attention (add_cross_attention=True) and needs "
                "encoder_hidden_states, (batch, encoder seq, hidden_size) = the encoder's last_hidden_state; "
                "none were given. Call it through EncoderDecoderModel, or pass them."
            )
        if states.dim() != 3 or states.shape[0] != b or states.shape[2] != width or states.shape[1] == 0:
            raise InputError(
                f"{owner}: encoder_hidden_states must have shape (batch, encoder seq, hidden_size) = "
                f"({b}, m > 0, {width}), got {tuple(states.shape)}. Pass the encoder's last_hidden_state for "
                "this batch (an encoder of another width needs EncoderDecoderModel's enc_to_dec_proj)."
            )
        check_float_input(owner, "encoder_hidden_states", states, "Pass the encoder's last_hidden_state.")
        if mask is not None and tuple(mask.shape) != tuple(states.shape[:2]):
            raise InputError(
                f"{owner}: encoder_attention_mask must have shape (batch, encoder seq) = "
                f"{tuple(states.shape[:2])} of encoder_hidden_states, got {tuple(mask.shape)}. Pass the "
                "encoder's own attention_mask (1 = real token)."
            )
        return states

    def _generation_cache(
        self, cache: EfficientCache | EncoderDecoderCache | None, use_cache: bool | None, cross: bool = False
    ) -> EfficientCache | EncoderDecoderCache | None:
        """The cache of this forward: the one given, a new one when a decoder is asked for one, or None. With
        cross-attention (``cross``) a new one is an ``EncoderDecoderCache`` (this model's EfficientCache, and
        the encoder's keys and values); the empty transformers caches ``generate()`` of an EncoderDecoderModel
        passes get an EfficientCache in place of their self-attention half."""
        if not self.config.is_decoder:  # use_cache is ignored, as BertModel does without is_decoder
            if cache is not None:
                raise InputError(
                    "cache is for causal models: this EfficientBert is a bidirectional encoder "
                    "(is_decoder=False), whose every token attends to later ones. Load a decoder: "
                    "EfficientBertForCausalLM with is_decoder=True."
                )
            return None
        if isinstance(cache, EncoderDecoderCache):
            if not isinstance(cache.self_attention_cache, EfficientCache):
                if cache.self_attention_cache.get_seq_length() > 0:
                    raise TypeError(
                        "cache: the EncoderDecoderCache's self-attention half already holds transformers' "
                        "keys and values; this decoder keeps an EfficientCache there (model.new_cache()). "
                        "Start from an empty cache, or let generate() make it."
                    )
                cache.self_attention_cache = self.new_cache()
            return cache
        if cache is not None:
            if not isinstance(cache, EfficientCache):
                raise TypeError(
                    f"cache must be an hf_efficient EfficientCache (model.new_cache()), got "
                    f"{type(cache).__name__}: the attention cores keep their own state (running sums, "
                    "windows) besides keys and values. generate() makes the right one when given none."
                )
            return cache
        # A layer recomputed in backward (gradient checkpointing) would fill a cache twice (and read the
        # encoder's keys from it the second time): training so makes none.
        recomputed = self.training and self.is_activation_checkpointing
        if use_cache and recomputed:
            raise InputError(
                f"{type(self).__name__}: use_cache=True cannot be combined with gradient checkpointing in "
                "training (recomputed layers would update the cache twice). Pass use_cache=False, or call "
                "model.eval() / model.gradient_checkpointing_disable() to generate."
            )
        use_cache = self.config.use_cache and not recomputed if use_cache is None else use_cache
        if not use_cache:
            return None
        return EncoderDecoderCache(self.new_cache(), DynamicCache()) if cross else self.new_cache()


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

    def loss(self, hidden_states: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The MLM loss of (M, D) hidden states against (M,) labels without building the (M, V) logits
        (:func:`~hf_efficient.modeling.losses.chunked_cross_entropy`)."""
        return chunked_cross_entropy(
            self.transformed(hidden_states), self.decoder.weight, self.decoder.bias, labels
        )


def next_sentence_head(config: EfficientBertConfig) -> nn.Linear:
    """BERT's next-sentence head on the pooled [CLS]: (b, D) -> (b, 2), 0 = B follows A, 1 = B is random."""
    return nn.Linear(config.hidden_size, 2)


def next_sentence_loss(owner: str, logits: torch.Tensor, labels: torch.Tensor, name: str) -> torch.Tensor:
    """Cross-entropy of (b, 2) next-sentence logits against (b,) labels (the argument ``name``)."""
    fix = (
        "Next-sentence labels hold one id per sentence pair: 0 when sentence B follows sentence A, 1 when B "
        "is a random sentence."
    )
    classes = "2 next-sentence classes (0 = is next, 1 = is random)"
    check_class_labels(owner, labels, 2, logits.shape[:1], "(batch,)", classes=classes, fix=fix, name=name)
    return mean_cross_entropy(logits, labels)


class EfficientBertWithLMHead(EfficientBertPreTrainedModel):
    """The encoder under BERT's LM head, its decoder tied to the word embeddings: what the masked and the
    causal language model and BERT's pretraining model share (parameter names ``bert.*``,
    ``cls.predictions.*``, as BERT's). ``with_next_sentence_head``: the pretraining model's pooler and its
    next-sentence head ``cls.seq_relationship`` too."""

    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }
    with_next_sentence_head = False

    def __init__(self, config: EfficientBertConfig):
        super().__init__(config)
        self.bert = EfficientBertModel(config, add_pooling_layer=self.with_next_sentence_head)
        self.cls = nn.Module()
        self.cls.predictions = EfficientBertLMPredictionHead(config)
        if self.with_next_sentence_head:
            self.cls.seq_relationship = next_sentence_head(config)
        self.post_init()

    def check_mlm_labels(self, labels: torch.Tensor, shape: torch.Size) -> None:
        """Masked-LM labels: (b, n) of the inputs, token ids below vocab_size or -100."""
        vocab = self.cls.predictions.decoder.out_features
        check_class_labels(
            type(self).__name__, labels, vocab, shape, "(batch, seq) of the inputs",
            classes=f"vocab_size={vocab}",
            fix="MLM labels hold the original token id at each masked position and -100 elsewhere, one "
            "per input token (DataCollatorForLanguageModeling makes them).",
        )  # fmt: skip

    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings):
        self.cls.predictions.decoder = new_embeddings
        self.cls.predictions.bias = new_embeddings.bias


class EfficientBertForMaskedLM(EfficientBertWithLMHead):
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        global_attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
    ) -> MaskedLMOutput:
        """Masked-LM logits, and with ``labels`` the loss averaged over the masked positions.

        Args:
            labels: (b, n) token ids at masked positions, -100 elsewhere (the MLM collator's).

        Returns:
            ``MaskedLMOutput``. Without labels, ``logits`` are (b, n, V), as BERT's. With labels, what
            ``logits`` holds follows ``config.sparse_prediction``:

            * ``None`` (the default): in training mode (``model.train()``) only the masked positions reach
              the vocabulary and the loss is computed chunk by chunk without building their logits, so
              ``logits`` is None and no tensor of size n x V exists (the loss and gradients are those of
              the dense head); in eval mode, (b, n, V) as BERT's (``Trainer.evaluate`` with
              ``compute_metrics`` reads them);
            * ``True``: logits of the masked positions only, (M, V) in batch order (ModernBERT's option);
            * ``False``: (b, n, V) always, as ``BertForMaskedLM`` (n x V floats, twice over in training).
        """
        outputs = self.bert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            global_attention_mask=global_attention_mask,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        hidden = outputs.last_hidden_state  # (b, n, D)
        if labels is not None:
            self.check_mlm_labels(labels, hidden.shape[:2])
        sparse = self.config.sparse_prediction
        if labels is not None and (sparse or (sparse is None and self.training)):
            # Only the M masked positions reach the head: hidden (M, D), labels (M,).
            scored = labels.reshape(-1) != -100
            hidden, labels = hidden.reshape(-1, hidden.shape[-1])[scored], labels.reshape(-1)[scored]
            if sparse is None:  # training: the loss without any (M, V) tensor
                loss = self.cls.predictions.loss(hidden, labels)
                return MaskedLMOutput(
                    loss=loss, hidden_states=outputs.hidden_states, attentions=outputs.attentions
                )
        logits = self.cls.predictions(hidden)  # (b, n, V), or (M, V) with sparse_prediction=True
        # Averaged over the masked positions; 0 (not NaN) for a batch in which nothing was masked.
        loss = mean_cross_entropy(logits, labels) if labels is not None else None
        return MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class EfficientBertForPreTraining(EfficientBertWithLMHead):
    """BERT's pretraining model (transformers' ``BertForPreTraining``): the masked-LM head, tied to the word
    embeddings, and the next-sentence head on the pooled [CLS] (``cls.seq_relationship``)."""

    with_next_sentence_head = True

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        global_attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
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
        outputs = self.bert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            global_attention_mask=global_attention_mask,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        hidden = outputs.last_hidden_state  # (b, n, D)
        if labels is not None:
            self.check_mlm_labels(labels, hidden.shape[:2])
        prediction_logits = self.cls.predictions(hidden)  # (b, n, V)
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


class EfficientBertForCausalLM(EfficientBertWithLMHead, GenerationMixin):
    """A causal language model (transformers' ``BertLMHeadModel``: BERT with ``is_decoder=True``) for any
    attention type with a causal form, with ``generate()`` and ``pipeline("text-generation")``.

    Generation decodes token by token from an :class:`~hf_efficient.attention.cache.EfficientCache`: the
    prompt runs through each core's parallel causal form once, then every new token costs what the core's
    state costs: O(n) per token against ``full``'s growing key/value cache, O(1) in the context for
    ``linear``, ``performer`` and ``rfa`` (a fixed-size recurrent state: "Transformers are RNNs") and for
    ``longformer`` (the last w keys). Greedy search, sampling and beam search work as with any transformers
    model; assisted generation, which rolls a cache back, is refused for recurrent and windowed states.

    With ``add_cross_attention=True`` every layer also attends to an encoder's states
    (``encoder_hidden_states``; BERT's ``crossattention``, of ``config.cross_attention_type``): the decoder of
    a bert2bert ``EncoderDecoderModel``, whose cache is then transformers' ``EncoderDecoderCache``.

    Example:
        >>> config = EfficientBertConfig(is_decoder=True, attention_type="linear", vocab_size=8000)
        >>> model = EfficientBertForCausalLM(config)
        >>> model.generate(input_ids, max_new_tokens=50)
    """

    # forward hands Trainer's num_items_in_batch to the loss (a sum over the targets divided by the count over
    # every device and accumulation step), so Trainer must pass it, and not average the loss again.
    accepts_loss_kwargs = True

    def __init__(self, config: EfficientBertConfig):
        if not config.is_decoder:  # builds and warns, as BertLMHeadModel (a BERT checkpoint opens as a LM)
            logger.warning_once(
                "EfficientBertForCausalLM with is_decoder=False attends in both directions (every token sees "
                "the later ones): add is_decoder=True to use it as a causal language model "
                "(EfficientBertForCausalLM.from_pretrained(path, is_decoder=True) for an encoder checkpoint)."
            )
        super().__init__(config)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        """generate() must not build transformers' DynamicCache: the forward makes an EfficientCache, whose
        layers the cores build (running sums and windows as well as keys and values)."""
        return False

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
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        cache: EfficientCache | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        **loss_kwargs,
    ) -> CausalLMOutputWithCrossAttentions:
        """Next-token logits (b, n, V); with ``labels`` (b, n) the loss of predicting token i + 1 at i
        (labels are the input ids, shifted here; -100 is ignored). In training mode with labels the decoder
        and the loss run fused, a chunk of positions at a time, and ``logits`` is None: no (b, n, V) tensor
        is built (:func:`~hf_efficient.modeling.losses.chunked_cross_entropy`); in eval mode (``Trainer.
        evaluate``, ``generate``) the logits are returned as BERT's.

        Args:
            cache, use_cache: the generation state (see :meth:`EfficientBertModel.forward`); training with
                labels makes none unless one is given.
            logits_to_keep: an int k > 0 computes the logits of the last k positions only (``generate()``
                asks for 1 during the prompt); a 1-D tensor, those of the positions it lists.
            encoder_hidden_states, encoder_attention_mask: a decoder with cross-attention (the decoder of
                an EncoderDecoderModel): the encoder's states and padding (see EfficientBertModel.forward).
            loss_kwargs: transformers' causal-LM loss keywords, as ``BertLMHeadModel`` hands them to its
                ``loss_function``: ``shift_labels`` (targets already aligned, used instead of shifting
                ``labels``), ``num_items_in_batch`` (the loss is the sum over the targets divided by it:
                Trainer's count over devices and accumulation steps), ``ignore_index``.
        """
        if labels is not None and cache is None:
            use_cache = False
        outputs = self.bert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            cache=cache,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
        )
        hidden = slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep)  # (b, n | k, D)
        check_loss_kwargs(type(self).__name__, loss_kwargs)
        if labels is not None:
            targets, num_items = causal_lm_targets(labels, loss_kwargs)  # (b, n)
            targets = targets.to(hidden.device)
        if self.training and labels is not None and hidden.shape[1] == targets.shape[1]:
            # Training: the decoder and the loss fused chunk by chunk, no (b, n, V) logits (logits None)
            return CausalLMOutputWithCrossAttentions(
                loss=per_item_loss(self.cls.predictions.loss(hidden, targets), targets, num_items),
                logits=None,
                cache=outputs.cache,
                hidden_states=outputs.hidden_states,
                attentions=outputs.attentions,
            )
        logits = self.cls.predictions(hidden)  # (b, n | k, V)
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


class EfficientBertForSequenceClassification(EfficientBertPreTrainedModel):
    """Pooled [CLS] -> dropout -> linear; single-label, multi-label or regression as transformers does."""

    def __init__(self, config: EfficientBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = EfficientBertModel(config)
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        global_attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
    ) -> SequenceClassifierOutput:
        outputs = self.bert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            global_attention_mask=global_attention_mask,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        logits = self.classifier(self.dropout(outputs.pooler_output))  # (b, num_labels)
        loss = None
        if labels is not None:
            loss = classification_loss(self.config, logits, labels, owner=type(self).__name__)
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class EfficientBertForTokenClassification(EfficientBertPreTrainedModel):
    def __init__(self, config: EfficientBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = EfficientBertModel(config, add_pooling_layer=False)
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        global_attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
    ) -> TokenClassifierOutput:
        """``labels``: (b, n) class ids, -100 at positions to ignore (padding, sub-word continuations)."""
        outputs = self.bert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            global_attention_mask=global_attention_mask,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        logits = self.classifier(self.dropout(outputs.last_hidden_state))  # (b, n, num_labels)
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


class EfficientBertForNextSentencePrediction(EfficientBertPreTrainedModel):
    """BERT's next-sentence head alone (transformers' ``BertForNextSentencePrediction``): pooled [CLS] ->
    ``cls.seq_relationship`` -> (b, 2) logits, 0 = sentence B follows sentence A, 1 = B is random."""

    def __init__(self, config: EfficientBertConfig):
        super().__init__(config)
        self.bert = EfficientBertModel(config)
        self.cls = nn.Module()
        self.cls.seq_relationship = next_sentence_head(config)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        global_attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
    ) -> NextSentencePredictorOutput:
        """``labels``: (b,) 0 when sentence B follows sentence A, 1 when B is random."""
        outputs = self.bert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            global_attention_mask=global_attention_mask,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        logits = self.cls.seq_relationship(outputs.pooler_output)  # (b, 2)
        loss = None
        if labels is not None:
            loss = next_sentence_loss(type(self).__name__, logits, labels, "labels")
        return NextSentencePredictorOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class EfficientBertForMultipleChoice(EfficientBertPreTrainedModel):
    """BERT's multiple-choice head (transformers' ``BertForMultipleChoice``): every choice of an example is
    encoded as its own sequence, pooled [CLS] -> dropout -> linear gives one score per choice, and the
    scores of an example are its logits (b, num_choices)."""

    def __init__(self, config: EfficientBertConfig):
        super().__init__(config)
        self.bert = EfficientBertModel(config)
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    def tracing_blockers(self) -> list[str]:
        return [
            *super().tracing_blockers(),
            "EfficientBertForMultipleChoice takes (batch, num_choices, seq) inputs, which the export's text "
            "signature (batch, seq) does not serve: score the choices as a batch of sequences with the same "
            "weights instead, e.g. EfficientBertForSequenceClassification.from_pretrained(folder, "
            "num_labels=1) (its classifier is the choice scorer).",
        ]

    def flatten_choices(self, input_ids, inputs_embeds, **per_token) -> tuple[int, dict]:
        """Checks the (b, c, n) inputs and returns c and the inputs as b * c sequences: ``input_ids`` and the
        ``per_token`` tensors (b * c, n), ``inputs_embeds`` (b * c, n, D)."""
        owner = type(self).__name__
        fix = (
            "Multiple-choice inputs hold every choice of an example: tokenize each (question, choice) pair, "
            "then stack them per example (a (batch, num_choices, seq) tensor; DataCollatorForMultipleChoice "
            "in transformers' examples does it)."
        )
        if input_ids is not None:
            check_rank(owner, "input_ids", input_ids, "(batch, num_choices, seq)", fix)
            shape = input_ids.shape
        elif inputs_embeds is not None:
            check_rank(owner, "inputs_embeds", inputs_embeds, "(batch, num_choices, seq, hidden_size)", fix)
            shape = inputs_embeds.shape[:3]
        else:
            raise InputError(f"{owner}: pass input_ids (batch, num_choices, seq) or inputs_embeds. {fix}")
        flat = {}
        for name, tensor in per_token.items():
            if tensor is not None:
                check_same_shape(owner, name, tensor, shape, "(batch, num_choices, seq) of the inputs")
                flat[name] = tensor.reshape(-1, shape[-1])
        flat["input_ids"] = input_ids.reshape(-1, shape[-1]) if input_ids is not None else None
        if inputs_embeds is not None:
            flat["inputs_embeds"] = inputs_embeds.reshape(-1, *inputs_embeds.shape[2:])
        return shape[1], flat

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        global_attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
    ) -> MultipleChoiceModelOutput:
        """Args:
        input_ids: (b, c, n) token ids, c choices per example (each the question and one answer);
            ``attention_mask``, ``token_type_ids``, ``position_ids``, ``global_attention_mask`` the same
            shape, ``inputs_embeds`` (b, c, n, D).
        labels: (b,) the index of the right choice, in [0, c) (-100: no target).

        Returns:
            ``MultipleChoiceModelOutput`` with logits (b, c); hidden states and attentions are those of the
            b * c sequences, as transformers'.
        """
        num_choices, flat = self.flatten_choices(
            input_ids,
            inputs_embeds,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            global_attention_mask=global_attention_mask,
        )
        outputs = self.bert(
            **flat, output_attentions=output_attentions, output_hidden_states=output_hidden_states
        )
        logits = self.classifier(self.dropout(outputs.pooler_output)).view(-1, num_choices)  # (b, c)
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


class EfficientBertForQuestionAnswering(EfficientBertPreTrainedModel):
    """Extractive question answering as transformers' ``BertForQuestionAnswering``: the encoder (no pooler)
    and ``qa_outputs``, a linear map of every token to a start and an end logit. With a long-context type
    (Longformer, BigBird) one window reads a whole document, where a 512-token BERT reads it in strided
    windows (the question-answering pipeline's ``doc_stride``)."""

    def __init__(self, config: EfficientBertConfig):
        super().__init__(config)
        self.bert = EfficientBertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        global_attention_mask: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
    ) -> QuestionAnsweringModelOutput:
        """Start and end logits (b, n); with ``start_positions`` and ``end_positions`` (b,) the loss,
        transformers' (:func:`~hf_efficient.modeling.heads.span_loss`): positions past the input are
        ignored, and the loss is the mean of the start and the end cross-entropies."""
        outputs = self.bert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            global_attention_mask=global_attention_mask,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        logits = self.qa_outputs(outputs.last_hidden_state)  # (b, n, 2)
        start_logits, end_logits = (part.squeeze(-1).contiguous() for part in logits.split(1, dim=-1))
        loss = None
        if start_positions is not None or end_positions is not None:
            loss = span_loss(type(self).__name__, start_logits, end_logits, start_positions, end_positions)
        return QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
