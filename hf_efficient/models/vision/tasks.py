"""The task models of every vision family: what a task does (its inputs, loss and output), once.

A family's head is ``class EfficientXForTask(EfficientXPreTrainedModel, TaskClass)`` (the family first, so
that what it defines overrides the task's defaults) with ``bare_model_class`` (its encoder, built under
``base_model_prefix`` with ``bare_model_options``) and, where its head differs from the default here,
``build_head`` and the task's logits method (:meth:`ImageClassificationTask.image_features`).

Every forward names ``pixel_values`` and the task's labels (what ``Trainer`` keeps of a dataset's columns)
and passes the other inputs (:class:`VisionInputs`) on to the encoder unchanged.

Shapes: b = batch, C = channels, H x W = image size, h x w = patch grid, N = h * w, P = prefix tokens,
D = hidden_size, s = encoder_stride.
"""

from __future__ import annotations

from typing import ClassVar, TypedDict

import torch
from torch import nn
from transformers import AutoModelForImageClassification, AutoModelForMaskedImageModeling
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    ImageClassifierOutput,
    MaskedImageModelingOutput,
)
from transformers.processing_utils import Unpack
from transformers.utils.generic import can_return_tuple

from ...errors import InputError
from ...modeling.heads import classification_loss
from .encoder import EfficientVisionModel, EfficientVisionPreTrainedModel


class VisionInputs(TypedDict, total=False):
    """What a vision head passes on to its encoder unchanged besides ``pixel_values`` (see
    :meth:`EfficientVisionModel.forward`)."""

    interpolate_pos_encoding: bool | None  # accept another image size (DINOv2 always does)
    output_attentions: bool | None
    output_hidden_states: bool | None


def linear_classifier(features: int, num_labels: int) -> nn.Module:
    """``features`` -> ``num_labels`` logits; ``num_labels=0``: the features themselves (as transformers')."""
    return nn.Linear(features, num_labels) if num_labels else nn.Identity()


class VisionTaskModel(EfficientVisionPreTrainedModel):
    """A task model: the family's bare encoder (``bare_model_class(config, **bare_model_options)``) under
    ``base_model_prefix``, then the head :meth:`build_head` builds."""

    bare_model_class: ClassVar[type[EfficientVisionModel]]
    bare_model_options: ClassVar[dict] = {"add_pooling_layer": False}
    auto_class: ClassVar[type | None] = None  # the Auto class of the task (a family registers it there)

    def __init__(self, config):
        super().__init__(config)
        setattr(self, self.base_model_prefix, self.bare_model_class(config, **self.bare_model_options))
        self.build_head(config)
        self.post_init()

    def build_head(self, config) -> None:
        """The head's modules, under the family's parameter names."""
        raise NotImplementedError


class ImageClassificationTask(VisionTaskModel):
    """One label per image: single-label, multi-label or regression as transformers does
    (:func:`~hf_efficient.modeling.heads.classification_loss`). Default head: ViT's, the final [CLS] ->
    ``classifier``."""

    auto_class = AutoModelForImageClassification

    def build_head(self, config) -> None:
        self.num_labels = config.num_labels
        self.classifier = linear_classifier(config.hidden_size, config.num_labels)

    def image_features(self, outputs: BaseModelOutputWithPooling) -> torch.Tensor:
        """What the classifier reads: the final [CLS] (b, D)."""
        return outputs.last_hidden_state[:, 0]

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **inputs: Unpack[VisionInputs],
    ) -> ImageClassifierOutput:
        """Logits (b, num_labels); with ``labels`` ((b,) class ids, (b, num_labels) 0/1 floats for
        multi-label, floats for regression) the loss."""
        outputs = self.base_model(pixel_values, **inputs)
        logits = self.classifier(self.image_features(outputs))  # (b, num_labels)
        loss = None
        if labels is not None and not self.config.num_labels:
            raise ValueError(
                f"{type(self).__name__}: num_labels=0 builds no classifier (the logits are the image "
                "features), so labels cannot be scored. Load the model with num_labels set to the number of "
                "classes."
            )
        if labels is not None:
            loss = classification_loss(self.config, logits, labels, owner=type(self).__name__)
        return ImageClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class MaskedImageModelingTask(VisionTaskModel):
    """Masked image modeling as transformers' ``ViTForMaskedImageModeling`` (SimMIM, Xie et al. 2021): the
    patches ``bool_masked_pos`` marks are replaced by a learned mask token, and every patch's final hidden
    state goes through a 1x1 convolution to ``encoder_stride**2 * num_channels`` values and a PixelShuffle
    (``decoder.0``, ``decoder.1``) back to pixels; the loss is the L1 error over the masked pixels.

    Unlike MAE the encoder sees every patch on the full grid, so every vision attention type serves it
    (``swin_window`` included).
    """

    auto_class = AutoModelForMaskedImageModeling
    bare_model_options = {"add_pooling_layer": False, "use_mask_token": True}

    def build_head(self, config) -> None:
        stride = config.encoder_stride
        self.decoder = nn.Sequential(
            nn.Conv2d(config.hidden_size, stride**2 * config.num_channels, kernel_size=1),
            nn.PixelShuffle(stride),
        )

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        bool_masked_pos: torch.Tensor | None = None,
        **inputs: Unpack[VisionInputs],
    ) -> MaskedImageModelingOutput:
        """Args:
        pixel_values: (b, C, H, W).
        bool_masked_pos: (b, N) 1 (True) = masked patch, row by row over the patch grid; with it, the loss.

        Returns:
            ``MaskedImageModelingOutput``: ``reconstruction`` (b, C, h * s, w * s), s = ``encoder_stride``
            (the image size when s = patch_size); ``loss``, with ``bool_masked_pos``, the mean absolute error
            over the masked pixels and channels.
        """
        config = self.config
        if bool_masked_pos is not None and config.patch_size != config.encoder_stride:
            raise InputError(
                f"{type(self).__name__}: bool_masked_pos needs a reconstruction of the image's size, but "
                f"encoder_stride={config.encoder_stride} makes each patch of patch_size={config.patch_size} "
                "another size. Build the model with encoder_stride equal to patch_size."
            )
        outputs = self.base_model(pixel_values, bool_masked_pos=bool_masked_pos, **inputs)
        b, _, height, width = pixel_values.shape
        h, w, p = height // config.patch_size, width // config.patch_size, config.patch_size
        patches = outputs.last_hidden_state[:, config.num_prefix_tokens :]  # (b, N, D), prefix dropped
        grid_features = patches.transpose(1, 2).contiguous().unflatten(2, (h, w))  # (b, D, h, w)
        reconstruction = self.decoder(grid_features)  # (b, C, h * s, w * s)
        loss = None
        if bool_masked_pos is not None:
            # (b, N) -> (b, 1, H, W): each patch's flag over its p x p pixels
            mask = bool_masked_pos.reshape(b, 1, h, 1, w, 1).expand(-1, -1, -1, p, -1, p)
            mask = mask.reshape(b, 1, height, width).to(reconstruction.dtype)
            error = (pixel_values.to(reconstruction.dtype) - reconstruction).abs()  # (b, C, H, W)
            loss = (error * mask).sum() / (mask.sum() + 1e-5) / config.num_channels
        return MaskedImageModelingOutput(
            loss=loss,
            reconstruction=reconstruction,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
