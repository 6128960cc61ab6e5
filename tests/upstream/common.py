"""What every family's run of transformers' own model tests shares: the mixins, the input helpers, the
attention types, and the factory of one test class per attention type.

transformers' mixins come from the installed version's source distribution (``make upstream-tests`` fetches it
into build/; :mod:`tests.upstream.sdist`); without it every module importing this one skips, naming the make
target. A family's module (tests/upstream/test_<family>.py) holds its tester, written as transformers writes
that family's tester (its sizes, its ``create_and_check_*`` methods and the tests calling them), and one line
calling :func:`add_test_classes`. `make test` runs every class; `make test-fast` runs the text families'
classes on exact attention (``full``) only: the other types and the vision families are marked ``slow``. Every
test skipped, expected to fail or left to `make test`, and why, is in :mod:`tests.upstream.expectations`.
"""

from __future__ import annotations

import unittest

import pytest

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

# BERT's and ViT's testers: full, and efficient types of three kinds: kernelized (linear), windowed
# (longformer), blocks (bigbird)
ATTENTION_TYPES = ("full", "linear", "longformer", "bigbird")
# the other text families' testers (the same shared blocks and cores as BERT's): full, a kernelized and a
# windowed type; bigbird's run through the mixins is BERT's and ViT's (and each family's parity and
# padding tests run every type)
FAMILY_ATTENTION_TYPES = ("full", "linear", "longformer")
# DeiT's and DINOv2's testers: full, kernelized linear attention (no weights to return) and 2-D windows over
# the patch grid (which must be told the prefix tokens before the patches)
VISION_ATTENTION_TYPES = ("full", "linear", "swin_window")


def attention_fields(attention_type: str, causal: bool = False) -> dict:
    """The config fields of ``attention_type`` at its tiny-model settings (``causal``: a decoder's)."""
    return {"attention_type": attention_type, "attention_config": small_config(attention_type, causal)}


def add_test_classes(
    namespace: dict,
    group: str,
    tester: type,
    classes: tuple[type, ...],
    modality: str = "text",
    tests: tuple[type, ...] = (),
    body: dict | None = None,
    fast: bool = True,
    types: tuple[str, ...] = ATTENTION_TYPES,
    config_hidden_size: int = 37,
) -> None:
    """One ``unittest.TestCase`` per attention type in ``types`` (:data:`ATTENTION_TYPES`), named
    ``Test<Group>_<type>``, put into ``namespace`` (the family module's ``globals()``, where pytest collects
    them).

    Args:
        group: the family's name in expectations.py (``"bert"``, ``"roberta"``, ...).
        tester: the family's tester class, ``tester(test_case, attention_type)``, with ``get_config()`` and
            ``prepare_config_and_inputs_for_common()`` (what ModelTesterMixin reads) at least.
        classes: the model classes the mixin runs (``all_model_classes``).
        modality: ``"text"`` or ``"vision"``; entries of expectations.py may name it instead of a group.
        tests: classes holding the family's own test methods (``test_model``, ``test_for_masked_lm``...),
            placed before the mixins.
        body: more class attributes (``_prepare_for_class``...).
        fast: whether `make test-fast` runs the ``full`` class (text families only; False: all slow).
        types: the attention types (a vision family's: :data:`VISION_ATTENTION_TYPES`).
        config_hidden_size: the ``hidden_size`` upstream's test of the family gives its ConfigTester.
    """
    mixins = (UPSTREAM.modeling.ModelTesterMixin,)
    if any(model_class.can_generate() for model_class in classes):  # as upstream's testers of generators
        mixins += (UPSTREAM.modeling.GenerationTesterMixin,)
    for attention_type in types:

        def setUp(self, attention_type=attention_type):
            self.model_tester = tester(self, attention_type)
            self.config_tester = UPSTREAM.configuration.ConfigTester(
                self, config_class=type(self.model_tester.get_config()), has_text_modality=modality == "text",
                hidden_size=config_hidden_size,
                common_properties=["hidden_size", "num_attention_heads", "num_hidden_layers"],
            )  # fmt: skip

        def test_config(self):
            self.config_tester.run_common_tests()

        attributes = {
            "all_model_classes": classes,
            "setUp": setUp,
            "test_config": test_config,
            **(body or {}),
        }
        if attention_type != "full" or modality != "text" or not fast:
            attributes["pytestmark"] = [pytest.mark.slow]  # `make test-fast` keeps text on the exact type
        name = f"Test{group.title().replace('-', '')}_{attention_type}"
        cls = type(name, (*tests, *mixins, unittest.TestCase), attributes)
        namespace[name] = apply_expectations(cls, group, attention_type, modality)
