"""EfficientBert: the text encoder."""

from .configuration_efficient_bert import EfficientBertConfig
from .modeling_efficient_bert import (
    EfficientBertForCausalLM,
    EfficientBertForMaskedLM,
    EfficientBertForMultipleChoice,
    EfficientBertForNextSentencePrediction,
    EfficientBertForPreTraining,
    EfficientBertForQuestionAnswering,
    EfficientBertForSequenceClassification,
    EfficientBertForTokenClassification,
    EfficientBertModel,
    EfficientBertPreTrainedModel,
)

__all__ = [
    "EfficientBertConfig",
    "EfficientBertForCausalLM",
    "EfficientBertForMaskedLM",
    "EfficientBertForMultipleChoice",
    "EfficientBertForNextSentencePrediction",
    "EfficientBertForPreTraining",
    "EfficientBertForQuestionAnswering",
    "EfficientBertForSequenceClassification",
    "EfficientBertForTokenClassification",
    "EfficientBertModel",
    "EfficientBertPreTrainedModel",
]
