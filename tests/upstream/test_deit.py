"""transformers' model tests on our DeiT classes, with a tester written as transformers' ``DeiTModelTester``
(tests/models/deit/test_modeling_deit.py, not shipped in the sdist): its sizes (13 images of 30x30 in 2x2
patches: [CLS], the distillation token and 225 patches), its mask details (``num_masks`` counted over the
sequence, ``mask_length`` over the patches) and its ``create_and_check_*`` methods, and the overrides of
upstream's ``DeiTModelTest``: the classifier with a teacher is inference only (no labels, no training tests),
and the input embeddings are the patch projection. Skips and their reasons: tests/upstream/expectations.py.
"""

from __future__ import annotations

from hf_efficient import (
    EfficientDeiTConfig,
    EfficientDeiTForImageClassification,
    EfficientDeiTForImageClassificationWithTeacher,
    EfficientDeiTForMaskedImageModeling,
    EfficientDeiTModel,
)

from .family_testers import (
    VisionModelTester,
    checks,
    family_test_classes,
    model_get_set_embeddings,
    without_classes,
)
from .test_transformers_common import UPSTREAM, floats_tensor

TEACHER = ("EfficientDeiTForImageClassificationWithTeacher",)  # inference only, as upstream's


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


def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
    """The mixin's inputs; the classifier with a teacher takes no labels (upstream's special case)."""
    mixin = UPSTREAM.modeling.ModelTesterMixin
    inputs_dict = mixin._prepare_for_class(self, inputs_dict, model_class, return_labels=return_labels)
    if return_labels and model_class.__name__ in TEACHER:
        del inputs_dict["labels"]
    return inputs_dict


_mixin = UPSTREAM.modeling.ModelTesterMixin
BODY = {
    "test_resize_embeddings": False,
    "_prepare_for_class": _prepare_for_class,
    "test_model_get_set_embeddings": model_get_set_embeddings,
    "test_model": checks("model"),
    "test_for_masked_image_modeling": checks("for_masked_image_modeling"),
    "test_for_image_classification": checks("for_image_classification"),
    # DeiTForImageClassificationWithTeacher supports inference only
    "test_training": without_classes(_mixin.test_training, TEACHER),
    "check_training_gradient_checkpointing": without_classes(
        _mixin.check_training_gradient_checkpointing, TEACHER
    ),
    "test_problem_types": without_classes(_mixin.test_problem_types, TEACHER),
}
CLASSES = (
    EfficientDeiTModel,
    EfficientDeiTForImageClassification,
    EfficientDeiTForImageClassificationWithTeacher,
    EfficientDeiTForMaskedImageModeling,
)

globals().update(family_test_classes("deit", DeiTModelTester, CLASSES, BODY, config_hidden_size=32))
