"""Configuration of EfficientDistilBert: DistilBERT's own fields plus the attention fields of every
hf_efficient encoder."""

from typing import ClassVar

from huggingface_hub.dataclasses import strict

from ...errors import InputError
from ...modeling.config import EfficientEncoderConfig


@strict(accept_kwargs=True)
class EfficientDistilBertConfig(EfficientEncoderConfig):
    """A DistilBERT encoder (Sanh et al. 2019) whose attention is chosen by ``attention_type``.

    DistilBERT's fields keep their names and defaults (``dim``, ``n_layers``, ``n_heads``, ``hidden_dim``,
    ``dropout``, ``attention_dropout``, ``activation``, ...), so a DistilBERT ``config.json`` loads as an
    ``EfficientDistilBertConfig``; ``attribute_map`` lets the shared blocks read them under BERT's names
    (``hidden_size`` is ``dim``, ``intermediate_size`` is ``hidden_dim``, ...), as transformers' config does
    for three of them. What DistilBERT fixes is not a field: LayerNorm's epsilon (1e-12, whatever a
    ``layer_norm_eps`` set on the config says, as in transformers), no token types (``type_vocab_size`` 0:
    token_type_ids are refused), an encoder only (no decoder, no cross-attention).

    Attributes:
        sinusoidal_pos_embds: the position table starts as fixed sinusoids (Vaswani et al. 2017) instead of
            random rows (it is a trained parameter either way, as in transformers);
            ``resize_position_embeddings`` extends it with the same sinusoids.
        qa_dropout: the dropout before the question-answering head.
        seq_classif_dropout: the dropout of the sequence-classification and multiple-choice heads.
        sparse_prediction: which positions a masked LM with labels projects to the vocabulary (see
            ``EfficientBertConfig.sparse_prediction``).

    Example:
        >>> config = EfficientDistilBertConfig(attention_type="longformer", max_position_embeddings=4096)
    """

    model_type = "efficient_distilbert"
    compatible_model_types = ("distilbert",)
    attribute_map: ClassVar[dict[str, str]] = {
        "hidden_size": "dim",
        "num_attention_heads": "n_heads",
        "num_hidden_layers": "n_layers",
        "intermediate_size": "hidden_dim",
        "hidden_act": "activation",
        "hidden_dropout_prob": "dropout",
        "attention_probs_dropout_prob": "attention_dropout",
    }
    weight_shape_fields = ("vocab_size", "dim", "hidden_dim", "max_position_embeddings")
    type_vocab_size: ClassVar[int] = 0  # no segments: no token type table
    is_decoder: ClassVar[bool] = False
    add_cross_attention: ClassVar[bool] = False

    vocab_size: int = 30522
    max_position_embeddings: int = 512
    sinusoidal_pos_embds: bool = False
    n_layers: int = 6
    n_heads: int = 12
    dim: int = 768
    hidden_dim: int = 4 * 768
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.1
    activation: str = "gelu"
    initializer_range: float = 0.02
    qa_dropout: float | int = 0.1
    seq_classif_dropout: float | int = 0.2
    pad_token_id: int | None = 0
    eos_token_id: int | list[int] | None = None
    bos_token_id: int | None = None
    tie_word_embeddings: bool = True
    sparse_prediction: bool | None = None

    def validate_distilbert_fields(self):
        """Class validator: what DistilBERT fixes is not changed through the BERT names the shared code
        reads (a config set ``is_decoder=True`` on, or given ``type_vocab_size=2``), where transformers'
        DistilBERT would ignore them and the two models would differ."""
        if self.is_decoder or self.add_cross_attention:
            raise InputError(
                "DistilBERT is an encoder: is_decoder / add_cross_attention cannot be set on an "
                "EfficientDistilBertConfig (transformers' DistilBERT has no decoder either). For a causal "
                "language model use a family that has one: EfficientBertForCausalLM, "
                "EfficientRobertaForCausalLM, EfficientElectraForCausalLM."
            )
        if self.type_vocab_size != 0:
            raise InputError(
                f"type_vocab_size={self.type_vocab_size}: DistilBERT has no token type embeddings (its "
                "tokenizer returns no token_type_ids); drop the field."
            )
