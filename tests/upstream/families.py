"""What the family testers of tests/upstream/test_<family>.py share: one ``unittest`` class per attention type
that runs transformers' own ``ModelTesterMixin`` (and ConfigTester) with the family's tester, written as
transformers writes that family's tester (its sizes, its ``create_and_check_*`` methods, its test methods).

As for BERT and ViT (tests/upstream/test_transformers_common.py): `make test-fast` runs the ``full`` class,
`make test` every type; each skip, expected failure and slow test, with its reason, is in
tests/upstream/expectations.py under the family's group name.
"""

from __future__ import annotations

import unittest

import pytest

from hf_efficient import causal_attention_types

from ..attention.helpers import small_config
from ..models.helpers import CONFIG_ERRORS
from .common import FAMILY_ATTENTION_TYPES
from .expectations import apply_expectations
from .test_transformers_common import UPSTREAM


class FamilyTester:
    """Base of a family's tester: the attention type under test and its ``attention_config`` in every
    config the tester builds (a decoder's: the type's causal one)."""

    def __init__(self, parent, attention_type: str):
        self.parent, self.attention_type = parent, attention_type

    def attention_fields(self, causal: bool = False) -> dict:
        config = small_config(self.attention_type, causal)
        return {"attention_type": self.attention_type, "attention_config": config}

    @property
    def has_causal_form(self) -> bool:
        return self.attention_type in causal_attention_types("text")

    def build_decoder(self, model_class, config):
        """``model_class(config)`` for a decoder config (``is_decoder=True``) in eval mode; for a type
        without a causal form, checks that building it is refused naming why, and returns None (the test stops
        there)."""
        if not self.has_causal_form:
            refusal = "is_decoder=True needs attention types with a causal form"
            with self.parent.assertRaisesRegex(CONFIG_ERRORS, refusal):
                model_class(config)
            return None
        return model_class(config).eval()


def family_test_classes(group: str, tests: type, tester: type, config_class: type, **config_tester) -> dict:
    """{class name: TestCase} of ``group``: for each attention type, ``tests`` (the family's test methods
    and ``all_model_classes``) over ModelTesterMixin, with ``tester(self, attention_type)`` as its model
    tester and ``ConfigTester(self, config_class=config_class, **config_tester)`` as its config tester."""
    classes = {}
    for attention_type in FAMILY_ATTENTION_TYPES:

        def setUp(self, attention_type=attention_type):
            self.model_tester = tester(self, attention_type)
            self.config_tester = UPSTREAM.configuration.ConfigTester(
                self, config_class=config_class, **config_tester
            )

        body = {"setUp": setUp, "test_config": lambda self: self.config_tester.run_common_tests()}
        if attention_type != "full":  # `make test-fast` keeps the exact type; `make test` runs them all
            body["pytestmark"] = [pytest.mark.slow]
        mixins = (tests, UPSTREAM.modeling.ModelTesterMixin)
        if any(model_class.can_generate() for model_class in tests.all_model_classes):
            mixins += (UPSTREAM.modeling.GenerationTesterMixin,)
        name = f"Test{group.capitalize()}_{attention_type}"
        test_class = type(name, (*mixins, unittest.TestCase), body)
        classes[name] = apply_expectations(test_class, group, attention_type)
    return classes
