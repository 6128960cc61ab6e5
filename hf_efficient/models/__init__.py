"""The encoders, one sub-package per modality, and their registration with transformers' Auto classes."""

from transformers.utils import is_vision_available

from ..clients import register_with_peft
from .families import FAMILIES, ModelFamily, register_family
from .graph import (
    EfficientGraphConfig,
    EfficientGraphForGraphClassification,
    EfficientGraphForNodeClassification,
    EfficientGraphModel,
    GraphCollator,
    modeling_efficient_graph,
)
from .text import (
    EfficientBertConfig,
    EfficientBertForCausalLM,
    EfficientBertForMaskedLM,
    EfficientBertForMultipleChoice,
    EfficientBertForNextSentencePrediction,
    EfficientBertForPreTraining,
    EfficientBertForQuestionAnswering,
    EfficientBertForSequenceClassification,
    EfficientBertForTokenClassification,
    EfficientBertModel,
    EfficientDistilBertConfig,
    EfficientDistilBertForMaskedLM,
    EfficientDistilBertForMultipleChoice,
    EfficientDistilBertForQuestionAnswering,
    EfficientDistilBertForSequenceClassification,
    EfficientDistilBertForTokenClassification,
    EfficientDistilBertModel,
    EfficientElectraConfig,
    EfficientElectraForCausalLM,
    EfficientElectraForMaskedLM,
    EfficientElectraForMultipleChoice,
    EfficientElectraForPreTraining,
    EfficientElectraForQuestionAnswering,
    EfficientElectraForSequenceClassification,
    EfficientElectraForTokenClassification,
    EfficientElectraModel,
    EfficientRobertaConfig,
    EfficientRobertaForCausalLM,
    EfficientRobertaForMaskedLM,
    EfficientRobertaForMultipleChoice,
    EfficientRobertaForQuestionAnswering,
    EfficientRobertaForSequenceClassification,
    EfficientRobertaForTokenClassification,
    EfficientRobertaModel,
    EfficientXLMRobertaConfig,
    EfficientXLMRobertaForCausalLM,
    EfficientXLMRobertaForMaskedLM,
    EfficientXLMRobertaForMultipleChoice,
    EfficientXLMRobertaForQuestionAnswering,
    EfficientXLMRobertaForSequenceClassification,
    EfficientXLMRobertaForTokenClassification,
    EfficientXLMRobertaModel,
    modeling_efficient_bert,
    modeling_efficient_distilbert,
    modeling_efficient_electra,
    modeling_efficient_roberta,
)
from .text.question_answering import register_question_answering_pipeline
from .vision import (
    EfficientViTConfig,
    EfficientViTForImageClassification,
    EfficientViTForMaskedImageModeling,
    EfficientViTImageProcessor,
    EfficientViTMAEForPreTraining,
    EfficientViTModel,
    modeling_efficient_vit,
)

register_family(ModelFamily.collect(EfficientBertConfig, modeling_efficient_bert))
register_family(ModelFamily.collect(EfficientRobertaConfig, modeling_efficient_roberta))
register_family(ModelFamily.collect(EfficientXLMRobertaConfig, modeling_efficient_roberta))
register_family(ModelFamily.collect(EfficientElectraConfig, modeling_efficient_electra))
register_family(ModelFamily.collect(EfficientDistilBertConfig, modeling_efficient_distilbert))
register_question_answering_pipeline()  # transformers 5 removed pipeline("question-answering")

# without Pillow ([vision] extra) there is no image processor to register
_processor = EfficientViTImageProcessor if is_vision_available() else None
register_family(ModelFamily.collect(EfficientViTConfig, modeling_efficient_vit, _processor))
register_family(ModelFamily.collect(EfficientGraphConfig, modeling_efficient_graph))

# PEFT's default target modules for every family's model type, once PEFT is imported
register_with_peft(lambda: [family.config_class for family in FAMILIES.values()])

__all__ = [
    "EfficientDistilBertConfig",
    "EfficientDistilBertForMaskedLM",
    "EfficientDistilBertForMultipleChoice",
    "EfficientDistilBertForQuestionAnswering",
    "EfficientDistilBertForSequenceClassification",
    "EfficientDistilBertForTokenClassification",
    "EfficientDistilBertModel",
    "EfficientElectraConfig",
    "EfficientElectraForCausalLM",
    "EfficientElectraForMaskedLM",
    "EfficientElectraForMultipleChoice",
    "EfficientElectraForPreTraining",
    "EfficientElectraForQuestionAnswering",
    "EfficientElectraForSequenceClassification",
    "EfficientElectraForTokenClassification",
    "EfficientElectraModel",
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
    "EfficientGraphConfig",
    "EfficientGraphForGraphClassification",
    "EfficientGraphForNodeClassification",
    "EfficientGraphModel",
    "EfficientViTConfig",
    "EfficientViTForImageClassification",
    "EfficientViTForMaskedImageModeling",
    "EfficientViTImageProcessor",
    "EfficientViTMAEForPreTraining",
    "EfficientViTModel",
    "GraphCollator",
    "EfficientRobertaConfig",
    "EfficientXLMRobertaConfig",
    "EfficientRobertaForCausalLM",
    "EfficientRobertaForMaskedLM",
    "EfficientRobertaForMultipleChoice",
    "EfficientRobertaForQuestionAnswering",
    "EfficientRobertaForSequenceClassification",
    "EfficientRobertaForTokenClassification",
    "EfficientRobertaModel",
    "EfficientXLMRobertaForCausalLM",
    "EfficientXLMRobertaForMaskedLM",
    "EfficientXLMRobertaForMultipleChoice",
    "EfficientXLMRobertaForQuestionAnswering",
    "EfficientXLMRobertaForSequenceClassification",
    "EfficientXLMRobertaForTokenClassification",
    "EfficientXLMRobertaModel",
]
