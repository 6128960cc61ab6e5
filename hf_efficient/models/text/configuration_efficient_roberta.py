"""Configurations of EfficientRoberta and EfficientXLMRoberta: BERT's fields with RoBERTa's special tokens."""

from huggingface_hub.dataclasses import strict

from .configuration_efficient_bert import EfficientBertConfig


@strict(accept_kwargs=True)
class EfficientRobertaConfig(EfficientBertConfig):
    """A RoBERTa encoder (Liu et al. 2019) whose attention is chosen by ``attention_type``: BERT's fields and
    layout, RoBERTa's defaults (``<s>`` = 0, ``<pad>`` = 1, ``</s>`` = 2), so a RoBERTa ``config.json`` loads
    as an ``EfficientRobertaConfig``. Positions count from ``pad_token_id + 1`` (fairseq's), so a checkpoint
    reads ``max_position_embeddings - pad_token_id - 1`` tokens (512 of RoBERTa-base's 514 positions).

    Example:
        >>> config = EfficientRobertaConfig(attention_type="longformer", max_position_embeddings=4098)
    """

    model_type = "efficient_roberta"
    compatible_model_types = ("roberta",)

    vocab_size: int = 50265
    pad_token_id: int | None = 1
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 2


@strict(accept_kwargs=True)
class EfficientXLMRobertaConfig(EfficientRobertaConfig):
    """An XLM-RoBERTa encoder (Conneau et al. 2020): RoBERTa's architecture with a SentencePiece vocabulary of
    100 languages (the base of multilingual classifiers and embedders: bge-m3, multilingual-e5)."""

    model_type = "efficient_xlm-roberta"
    compatible_model_types = ("xlm-roberta",)

    vocab_size: int = 30522  # XLMRobertaConfig's default; checkpoints say 250002
