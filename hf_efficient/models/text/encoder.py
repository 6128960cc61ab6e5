"""What every text family shares: the bare encoder's forward (checks, padding, global tokens, decoding from a
cache, cross-attention) and the base of its models; a family (BERT, RoBERTa, ELECTRA, ...) states only what
differs: its embeddings, its layers and their names, what runs after the layers.

A family's bare model is ``class EfficientXModel(EfficientXPreTrainedModel, EfficientTextModel)`` with its
``embeddings_class`` (and ``layer_class`` when its layers are not BERT's); its task models are in
:mod:`hf_efficient.models.text.tasks`.

Shapes: b = batch, n = sequence length, D = hidden_size.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn
from transformers import AutoModel
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import can_return_tuple

from ...attention.cache import EfficientCache
from ...attention.inputs import AttentionInputs, is_tracing, normalize_padding_mask
from ...attention.packing import PackedSequences
from ...errors import InputError
from ...modeling.blocks import CrossAttentionInputs, EfficientEncoder, EfficientLayer, EfficientLayerStack
from ...modeling.checks import check_float_input, check_ids, check_not_empty, check_rank, check_same_shape
from ...modeling.heads import Pooler
from ...modeling.pretrained import EfficientPreTrainedModel
from ...modeling.unpadding import UnpaddedBatch, unpadded_batch


def packed_sequences(b: int, attention_mask, position_ids, cache, cross_states) -> PackedSequences | None:
    """The sequences of a packed row (transformers' ``DataCollatorWithFlattening``: one row, no padding,
    ``position_ids`` restarting at 0 where each example starts), or None for a batch of rows."""
    if is_tracing() or position_ids is None or cache is not None or cross_states is not None:
        return None  # (tracing first: asking whether b == 1 would make a traced batch size a guard)
    if b != 1:
        return None
    if attention_mask is not None and not bool(attention_mask.bool().all()):
        return None
    if int((position_ids == 0).sum()) < 2:
        return None  # one sequence: nothing to keep apart
    return PackedSequences.from_position_ids(position_ids)


class EfficientTextPreTrainedModel(EfficientPreTrainedModel):
    """Base of every text family's models: BERT's position-table resizing, on any family with a learned
    position table (``embeddings.position_embeddings``)."""

    # Older checkpoints (bert-base-uncased, all-MiniLM-L6-v2) store the embeddings' position_ids buffer;
    # positions are built on the fly here, so the key is expected and not reported.
    _keys_to_ignore_on_load_unexpected = [r"embeddings\.position_ids", r"embeddings\.token_type_ids"]

    @property
    def position_offset(self) -> int:
        """The position-table rows below the first real token's position: RoBERTa's and XLM-R's padding row
        and the one before it (2), else 0."""
        return getattr(getattr(self.base_model, "embeddings", None), "position_offset", 0)

    @property
    def max_input_tokens(self) -> int:
        """The tokens one sequence may hold, [CLS] and [SEP] included: ``max_position_embeddings`` less
        :attr:`position_offset` (a RoBERTa's 514 rows hold 512 tokens)."""
        return self.config.max_position_embeddings - self.position_offset

    @torch.no_grad()
    def resize_position_embeddings(self, new_length: int, reinitialize_fixed_length_attention: bool = False):
        """Serve longer inputs: extend the learned position table by copying it (Beltagy et al. 2020, 3.5).

        Works on the bare encoder and on every task model (their base model). Rows ``[k * old, (k + 1) *
        old)`` repeat the trained rows, so every position keeps a trained embedding and local structure is
        preserved. Attention types built for a fixed length (Linformer) have length-sized parameters of their
        own: they are rebuilt freshly only when ``reinitialize_fixed_length_attention=True``, never silently.
        """
        base = self.base_model  # the encoder itself, or the one inside a task model
        old = getattr(base.embeddings, "position_embeddings", None)
        if old is None:
            raise InputError(
                f"{type(self).__name__} has no learned position table to extend (its positions are rotary: "
                "they need no table); set max_position_embeddings instead."
            )
        if getattr(self.config, "position_embedding_type", "absolute") != "absolute":
            raise InputError(
                f"{type(self).__name__} has relative positions (position_embedding_type="
                f"{self.config.position_embedding_type!r}): its position table is not read, and each "
                "layer's distance_embedding holds trained distances below max_position_embeddings only, "
                "which copying cannot extend. Train a checkpoint with absolute positions for longer inputs."
            )
        if new_length <= old.num_embeddings:
            raise ValueError(f"new_length={new_length} must exceed the current {old.num_embeddings}.")
        fixed = [core for core in self.attention_cores() if core.capabilities.fixed_max_length]
        if fixed and not reinitialize_fixed_length_attention:
            raise ValueError(
                f"{fixed[0].attention_type} has parameters sized by the maximum length, which cannot be "
                "extended without new training. Pass reinitialize_fixed_length_attention=True to rebuild "
                "them freshly, or choose an attention type without a fixed length."
            )
        # Rows below the first real token's position (RoBERTa's padding row and the one before) stay; the
        # trained rows of real positions repeat after them.
        offset = self.position_offset
        table = old.weight.new_empty(new_length, old.embedding_dim)
        table[:offset] = old.weight[:offset]
        trained = old.weight[offset:]
        for start in range(offset, new_length, len(trained)):
            rows = min(len(trained), new_length - start)
            table[start : start + rows] = trained[:rows]
        resized = nn.Embedding.from_pretrained(table, freeze=False, padding_idx=old.padding_idx)
        base.embeddings.position_embeddings = resized
        self.config.max_position_embeddings = new_length
        if fixed:
            base.layer_stack().rebuild_fixed_length_cores()

    def get_position_embeddings(self) -> nn.Embedding | None:
        return getattr(self.base_model.embeddings, "position_embeddings", None)


class EfficientTextModel(EfficientTextPreTrainedModel):
    """The bare encoder of a text family: embeddings, the layers, and with ``add_pooling_layer`` (for the
    families that have one: ``has_pooler``) BERT's pooled [CLS].

    A family sets ``embeddings_class`` (``forward(input_ids, token_type_ids, position_ids, inputs_embeds,
    past_length)`` -> (b, n, D)), ``layer_class`` and, where its layout is not BERT's ``encoder.layer.N``,
    overrides :meth:`build_layers` / :meth:`layer_stack`; :meth:`project` and :meth:`finish` run between
    the embeddings and the layers (ELECTRA's projection) and after them (a final norm).
    """

    auto_class = AutoModel
    embeddings_class: ClassVar[type[nn.Module]]
    layer_class: ClassVar[type[nn.Module]] = EfficientLayer
    has_pooler: ClassVar[bool] = True

    def __init__(self, config, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = self.embeddings_class(config)
        self.build_layers(config)
        self.pooler = Pooler(config) if add_pooling_layer and self.has_pooler else None
        self.post_init()

    def build_layers(self, config) -> None:
        """BERT's layout: ``encoder.layer.N``."""
        self.encoder = EfficientEncoder(config, self.layer_class)

    def layer_stack(self) -> EfficientLayerStack:
        return self.encoder.layer

    @property
    def is_decoder(self) -> bool:
        """Whether this encoder attends causally (``config.is_decoder``; an encoder-only family has none)."""
        return getattr(self.config, "is_decoder", False)

    def project(self, embeddings: torch.Tensor) -> torch.Tensor:
        """What runs between the embeddings and the first layer (nothing, for BERT)."""
        return embeddings

    def finish(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """What runs after the last layer (nothing, for BERT)."""
        return hidden_states

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def check_inputs(self, input_ids, token_type_ids, position_ids, inputs_embeds) -> tuple[int, int]:
        """Shapes, dtypes and (in eager mode) values of the inputs, against the embedding tables; returns
        (b, n). The attention mask is checked with the other attention inputs (``attention_inputs``)."""
        owner, words = type(self).__name__, self.get_input_embeddings()
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(f"{owner}: pass exactly one of input_ids (b, n) or inputs_embeds (b, n, D).")
        if input_ids is not None:
            one = "Batch a single sequence as input_ids[None] (the tokenizer's return_tensors='pt' does)."
            check_rank(owner, "input_ids", input_ids, "(batch, seq)", one)
            check_not_empty(owner, "input_ids", input_ids.shape)
            rows = words.num_embeddings
            fix = (
                "Tokenize with this model's tokenizer, or give the model the tokenizer's vocabulary: "
                "model.resize_token_embeddings(len(tokenizer))."
            )
            check_ids(owner, "input_ids", input_ids, rows, f"vocab_size={rows} word embeddings", fix)
            b, n = input_ids.shape
        else:
            width = words.embedding_dim  # embedding_size where a family has one (ELECTRA), else hidden_size
            name = "embedding_size" if width != self.config.hidden_size else "hidden_size"
            check_rank(owner, "inputs_embeds", inputs_embeds, f"(batch, seq, {name})")
            check_not_empty(owner, "inputs_embeds", inputs_embeds.shape[:2])
            if inputs_embeds.shape[-1] != width:
                raise ValueError(
                    f"{owner}: inputs_embeds must have {name}={width} features per token, got shape "
                    f"{tuple(inputs_embeds.shape)}."
                )
            check_float_input(owner, "inputs_embeds", inputs_embeds, "Pass finite embeddings.")
            b, n = inputs_embeds.shape[:2]
        if token_type_ids is not None:
            check_same_shape(owner, "token_type_ids", token_type_ids, (b, n), "(batch, seq) of the inputs")
            table = getattr(self.embeddings, "token_type_embeddings", None)
            if table is None:
                raise InputError(
                    f"{owner}: token_type_ids were given, but this model has no token type embeddings (its "
                    "family has no segments: its tokenizer returns none). Drop token_type_ids "
                    "(tokenizer(..., return_token_type_ids=False))."
                )
            types = table.num_embeddings
            fix = f"Segment ids are 0 for a first sentence, 1 for a second (below {types}): the tokenizer's."
            check_ids(owner, "token_type_ids", token_type_ids, types, f"type_vocab_size={types}", fix)
        if position_ids is not None:
            if position_ids.dim() != 2 or position_ids.shape[1] != n or position_ids.shape[0] not in (1, b):
                raise ValueError(
                    f"{owner}: position_ids must have shape (batch, seq) = {(b, n)} or (1, seq), got "
                    f"{tuple(position_ids.shape)}."
                )
            if self.get_position_embeddings() is None:  # rotary positions: any position has its angles
                return b, n
            positions = self.config.max_position_embeddings
            fix = "Positions count from 0; extend the table: model.resize_position_embeddings(new_length)."
            table = f"max_position_embeddings={positions} position embeddings"
            check_ids(owner, "position_ids", position_ids, positions, table, fix)
        return b, n

    def extra_attention_inputs(self, b: int, n: int, position_ids, past_length: int) -> dict:
        """Fields of the call's AttentionInputs a family adds (none for BERT)."""
        return {}

    def layer_attention_inputs(
        self, inputs: AttentionInputs, hidden_states: torch.Tensor, position_ids
    ) -> AttentionInputs | list[AttentionInputs]:
        """What the layers are given: the call's AttentionInputs for every layer (BERT), or one per layer
        (ModernBERT's rotary positions, a theta per layer kind)."""
        return inputs

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
            token_type_ids: (b, n) segment ids, for the families that have them (BERT's, ELECTRA's).
            global_attention_mask: (b, n) 1 = global token, for attention types with per-example global
                tokens (Longformer); others raise when given one.
            cache: decoders only: the generation state of the tokens before these (``model.new_cache()``,
                or the ``cache`` of the previous output), updated in place.
            use_cache: decoders only (default ``config.use_cache``): return the state after these tokens as
                ``cache``, starting a new one if none is given.
            encoder_hidden_states: decoders with cross-attention (``add_cross_attention``): (b, m, D) the
                encoder's states every layer attends to. With a cache the cache is transformers'
                ``EncoderDecoderCache`` (this model's state, and each layer's projected encoder keys and
                values, computed at the first step and reused after, as BERT's). None: the cross-attention
                is skipped, the model runs as a plain decoder (and a new cache is an EfficientCache).
            encoder_attention_mask: (b, m) the encoder's padding, 1 = real token (the encoder's input mask).
        """
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        b, n = self.check_inputs(input_ids, token_type_ids, position_ids, inputs_embeds)
        cross_states = self.check_encoder_states(b, encoder_hidden_states, encoder_attention_mask)
        packed = packed_sequences(b, attention_mask, position_ids, cache, cross_states)
        if packed is not None:
            if use_cache:
                raise InputError(
                    f"{type(self).__name__}: use_cache=True with a packed row (position_ids restarting at "
                    "0): a generation cache holds one sequence per row. Decode the sequences as a batch."
                )
            use_cache = False
        cache = self._generation_cache(cache, use_cache, cross_states is not None)
        past = cache.get_seq_length() if cache is not None else 0
        # A packed row counts each sequence from 0 (DataCollatorWithFlattening's convention); the family's
        # positions of a sequence alone start at its position_offset (RoBERTa's pad_token_id + 1).
        embedded_positions = position_ids
        if packed is not None:
            embedded_positions = position_ids + getattr(self.embeddings, "position_offset", 0)
        # (b, n, D)
        embeddings = self.embeddings(input_ids, token_type_ids, embedded_positions, inputs_embeds, past)
        hidden_states = self.project(embeddings)
        if cache is not None and attention_mask is not None and attention_mask.shape[-1] == past + n != n:
            attention_mask = attention_mask[:, past:]  # generate()'s mask covers the cached tokens too
        padding_free = self.config.padding_free and cache is None and cross_states is None
        stream = None
        if (
            padding_free and packed is None and not output_attentions
        ):  # weights are one (n x n) matrix per padded row
            attention_mask = normalize_padding_mask(attention_mask, b, n, type(self).__name__)
            stream = unpadded_batch(attention_mask, enabled=True)
        if stream is not None:
            return self._forward_unpadded(
                stream, input_ids, token_type_ids, position_ids, inputs_embeds, global_attention_mask,
                output_hidden_states,
            )  # fmt: skip
        inputs = self.attention_inputs(
            b,
            n,
            attention_mask=None if packed is not None else attention_mask,  # a packed row has no padding
            global_attention_mask=global_attention_mask,
            output_attentions=output_attentions,
            is_causal=self.is_decoder,
            cache=cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache,
            packed=packed,
            **self.extra_attention_inputs(b, n, position_ids, past),
        )
        cross = None
        if cross_states is not None:
            keys = self.attention_inputs(b, cross_states.shape[1], attention_mask=encoder_attention_mask)
            cross_cache = cache if isinstance(cache, EncoderDecoderCache) else None
            cross = CrossAttentionInputs(keys, cross_cache)
        layer_inputs = self.layer_attention_inputs(inputs, hidden_states, position_ids)
        last, all_hidden, all_attentions = self.layer_stack()(
            hidden_states, layer_inputs, output_hidden_states, cross_states, cross
        )
        last = self.finish(last)
        pooled = None
        if self.pooler is not None:  # a packed row: each sequence's first token, (B, D)
            firsts = last if packed is None else last[0, packed.cu_seqlens[:-1]][:, None]
            pooled = self.pooler(firsts)
        return BaseModelOutputWithPoolingAndCrossAttentions(
            last_hidden_state=last,
            pooler_output=pooled,
            cache=cache,
            hidden_states=all_hidden,
            attentions=all_attentions,
        )

    def _forward_unpadded(
        self,
        stream: UnpaddedBatch,
        input_ids,
        token_type_ids,
        position_ids,
        inputs_embeds,
        global_attention_mask,
        output_hidden_states: bool,
    ) -> BaseModelOutputWithPoolingAndCrossAttentions:
        """The padded batch's T real tokens as one (1, T) stream through the embeddings and every layer,
        scattered back to (b, n, D) with zeros at padding. Each token keeps the position the padded batch
        gives it, so every real token's output is the padded computation's."""
        b, n = stream.shape
        if position_ids is None:
            device = (input_ids if input_ids is not None else inputs_embeds).device
            default = getattr(self.embeddings, "default_position_ids", None)  # a table's positions (BERT's)
            if default is not None:
                position_ids = default(input_ids, n, 0, device)  # (1 | b, n)
            else:  # rotary positions: 0 .. n - 1
                position_ids = torch.arange(n, device=device)[None]
        positions = stream.gather(position_ids)  # (1, T)
        embeddings = self.embeddings(
            stream.gather(input_ids), stream.gather(token_type_ids), positions, stream.gather(inputs_embeds)
        )  # (1, T, D)
        inputs = self.attention_inputs(
            1,
            stream.num_tokens,
            packed=stream.packed,
            global_attention_mask=stream.gather(global_attention_mask),
            is_causal=getattr(self.config, "is_decoder", False),
            **self.extra_attention_inputs(1, stream.num_tokens, positions, 0),
        )
        hidden_states = self.project(embeddings)
        inputs = self.layer_attention_inputs(inputs, hidden_states, positions)
        last, all_hidden, _ = self.layer_stack()(hidden_states, inputs, output_hidden_states)
        last = stream.scatter(self.finish(last))  # (b, n, D)
        return BaseModelOutputWithPoolingAndCrossAttentions(
            last_hidden_state=last,
            pooler_output=self.pooler(last) if self.pooler is not None else None,
            hidden_states=None if all_hidden is None else tuple(stream.scatter(h) for h in all_hidden),
        )

    def check_encoder_states(
        self, b: int, states: torch.Tensor | None, mask: torch.Tensor | None
    ) -> torch.Tensor | None:
        """``encoder_hidden_states`` (b, m, D) and ``encoder_attention_mask`` (b, m) against this model: given
        only when it has cross-attention, of its batch and width; returns the states. A decoder with
        cross-attention called without them runs as a plain decoder (its cross-attention skipped, as
        transformers' BERT does), the mask then not given either."""
        owner, width = type(self).__name__, self.config.hidden_size
        if not getattr(self.config, "add_cross_attention", False):  # an encoder-only family has no field
            if states is not None or mask is not None:
                raise InputError(
                    f"{owner}: encoder_hidden_states / encoder_attention_mask were given, but this model has "
                    "no cross-attention. Build the decoder with is_decoder=True, add_cross_attention=True "
                    "(an EncoderDecoderModel sets both), or drop them."
                )
            return None
        if states is None:  # a plain decoder for this call: the cross-attention is skipped, as BERT's
            if mask is not None:
                raise InputError(
                    f"{owner}: encoder_attention_mask was given without encoder_hidden_states; pass the "
                    "encoder's states (batch, encoder seq, hidden_size) with it, or drop it."
                )
            return None
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
        owner = type(self).__name__
        if not self.is_decoder:  # use_cache is ignored, as BertModel does without is_decoder
            if cache is not None:
                raise InputError(
                    f"cache is for causal models: this {owner} is a bidirectional encoder "
                    "(is_decoder=False), whose every token attends to later ones. Load a decoder: its "
                    "ForCausalLM class with is_decoder=True."
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
                f"{owner}: use_cache=True cannot be combined with gradient checkpointing in training "
                "(recomputed layers would update the cache twice). Pass use_cache=False, or call "
                "model.eval() / model.gradient_checkpointing_disable() to generate."
            )
        use_cache = self.config.use_cache and not recomputed if use_cache is None else use_cache
        if not use_cache:
            return None
        return EncoderDecoderCache(self.new_cache(), DynamicCache()) if cross else self.new_cache()
