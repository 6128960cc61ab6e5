"""transformers' model tests on our DeiT classes, with a tester written as transformers' ``DeiTModelTester``
(tests/models/deit/test_modeling_deit.py, not shipped in the sdist): its sizes (13 images of 30x30 in 2x2
patches: [CLS], the distillation token and 225 patches), its mask details (``num_masks`` counted over the
sequence, ``mask_length`` over the patches) and its ``create_and_check_*`` methods, and the tests of
upstream's ``DeiTModelTest``: the classifier with a teacher is inference only (no labels, no training tests).
Once per type of ``VISION_ATTENTION_TYPES``, in `make test` only (slow); skips and their reasons:
tests/upstream/expectations.py.
"""

from __future__ import annotations

from hf_efficient import (
    EfficientDeiTConfig,
    EfficientDeiTForImageClassification,
    EfficientDeiTForImageClassificationWithTeacher,
    EfficientDeiTForMaskedImageModeling,
    EfficientDeiTModel,
)

from .common import UPSTREAM, VISION_ATTENTION_TYPES, add_test_classes, floats_tensor
from .vision_testers import VisionModelTester, without_classes

TEACHER = ("EfficientDeiTForImageClassificationWithTeacher",)  # inference only, as upstream's
MIXIN = UPSTREAM.modeling.ModelTesterMixin


class DeiTModelTester(VisionModelTester):
    """transformers' DeiTModelTester, building our config with ``attention_type``."""

    num_labels, encoder_stride = 3, 2
    # in DeiT, the seq length equals the number of patches + 2 (the [CLS] and distillation tokens)
    num_prefix_tokens = 2

    def get_config(self) -> EfficientDeiTConfig:
        return EfficientDeiTConfig(**self.config_fields(), encoder_stride=self.encoder_stride)

    def create_and_check_model(self, config, pixel_values, labels):
        self.check_last_hidden_state(EfficientDeiTModel, config, pixel_values)

    def create_and_check_for_masked_image_modeling(self, config, pixel_values, labels):
        model = EfficientDeiTForMaskedImageModeling(config).eval()
        result = model(pixel_values)
        shape = (self.batch_size, self.num_channels, self.image_size, self.image_size)
        self.parent.assertEqual(result.reconstruction.shape, shape)
        # test greyscale images
        config.num_channels = 1
        model = EfficientDeiTForMaskedImageModeling(config).eval()
        pixel_values = floats_tensor([self.batch_size, 1, self.image_size, self.image_size])
        result = model(pixel_values)
        self.parent.assertEqual(
            result.reconstruction.shape, (self.batch_size, 1, self.image_size, self.image_size)
        )

    def create_and_check_for_image_classification(self, config, pixel_values, labels):
        self.check_image_classifier(EfficientDeiTForImageClassification, config, pixel_values, labels, True)


class DeiTModelTest:
    """The tests upstream's DeiTModelTest adds to the mixin, or changes in it."""

    test_resize_embeddings = False

    def test_model(self):
        config_and_inputs = self.model_tester.prepare_config_and_inputs()
        self.model_tester.create_and_check_model(*config_and_inputs)

    def test_for_masked_image_modeling(self):
        config_and_inputs = self.model_tester.prepare_config_and_inputs()
        self.model_tester.create_and_check_for_masked_image_modeling(*config_and_inputs)

    def test_for_image_classification(self):
        config_and_inputs = self.model_tester.prepare_config_and_inputs()
        self.model_tester.create_and_check_for_image_classification(*config_and_inputs)

    # special case for the classifier with a teacher
    def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
        inputs_dict = super()._prepare_for_class(inputs_dict, model_class, return_labels=return_labels)
        if return_labels and model_class.__name__ in TEACHER:
            del inputs_dict["labels"]
        return inputs_dict

    # the classifier with a teacher supports inference only
    test_training = without_classes(MIXIN.test_training, TEACHER)
    check_training_gradient_checkpointing = without_classes(
        MIXIN.check_training_gradient_checkpointing, TEACHER
    )
    test_problem_types = without_classes(MIXIN.test_problem_types, TEACHER)


CLASSES = (
    EfficientDeiTModel,
    EfficientDeiTForImageClassification,
    EfficientDeiTForImageClassificationWithTeacher,
    EfficientDeiTForMaskedImageModeling,
)
add_test_classes(
    globals(), "deit", DeiTModelTester, CLASSES, modality="vision", tests=(DeiTModelTest,), fast=False,
    types=VISION_ATTENTION_TYPES, config_hidden_size=32,
)  # fmt: skip
