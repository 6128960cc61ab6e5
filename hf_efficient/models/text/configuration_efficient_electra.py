"""Configuration of EfficientElectra: BERT's fields with ELECTRA's embedding width and sequence summary."""

from huggingface_hub.dataclasses import strict
from transformers.activations import ACT2FN

from ...errors import InputError
from .configuration_efficient_bert import EfficientBertConfig

# How ElectraForMultipleChoice reduces a sequence to one vector (transformers' sequence summary): the first
# token, the last position, the mean over all positions, or the position ``cls_index`` names (the multiple
# choice head gives none: the last position).
SUMMARY_TYPES = ("first", "last", "mean", "cls_index")


@strict(accept_kwargs=True)
class EfficientElectraConfig(EfficientBertConfig):
    """An ELECTRA encoder (Clark et al. 2020) whose attention is chosen by ``attention_type``: BERT's fields,
    ELECTRA's defaults (ELECTRA-small's discriminator) and its own fields, so an ELECTRA ``config.json``
    loads as an ``EfficientElectraConfig``.

    Attributes:
        embedding_size: width of the word, position and token type embeddings; when it is not
            ``hidden_size`` a linear map (``embeddings_project``) takes them to the layers' width, and the
            generator's LM head works at this width (its decoder is the word embeddings).
        summary_type, summary_use_proj, summary_activation, summary_last_dropout: the multiple-choice head's
            sequence summary (transformers' ``ElectraSequenceSummary``): which position
            (:data:`SUMMARY_TYPES`), a ``hidden_size`` projection, an activation ("" or None for none) and
            the dropout after them. ``summary_first_dropout`` (before them) is read where a config sets it,
            as transformers does.

    Example:
        >>> config = EfficientElectraConfig(attention_type="bigbird", max_position_embeddings=4096)
    """

    model_type = "efficient_electra"
    compatible_model_types = ("electra",)
    weight_shape_fields = (*EfficientBertConfig.weight_shape_fields, "embedding_size")

    embedding_size: int = 128
    hidden_size: int = 256
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    summary_type: str = "first"
    summary_use_proj: bool = True
    summary_activation: str | None = "gelu"
    summary_last_dropout: float | int = 0.1

    def validate_electra_fields(self):
        """Class validator: a summary type and activation transformers' ELECTRA builds."""
        kind, activation = self.summary_type, self.summary_activation
        if kind not in SUMMARY_TYPES:
            extra = " ('attn' is not implemented by transformers either)" if kind == "attn" else ""
            raise InputError(
                f"summary_type={kind!r} is not a sequence summary ELECTRA has{extra}; use one of "
                f"{', '.join(SUMMARY_TYPES)} (checkpoints use 'first')."
            )
        if activation and activation not in ACT2FN:
            raise InputError(
                f"summary_activation={activation!r} is not an activation transformers knows; use one of "
                f"{', '.join(sorted(ACT2FN))}, or None for no activation."
            )
