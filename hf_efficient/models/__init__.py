"""The encoders, one sub-package per modality, and their registration with transformers' Auto classes."""

from transformers import (
    AutoConfig,
    AutoImageProcessor,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForImageClassification,
    AutoModelForMaskedImageModeling,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForNextSentencePrediction,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)
from transformers.utils import is_vision_available

from ..clients import register_with_peft
from .graph import (
    EfficientGraphConfig,
    EfficientGraphForGraphClassification,
    EfficientGraphForNodeClassification,
    EfficientGraphModel,
    GraphCollator,
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
)
from .text.question_answering import register_question_answering_pipeline
from .vision import (
    EfficientViTConfig,
    EfficientViTForImageClassification,
    EfficientViTForMaskedImageModeling,
    EfficientViTImageProcessor,
    EfficientViTMAEForPreTraining,
    EfficientViTModel,
)

# Every config class registered below, in order: what the clients' integrations (hf_efficient.clients) read.
REGISTERED_CONFIGS: list[type] = []


def _register(config_class, mapping: dict) -> None:
    """Register with the Auto classes (idempotent: a second import of the package is a no-op)."""
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    if config_class not in REGISTERED_CONFIGS:
        REGISTERED_CONFIGS.append(config_class)
    for auto_class, model_class in mapping.items():
        auto_class.register(config_class, model_class, exist_ok=True)


_register(
    EfficientBertConfig,
    {
        AutoModel: EfficientBertModel,
        AutoModelForMaskedLM: EfficientBertForMaskedLM,
        AutoModelForCausalLM: EfficientBertForCausalLM,
        AutoModelForPreTraining: EfficientBertForPreTraining,
        AutoModelForNextSentencePrediction: EfficientBertForNextSentencePrediction,
        AutoModelForSequenceClassification: EfficientBertForSequenceClassification,
        AutoModelForMultipleChoice: EfficientBertForMultipleChoice,
        AutoModelForTokenClassification: EfficientBertForTokenClassification,
        AutoModelForQuestionAnswering: EfficientBertForQuestionAnswering,
    },
)
register_question_answering_pipeline()  # transformers 5 removed pipeline("question-answering")

_register(
    EfficientViTConfig,
    {
        AutoModel: EfficientViTModel,
        AutoModelForImageClassification: EfficientViTForImageClassification,
        AutoModelForPreTraining: EfficientViTMAEForPreTraining,
        AutoModelForMaskedImageModeling: EfficientViTForMaskedImageModeling,
    },
)
if is_vision_available():  # without Pillow ([vision] extra) there is no image processor to register
    AutoImageProcessor.register(
        EfficientViTConfig, image_processor_classes={"pil": EfficientViTImageProcessor}, exist_ok=True
    )

# Graph classification is one label per input, as sequence classification; node classification one label per
# element, as token classification: the graph models register under those Auto classes.
_register(
    EfficientGraphConfig,
    {
        AutoModel: EfficientGraphModel,
        AutoModelForSequenceClassification: EfficientGraphForGraphClassification,
        AutoModelForTokenClassification: EfficientGraphForNodeClassification,
    },
)

register_with_peft(REGISTERED_CONFIGS)  # PEFT's default target modules for our model types, once PEFT loads

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
]
