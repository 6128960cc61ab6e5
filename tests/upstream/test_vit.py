"""transformers' ViT and ViT-MAE model tests on EfficientViT and EfficientViTMAE: testers written as
transformers' ViTModelTester and ViTMAEModelTester, through ModelTesterMixin once per type of
tests/upstream/common.py, in `make test` only (slow). The ViT and ViT-MAE models share the text
families' PreTrainedModel base, encoder and cores (hf_efficient/modeling/); what is their own (patch
embeddings, pre-norm layers, the MAE decoder, the masked-image head) the fast loop checks output for output
against transformers' ViT, ViT-MAE and masked-image models, and per attention type (tests/models/vision/).
"""

from __future__ import annotations

import math

import torch

from hf_efficient import (
    EfficientViTConfig,
    EfficientViTForImageClassification,
    EfficientViTForMaskedImageModeling,
    EfficientViTMAEForPreTraining,
    EfficientViTModel,
)

from .common import add_test_classes, attention_fields, floats_tensor


class VisionTester:
    """A tiny ViT (as transformers' ViTModelTester): 8x8 images of 2x2 patches, [CLS] + 16 tokens."""

    batch_size, image_size, patch_size, num_channels = 3, 8, 2, 3
    hidden_size, num_hidden_layers, num_attention_heads, intermediate_size = 32, 2, 4, 37
    num_labels, mask_ratio = 3, 0.0
    is_training = True

    def __init__(self, parent, attention_type: str):
        self.parent, self.attention_type = parent, attention_type
        num_patches = (self.image_size // self.patch_size) ** 2
        self.seq_length = int(math.ceil((1 - self.mask_ratio) * (num_patches + 1)))  # [CLS] + kept patches
        # masked image modeling: the common tests mask the first num_masks of the mask_length patches
        self.num_masks, self.mask_length = num_patches // 2, num_patches

    def get_config(self) -> EfficientViTConfig:
        return EfficientViTConfig(
            image_size=self.image_size, patch_size=self.patch_size, num_channels=self.num_channels,
            hidden_size=self.hidden_size, num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads, intermediate_size=self.intermediate_size,
            num_labels=self.num_labels, mask_ratio=self.mask_ratio, encoder_stride=self.patch_size,
            decoder_hidden_size=16,
            decoder_num_hidden_layers=1, decoder_num_attention_heads=2, decoder_intermediate_size=20,
            **attention_fields(self.attention_type),
        )  # fmt: skip

    def prepare_config_and_inputs_for_common(self):
        shape = [self.batch_size, self.num_channels, self.image_size, self.image_size]
        return self.get_config(), {"pixel_values": floats_tensor(shape)}


class MAETester(VisionTester):
    """ViT-MAE (as transformers' ViTMAEModelTester): MAE keeps a quarter of the patches, the common tests
    get fixed masking noise so that two calls mask the same patches."""

    mask_ratio = 0.75

    def prepare_config_and_inputs_for_common(self):
        config, inputs = super().prepare_config_and_inputs_for_common()
        num_patches = (self.image_size // self.patch_size) ** 2
        inputs["noise"] = torch.rand(self.batch_size, num_patches, generator=torch.Generator().manual_seed(0))
        return config, inputs


VISION_CLASSES = (EfficientViTModel, EfficientViTForImageClassification, EfficientViTForMaskedImageModeling)

add_test_classes(globals(), "vision", VisionTester, VISION_CLASSES, modality="vision")
add_test_classes(globals(), "mae", MAETester, (EfficientViTMAEForPreTraining,), modality="vision")
