"""Building transformers' model tests for one of our families: a tester written as upstream's tester of that
family, our classes, and the test class body upstream's ``<Family>ModelTest`` adds to the mixin, run once per
attention type, with the expectations of tests/upstream/expectations.py applied.

Used by the family test modules (tests/upstream/test_deit.py, test_dinov2.py); the mixins come from
:mod:`tests.upstream.test_transformers_common` (which skips without the transformers sdist).
"""

from __future__ import annotations

import unittest

import pytest
from torch import nn

from ..attention.helpers import small_config
from .expectations import TESTER_SETTINGS, apply_expectations
from .test_transformers_common import UPSTREAM, floats_tensor, ids_tensor

# `full` and two efficient types: kernelized linear attention (no weights to return) and 2-D windows over
# the patch grid (which must be told the prefix tokens before the patches).
VISION_FAMILY_TYPES = ("full", "linear", "swin_window")


class VisionModelTester:
    """What transformers' DeiT and DINOv2 model testers share, with their defaults: 13 images of 30x30 in 2x2
    patches, hidden 32, 2 layers, 4 heads, dropouts of 0.1, 10 classes, eager attention, and their mask
    details: ``seq_length`` is the prefix tokens and the patches, ``num_masks`` counts ``mask_ratio`` of the
    sequence, ``mask_length`` the patches (the eager-vs-sdpa test masks the first ``num_masks`` patches). A
    family's tester sets ``num_prefix_tokens``, its own fields, ``get_config`` and its
    ``create_and_check_*`` methods; keyword arguments override any field, as upstream's ``__init__``
    arguments do."""

    batch_size, image_size, patch_size, num_channels = 13, 30, 2, 3
    is_training, use_labels = True, True
    hidden_size, num_hidden_layers, num_attention_heads, intermediate_size = 32, 2, 4, 37
    hidden_act, hidden_dropout_prob, attention_probs_dropout_prob = "gelu", 0.1, 0.1
    type_sequence_label_size, initializer_range, scope = 10, 0.02, None
    attn_implementation, mask_ratio = "eager", 0.5
    num_prefix_tokens: int  # [CLS] (and DeiT's distillation token) before the patches

    def __init__(self, parent, attention_type: str, **fields):
        self.parent, self.attention_type = parent, attention_type
        for name, value in fields.items():
            if not hasattr(self, name):
                raise TypeError(f"{type(self).__name__} has no field {name!r}")
            setattr(self, name, value)
        num_patches = (self.image_size // self.patch_size) ** 2
        self.seq_length = num_patches + self.num_prefix_tokens
        self.num_masks = int(self.mask_ratio * self.seq_length)
        self.mask_length = num_patches

    def config_fields(self) -> dict:
        """The config fields both upstream testers pass, plus our attention type and its small config."""
        names = (
            "image_size", "patch_size", "num_channels", "hidden_size", "num_hidden_layers",
            "num_attention_heads", "intermediate_size", "hidden_act", "hidden_dropout_prob",
            "attention_probs_dropout_prob", "initializer_range", "attn_implementation",
        )  # fmt: skip
        fields = {name: getattr(self, name) for name in names}
        attention = {
            "attention_type": self.attention_type,
            "attention_config": small_config(self.attention_type),
        }
        return {**fields, "is_decoder": False, **attention}

    def prepare_config_and_inputs(self):
        pixel_values = floats_tensor([self.batch_size, self.num_channels, self.image_size, self.image_size])
        labels = ids_tensor([self.batch_size], self.type_sequence_label_size) if self.use_labels else None
        return self.get_config(), pixel_values, labels

    def prepare_config_and_inputs_for_common(self):
        config, pixel_values, _ = self.prepare_config_and_inputs()
        return config, {"pixel_values": pixel_values}

    def check_last_hidden_state(self, model_class, config, pixel_values):
        """Upstream's ``create_and_check_model``: (batch, seq_length, hidden_size) hidden states."""
        result = model_class(config).eval()(pixel_values)
        expected = (self.batch_size, self.seq_length, self.hidden_size)
        self.parent.assertEqual(result.last_hidden_state.shape, expected)

    def check_image_classifier(self, model_class, config, pixel_values, labels, grey_labels):
        """Upstream's ``create_and_check_for_image_classification``: logits of ``type_sequence_label_size``
        classes, on RGB images with labels, then on greyscale images (with labels where upstream's does)."""
        config.num_labels = self.type_sequence_label_size
        result = model_class(config).eval()(pixel_values, labels=labels)
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.type_sequence_label_size))
        # test greyscale images
        config.num_channels = 1
        model = model_class(config).eval()
        pixel_values = floats_tensor([self.batch_size, 1, self.image_size, self.image_size])
        result = model(pixel_values, labels=labels if grey_labels else None)
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.type_sequence_label_size))


