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

from . import graph, text, vision
from .graph import *  # noqa: F403  (graph.__all__)
from .text import *  # noqa: F403  (text.__all__)
from .text.question_answering import register_question_answering_pipeline
from .vision import *  # noqa: F403  (vision.__all__)


def _register(config_class, mapping: dict) -> None:
    """Register with the Auto classes (idempotent: a second import of the package is a no-op)."""
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    for auto_class, model_class in mapping.items():
        auto_class.register(config_class, model_class, exist_ok=True)


_register(
    text.EfficientBertConfig,
    {
        AutoModel: text.EfficientBertModel,
        AutoModelForMaskedLM: text.EfficientBertForMaskedLM,
        AutoModelForCausalLM: text.EfficientBertForCausalLM,
        AutoModelForPreTraining: text.EfficientBertForPreTraining,
        AutoModelForNextSentencePrediction: text.EfficientBertForNextSentencePrediction,
        AutoModelForSequenceClassification: text.EfficientBertForSequenceClassification,
        AutoModelForMultipleChoice: text.EfficientBertForMultipleChoice,
        AutoModelForTokenClassification: text.EfficientBertForTokenClassification,
        AutoModelForQuestionAnswering: text.EfficientBertForQuestionAnswering,
    },
)
register_question_answering_pipeline()  # transformers 5 removed pipeline("question-answering")

_register(
    vision.EfficientViTConfig,
    {
        AutoModel: vision.EfficientViTModel,
        AutoModelForImageClassification: vision.EfficientViTForImageClassification,
        AutoModelForPreTraining: vision.EfficientViTMAEForPreTraining,
        AutoModelForMaskedImageModeling: vision.EfficientViTForMaskedImageModeling,
    },
)
if is_vision_available():  # without Pillow ([vision] extra) there is no image processor to register
    AutoImageProcessor.register(
        vision.EfficientViTConfig,
        image_processor_classes={"pil": vision.EfficientViTImageProcessor},
        exist_ok=True,
    )

# Graph classification is one label per input, as sequence classification; node classification one label per
# element, as token classification: the graph models register under those Auto classes.
_register(
    graph.EfficientGraphConfig,
    {
        AutoModel: graph.EfficientGraphModel,
        AutoModelForSequenceClassification: graph.EfficientGraphForGraphClassification,
        AutoModelForTokenClassification: graph.EfficientGraphForNodeClassification,
    },
)

# Each modality's public names stand once, in its own package's __all__.
__all__ = [*text.__all__, *vision.__all__, *graph.__all__]
