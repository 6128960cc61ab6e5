"""EfficientDeiT: DeiT (Touvron et al. 2021, data-efficient image transformers) with any registered vision
attention; what differs from the shared vision encoder lives here.

DeiT is ViT's encoder with ViT's parameter names under ``deit`` and a second prefix token: the distillation
token (``deit.embeddings.distillation_token``) after [CLS], which a distilled model's second classifier reads
(:class:`EfficientDeiTForImageClassificationWithTeacher`). Its position table has a row for each prefix
token; resized for another image size, both rows stay and the patch rows are resized bicubically, as
transformers' ``DeiTEmbeddings``. ``swin_window`` keeps both prefix tokens global.

Shapes: b = batch, N = patches, D = hidden_size.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AutoModelForImageClassification
from transformers import initialization as init
from transformers.models.deit.modeling_deit import DeiTForImageClassificationWithTeacherOutput
from transformers.processing_utils import Unpack
from transformers.utils.generic import can_return_tuple

from ...errors import InputError
from .configuration_efficient_deit import EfficientDeiTConfig
from .encoder import EfficientVisionEmbeddings, EfficientVisionModel, EfficientVisionPreTrainedModel
from .tasks import (
    ImageClassificationTask,
    MaskedImageModelingTask,
    VisionInputs,
    VisionTaskModel,
    linear_classifier,
)


class EfficientDeiTEmbeddings(EfficientVisionEmbeddings):
    """ViT's embeddings with DeiT's distillation token after [CLS]: the sequence is [CLS], [DIST], patches."""

    def __init__(self, config: EfficientDeiTConfig, use_mask_token: bool = False):
        super().__init__(config, use_mask_token)
        self.distillation_token = nn.Parameter(torch.zeros(1, 1, config.hidden_size))

    def prefix_tokens(self, batch: int) -> torch.Tensor:
        """(b, 2, D): [CLS] and the distillation token."""
        return torch.cat([self.cls_token, self.distillation_token], dim=1).expand(batch, -1, -1)


class EfficientDeiTPreTrainedModel(EfficientVisionPreTrainedModel):
    config_class = EfficientDeiTConfig
    base_model_prefix = "deit"

    def _init_embeddings(self, module: EfficientDeiTEmbeddings) -> None:
        super()._init_embeddings(module)
        init.trunc_normal_(module.distillation_token, mean=0.0, std=self.config.initializer_range)


class EfficientDeiTModel(EfficientDeiTPreTrainedModel, EfficientVisionModel):
    """The bare encoder: final-LayerNorm hidden states (b, 2 + N, D) and, optionally, the pooled [CLS]
    (transformers' ``DeiTModel``)."""

    embeddings_class = EfficientDeiTEmbeddings


class EfficientDeiTForImageClassification(EfficientDeiTPreTrainedModel, ImageClassificationTask):
    """Final [CLS] -> linear (transformers' ``DeiTForImageClassification``); trains with labels."""

    bare_model_class = EfficientDeiTModel


class EfficientDeiTForImageClassificationWithTeacher(EfficientDeiTPreTrainedModel, VisionTaskModel):
    """A distilled DeiT's two classifiers (transformers' ``DeiTForImageClassificationWithTeacher``):
    ``cls_classifier`` on [CLS] and ``distillation_classifier`` on the distillation token; ``logits`` is
    their mean. Inference only, as upstream's: training with a teacher is not implemented (fine-tune
    :class:`EfficientDeiTForImageClassification` from the same checkpoint instead).

    ``AutoModelForImageClassification`` gives this class for checkpoints saved from it (their
    ``architectures``), the plain classifier otherwise.
    """

    auto_class = AutoModelForImageClassification
    auto_class_by_architecture = True
    bare_model_class = EfficientDeiTModel

    def build_head(self, config) -> None:
        self.num_labels = config.num_labels
        self.cls_classifier = linear_classifier(config.hidden_size, config.num_labels)
        self.distillation_classifier = linear_classifier(config.hidden_size, config.num_labels)

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **inputs: Unpack[VisionInputs],
    ) -> DeiTForImageClassificationWithTeacherOutput:
        """``logits`` (b, num_labels), the mean of ``cls_logits`` and ``distillation_logits``.

        Args:
            labels: refused: this head has no loss (inference only).
        """
        if labels is not None:
            raise InputError(
                f"{type(self).__name__} is inference only (as transformers'): it has no loss for labels. "
                "Fine-tune EfficientDeiTForImageClassification from the same checkpoint (its classifier "
                "reads [CLS]), or compute a distillation loss from cls_logits and distillation_logits."
            )
        outputs = self.base_model(pixel_values, **inputs)
        hidden = outputs.last_hidden_state  # (b, 2 + N, D)
        cls_logits = self.cls_classifier(hidden[:, 0])  # (b, num_labels)
        distillation_logits = self.distillation_classifier(hidden[:, 1])
        return DeiTForImageClassificationWithTeacherOutput(
            logits=(cls_logits + distillation_logits) / 2,
            cls_logits=cls_logits,
            distillation_logits=distillation_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class EfficientDeiTForMaskedImageModeling(EfficientDeiTPreTrainedModel, MaskedImageModelingTask):
    """SimMIM on DeiT (transformers' ``DeiTForMaskedImageModeling``): both prefix tokens are dropped before
    the patches are decoded to pixels (see :class:`MaskedImageModelingTask`)."""

    bare_model_class = EfficientDeiTModel
