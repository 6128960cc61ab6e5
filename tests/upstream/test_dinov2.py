"""transformers' model tests on our DINOv2 classes, with a tester written as transformers'
``Dinov2ModelTester`` (tests/models/dinov2/test_modeling_dinov2.py, not shipped in the sdist): its sizes (13
images of 30x30 in 2x2 patches: [CLS] and 225 patches), its mask details (``num_masks`` counted over the
sequence, ``mask_length`` over the patches: DINOv2's bare model takes ``bool_masked_pos``) and its
``create_and_check_*`` methods, and the tests of upstream's ``Dinov2ModelTest`` (not its backbone ones:
there is no Dinov2Backbone here). Once per type of ``VISION_ATTENTION_TYPES``, in `make test` only (slow);
skips, narrowed tests and their reasons: tests/upstream/expectations.py.
"""

from __future__ import annotations

from hf_efficient import EfficientDinov2Config, EfficientDinov2ForImageClassification, EfficientDinov2Model

from .common import VISION_ATTENTION_TYPES, add_test_classes
from .expectations import class_settings
from .vision_testers import VisionModelTester


class Dinov2ModelTester(VisionModelTester):
    """transformers' Dinov2ModelTester, building our config with ``attention_type``. Upstream's passes
    ``intermediate_size``, which DINOv2 does not read (its feed-forward width is ``mlp_ratio``'s): our
    config keeps it unread, as transformers' Dinov2Config does."""

    # in Dinov2, the seq length equals the number of patches + 1 (we add 1 for the [CLS] token)
    num_prefix_tokens = 1

    def get_config(self) -> EfficientDinov2Config:
        return EfficientDinov2Config(**self.config_fields())

    def create_and_check_model(self, config, pixel_values, labels):
        self.check_last_hidden_state(EfficientDinov2Model, config, pixel_values)

    def create_and_check_for_image_classification(self, config, pixel_values, labels):
        self.check_image_classifier(
            EfficientDinov2ForImageClassification, config, pixel_values, labels, False
        )


class Dinov2ModelTest:
    """The tests upstream's Dinov2ModelTest adds to the mixin."""

    test_resize_embeddings = False

    def test_model(self):
        config_and_inputs = self.model_tester.prepare_config_and_inputs()
        self.model_tester.create_and_check_model(*config_and_inputs)

    def test_for_image_classification(self):
        config_and_inputs = self.model_tester.prepare_config_and_inputs()
        self.model_tester.create_and_check_for_image_classification(*config_and_inputs)


CLASSES = (EfficientDinov2Model, EfficientDinov2ForImageClassification)
add_test_classes(
    globals(), "dinov2", Dinov2ModelTester, CLASSES, modality="vision", tests=(Dinov2ModelTest,),
    body=class_settings("dinov2"), fast=False, types=VISION_ATTENTION_TYPES, config_hidden_size=37,
)  # fmt: skip