def family_test_classes(
    group: str,
    tester: type,
    classes: tuple[type, ...],
    body: dict,
    config_hidden_size: int,
    types=VISION_FAMILY_TYPES,
) -> dict[str, type]:
    """``Test<Group>_<type>`` for each attention type: ModelTesterMixin on ``classes`` with
    ``tester(self, attention_type)``, transformers' ConfigTester on the tester's config (a vision config:
    ``has_text_modality=False``, and the ``hidden_size`` upstream's test of the family gives it), ``body``
    (upstream's overrides) and the group's settings in expectations.py (``TESTER_SETTINGS``). Every class is
    ``slow`` (`make test` runs them, `make test-fast` does not)."""
    made = {}
    settings = {name: value for name, (value, _reason) in TESTER_SETTINGS.get(group, {}).items()}
    for attention_type in types:

        def setUp(self, attention_type=attention_type):
            self.model_tester = tester(self, attention_type)
            self.config_tester = UPSTREAM.configuration.ConfigTester(
                self,
                config_class=type(self.model_tester.get_config()),
                has_text_modality=False,
                hidden_size=config_hidden_size,
            )

        def test_config(self):
            self.config_tester.run_common_tests()

        members = {
            "all_model_classes": classes,
            "setUp": setUp,
            "test_config": test_config,
            "pytestmark": [pytest.mark.slow],
            **body,
            **settings,
        }
        name = f"Test{group.capitalize()}_{attention_type}"
        cls = type(name, (UPSTREAM.modeling.ModelTesterMixin, unittest.TestCase), members)
        made[name] = apply_expectations(cls, group, attention_type)
    return made


def without_classes(test, names: tuple[str, ...]):
    """The mixin's ``test`` run on ``all_model_classes`` less the classes named (upstream's tests skip
    DeiT's inference-only classifier with a teacher in its training tests)."""

    def run(self, *args, **kwargs):
        kept = tuple(c for c in self.all_model_classes if c.__name__ not in names)
        self.all_model_classes, saved = kept, self.all_model_classes
        try:
            return test(self, *args, **kwargs)
        finally:
            self.all_model_classes = saved

    run.__name__ = run.__qualname__ = test.__name__
    run.__doc__ = f"{test.__name__} without {', '.join(names)}."
    return run


def checks(name: str):
    """``test_<name>``: the tester's ``create_and_check_<name>`` on fresh inputs, as upstream's tests call
    them."""

    def run(self):
        config_and_inputs = self.model_tester.prepare_config_and_inputs()
        getattr(self.model_tester, f"create_and_check_{name}")(*config_and_inputs)

    run.__name__ = f"test_{name}"
    return run


def model_get_set_embeddings(self):
    """Upstream's vision version (DeiT's, DINOv2's tests): the input embeddings are a module (the patch
    projection, not a token table to replace), and the output embeddings none or a linear map."""
    config, _ = self.model_tester.prepare_config_and_inputs_for_common()
    for model_class in self.all_model_classes:
        model = model_class(config)
        self.assertIsInstance(model.get_input_embeddings(), nn.Module)
        x = model.get_output_embeddings()
        self.assertTrue(x is None or isinstance(x, nn.Linear))
