"""The loader of transformers' test mixins (tests/upstream/sdist.py): absent sdist, Auto name tables."""

from __future__ import annotations

import pytest
from transformers.models.auto import modeling_auto

from . import sdist


def test_load_without_the_sdist_is_none(monkeypatch, tmp_path):
    """No sdist: load() returns None (tests/upstream/common.py then skips naming the make target), and
    nothing is downloaded."""
    monkeypatch.setattr(sdist, "TESTS_DIR", tmp_path / "transformers-0.0.0" / "tests")
    assert sdist.load() is None
    assert not any(tmp_path.iterdir())


def test_our_auto_registrations_reach_the_common_tests_name_tables():
    """The common tests decide labels and base-model status from the Auto name tables: the loaded copies
    hold our registered classes, transformers' own tables stay as they are."""
    upstream = sdist.load()
    if upstream is None:
        pytest.skip(f"transformers' test mixins are not fetched: run `{sdist.MAKE_TARGET}`")
    tables = upstream.modeling
    assert tables.MODEL_FOR_MASKED_LM_MAPPING_NAMES["efficient_bert"] == "EfficientBertForMaskedLM"
    assert tables.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES["efficient_vit"] == (
        "EfficientViTForImageClassification"
    )
    assert tables.MODEL_MAPPING_NAMES["efficient_bert"] == "EfficientBertModel"
    assert "efficient_bert" not in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
