"""The encoders, one sub-package per modality, and their registration with transformers' Auto classes: one
model family at a time (:mod:`hf_efficient.models.families`), its classes collected from its module."""

from transformers.utils import is_vision_available

from ..clients import register_with_peft
from . import graph, text, vision
from .families import FAMILIES, ModelFamily, register_family
from .graph import *  # noqa: F403  (graph.__all__)

# The families' modules, whose classes name their tasks (ModelFamily.collect)
from .graph import modeling_efficient_graph
from .text import *  # noqa: F403  (text.__all__)
from .text import (
    modeling_efficient_bert,
    modeling_efficient_distilbert,
    modeling_efficient_electra,
    modeling_efficient_modernbert,
    modeling_efficient_roberta,
)
from .text.question_answering import register_question_answering_pipeline
from .vision import *  # noqa: F403  (vision.__all__)
from .vision import modeling_efficient_deit, modeling_efficient_dinov2, modeling_efficient_vit

register_family(ModelFamily.collect(text.EfficientBertConfig, modeling_efficient_bert))
register_family(ModelFamily.collect(text.EfficientRobertaConfig, modeling_efficient_roberta))
register_family(ModelFamily.collect(text.EfficientXLMRobertaConfig, modeling_efficient_roberta))
register_family(ModelFamily.collect(text.EfficientElectraConfig, modeling_efficient_electra))
register_family(ModelFamily.collect(text.EfficientDistilBertConfig, modeling_efficient_distilbert))
register_family(ModelFamily.collect(text.EfficientModernBertConfig, modeling_efficient_modernbert))
register_question_answering_pipeline()  # transformers 5 removed pipeline("question-answering")

# without Pillow ([vision] extra) there is no image processor to register
_processor = vision.EfficientViTImageProcessor if is_vision_available() else None
register_family(ModelFamily.collect(vision.EfficientViTConfig, modeling_efficient_vit, _processor))
register_family(ModelFamily.collect(vision.EfficientDeiTConfig, modeling_efficient_deit, _processor))
register_family(ModelFamily.collect(vision.EfficientDinov2Config, modeling_efficient_dinov2, _processor))
register_family(ModelFamily.collect(graph.EfficientGraphConfig, modeling_efficient_graph))

# PEFT's default target modules for every family's model type, once PEFT is imported
register_with_peft(lambda: [family.config_class for family in FAMILIES.values()])

# Each modality's public names stand once, in its own package's __all__.
__all__ = [*text.__all__, *vision.__all__, *graph.__all__]
