"""transformers' own model and config tests (ModelTesterMixin, ConfigTester) on our models.

The mixins come from the installed transformers version's source distribution (``make upstream-tests``
fetches it into build/; :mod:`tests.upstream.sdist`); without it this module skips. The testers are ours,
written as transformers writes its BERT and ViT testers, and every test class runs once per attention type
in :data:`ATTENTION_TYPES`. `make test` runs them all; `make test-fast` runs the text group on exact
attention (``full``), less the tests expectations.py leaves to `make test`: the other types and the vision
and MAE groups are marked ``slow``. The ViT and ViT-MAE models share the text group's PreTrainedModel base,
encoder and cores (hf_efficient/modeling/); what is their own (patch embeddings, pre-norm layers, the MAE
decoder, the masked-image head) the fast loop checks output for output against transformers' ViT, ViT-MAE
and masked-image models, and per attention type (tests/models/vision/). Every test skipped, expected to fail
or left to `make test`, and why, is in :mod:`tests.upstream.expectations`; nothing else here decides one.
"""

from __future__ import annotations

import math
import unittest

import pytest
import torch

from hf_efficient import (
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
    EfficientViTConfig,
    EfficientViTForImageClassification,
    EfficientViTForMaskedImageModeling,
    EfficientViTMAEForPreTraining,
    EfficientViTModel,
)

from ..attention.helpers import small_config
from . import sdist
from .expectations import apply_expectations

UPSTREAM = sdist.load()
if UPSTREAM is None:
    pytest.skip(
        f"transformers' test mixins are not fetched: run `{sdist.MAKE_TARGET}` (downloads the transformers "
        f"sdist once into {sdist.TESTS_DIR.parent.parent})",
        allow_module_level=True,
    )
ids_tensor = UPSTREAM.modeling.ids_tensor
floats_tensor = UPSTREAM.modeling.floats_tensor
random_attention_mask = UPSTREAM.modeling.random_attention_mask

ATTENTION_TYPES = ("full", "linear", "longformer", "bigbird")

# The classes each tester runs. A new head is one line in its tuple (the Auto class it registers with in
# hf_efficient/models/__init__.py decides its labels and inputs in the common tests).
TEXT_CLASSES = (
    EfficientBertModel,
    EfficientBertForMaskedLM,
    EfficientBertForCausalLM,
    EfficientBertForSequenceClassification,
    EfficientBertForTokenClassification,
    EfficientBertForQuestionAnswering,
    EfficientBertForMultipleChoice,
    EfficientBertForPreTraining,
    EfficientBertForNextSentencePrediction,
)
VISION_CLASSES = (
    EfficientViTModel,
    EfficientViTForImageClassification,
    EfficientViTForMaskedImageModeling,
)
MAE_CLASSES = (EfficientViTMAEForPreTraining,)


class TextTester:
    """A tiny BERT (as transformers' BertModelTester): 2 layers, hidden 32, 4 heads, 7 tokens."""

    batch_size, seq_length, vocab_size = 3, 7, 99
    hidden_size, num_hidden_layers, num_attention_heads, intermediate_size = 32, 2, 4, 37
    type_vocab_size, num_labels, num_choices = 2, 3, 4
    is_training = True

    def __init__(self, parent, attention_type: str):
        self.parent, self.attention_type = parent, attention_type

    def get_config(self) -> EfficientBertConfig:
        return EfficientBertConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            type_vocab_size=self.type_vocab_size, max_position_embeddings=64, num_labels=self.num_labels,
            attention_type=self.attention_type, attention_config=small_config(self.attention_type),
        )  # fmt: skip

    def prepare_config_and_inputs_for_common(self):
        shape = [self.batch_size, self.seq_length]
        inputs = {
            "input_ids": ids_tensor(shape, self.vocab_size),
            "token_type_ids": ids_tensor(shape, self.type_vocab_size),
            "attention_mask": random_attention_mask(shape),
        }
        return self.get_config(), inputs


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
            attention_type=self.attention_type, attention_config=small_config(self.attention_type),
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


def _text_prepare_for_class(self, inputs_dict, model_class, return_labels=False):
    """The mixin's inputs and labels, plus BERT's pre-training labels (MLM and next sentence), as
    transformers' BERT tests add them."""
    mixin = UPSTREAM.modeling
    inputs = mixin.ModelTesterMixin._prepare_for_class(self, inputs_dict, model_class, return_labels)
    if return_labels and model_class.__name__ in mixin.get_values(mixin.MODEL_FOR_PRETRAINING_MAPPING_NAMES):
        tester = self.model_tester
        inputs["labels"] = torch.zeros(tester.batch_size, tester.seq_length, dtype=torch.long)
        inputs["next_sentence_label"] = torch.zeros(tester.batch_size, dtype=torch.long)
    return inputs


GROUPS = {  # group name: (tester, model classes)
    "text": (TextTester, TEXT_CLASSES),
    "vision": (VisionTester, VISION_CLASSES),
    "mae": (MAETester, MAE_CLASSES),
}


def _model_test_class(group: str, attention_type: str) -> type:
    tester, classes = GROUPS[group]

    def setUp(self):
        self.model_tester = tester(self, attention_type)
        config_class = type(self.model_tester.get_config())
        self.config_tester = UPSTREAM.configuration.ConfigTester(
            self, config_class=config_class, has_text_modality=group == "text", hidden_size=37,
            common_properties=["hidden_size", "num_attention_heads", "num_hidden_layers"],
        )  # fmt: skip

    def test_config(self):
        self.config_tester.run_common_tests()

    body = {"all_model_classes": classes, "setUp": setUp, "test_config": test_config}
    if group == "text":
        body["_prepare_for_class"] = _text_prepare_for_class
    name = f"Test{group.capitalize()}_{attention_type}"
    mixins = (UPSTREAM.modeling.ModelTesterMixin,)
    if any(model_class.can_generate() for model_class in classes):  # as upstream's testers of generators
        mixins += (UPSTREAM.modeling.GenerationTesterMixin,)
    if attention_type != "full" or group != "text":  # `make test-fast` keeps text on the exact type; CI all
        body["pytestmark"] = [pytest.mark.slow]
    cls = type(name, (*mixins, unittest.TestCase), body)
    return apply_expectations(cls, group, attention_type)


for _group in GROUPS:
    for _type in ATTENTION_TYPES:
        _test_class = _model_test_class(_group, _type)
        globals()[_test_class.__name__] = _test_class
del _test_class  # pytest collects every TestCase in the module's namespace, whatever its name
