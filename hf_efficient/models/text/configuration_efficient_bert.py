"""Configuration of EfficientBert: BERT's fields plus the attention fields of every hf_efficient encoder."""

from huggingface_hub.dataclasses import strict

from ...attention.registry import (
    causal_attention_types,
    check_cross_attention_type,
    check_relative_positions_type,
    validate_attention_config,
)
from ...attention.relative import RELATIVE_POSITION_TYPES
from ...errors import InputError
from ...modeling.config import EfficientEncoderConfig


@strict(accept_kwargs=True)
class EfficientBertConfig(EfficientEncoderConfig):
    """A BERT encoder whose attention is chosen by ``attention_type``.

    BERT's own fields keep their names and defaults, so a BERT ``config.json`` loads as an
    ``EfficientBertConfig`` (with ``attention_type="full"`` unless given). ``is_decoder=True`` makes it a
    causal language model (:class:`EfficientBertForCausalLM`), as BERT's ``BertLMHeadModel``; with
    ``add_cross_attention=True`` too, the decoder of an ``EncoderDecoderModel`` (its cross-attention of
    ``cross_attention_type``, exact by default).

    Example:
        >>> config = EfficientBertConfig(
        ...     attention_type="longformer",
        ...     attention_config={"attention_window": 256},
        ...     max_position_embeddings=4096,
        ... )
    """

    model_type = "efficient_bert"
    modality = "text"
    compatible_model_types = ("bert",)
    weight_shape_fields = (
        "vocab_size", "hidden_size", "intermediate_size", "max_position_embeddings", "type_vocab_size",
    )  # fmt: skip

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float | int = 0.1
    attention_probs_dropout_prob: float | int = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    classifier_dropout: float | int | None = None
    tie_word_embeddings: bool = True
    # BERT's positions: "absolute" (a learned table added to the embeddings), or learned relative position
    # scores added to every query-key score (Shaw et al. 2018 "relative_key", Huang et al. 2020
    # "relative_key_query": each layer's attention.self.distance_embedding, 2 * max_position_embeddings - 1
    # rows), as transformers 4's BERT builds them; those need an attention type that forms the scores of the
    # pairs it attends to (hf_efficient.relative_position_types(): full, longformer).
    position_embedding_type: str = "absolute"
    # A causal model (EfficientBertForCausalLM, BERT's is_decoder): every token attends to itself and earlier
    # tokens only, and generation decodes from a cache (use_cache). Needs an attention type with a causal
    # form (hf_efficient.causal_attention_types()).
    is_decoder: bool = False
    use_cache: bool = True
    # A decoder that also attends to an encoder's states (BERT's add_cross_attention: the decoder of a
    # bert2bert EncoderDecoderModel); its cross-attention has its own type, exact by default (as
    # Longformer-Encoder-Decoder's), or any type that can attend to another sequence
    # (hf_efficient.cross_attention_types()).
    add_cross_attention: bool = False
    cross_attention_type: str = "full"
    cross_attention_config: dict | None = None
    # Masked LM with labels: which positions reach the vocabulary projection (EfficientBertForMaskedLM.forward
    # says what `logits` then holds). None: in training only the masked ones, through a chunked loss that
    # never builds an n x V tensor; in eval every position (BERT's logits). True: the masked ones, whose
    # logits are returned (ModernBERT's option). False: every position (BERT's), in training too.
    sparse_prediction: bool | None = None

    def validate_bert_fields(self):
        """Class validator: no BERT option we do not implement is silently dropped. (Whether hidden_size
        splits into num_attention_heads is checked when a model is built, as BertConfig accepts any sizes.)
        Models run these validators again when built (``EfficientPreTrainedModel.__init__``), so an option
        set on the config after construction is refused there too."""
        position_type = self.position_embedding_type
        if position_type != "absolute":
            if position_type not in RELATIVE_POSITION_TYPES:
                raise InputError(
                    f"position_embedding_type={position_type!r} is not one of BERT's: 'absolute', "
                    f"{', '.join(map(repr, RELATIVE_POSITION_TYPES))}."
                )
            for layer_type in dict.fromkeys(self.layer_attention_types or [self.attention_type]):
                try:
                    check_relative_positions_type(layer_type, self.modality)
                except ValueError as error:
                    raise InputError(f"position_embedding_type={position_type!r}: {error}") from None
        if self.add_cross_attention:
            if not self.is_decoder:
                raise InputError(
                    "add_cross_attention=True needs is_decoder=True: cross-attention belongs to a decoder "
                    "(EfficientBertForCausalLM, the decoder of an EncoderDecoderModel)."
                )
            check_cross_attention_type(self.cross_attention_type, self.modality)
            validate_attention_config(self.cross_attention_type, self.cross_attention_config)
        if self.is_decoder:
            layer_types = self.layer_attention_types or [self.attention_type]
            causal = causal_attention_types(self.modality)
            refused = sorted(set(layer_types) - set(causal))
            if refused:
                raise InputError(
                    f"is_decoder=True needs attention types with a causal form; {refused} has none. Causal "
                    f"attention types: {', '.join(causal)}."
                )
