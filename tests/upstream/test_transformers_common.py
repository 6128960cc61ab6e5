"""Where tests/upstream's shared names used to live, kept for the testers written against them: the machinery
is tests/upstream/common.py, each family's tester its own module (test_bert.py, test_roberta.py,
test_vit.py). New code imports from those; this module defines no test."""

from __future__ import annotations

from .common import (
    ATTENTION_TYPES,
    UPSTREAM,
    add_test_classes,
    floats_tensor,
    ids_tensor,
    random_attention_mask,
)
from .test_bert import BERT_CLASSES as TEXT_CLASSES
from .test_bert import BertModelTester as TextTester
from .test_vit import MAETester, VisionTester

__all__ = [
    "ATTENTION_TYPES",
    "MAETester",
    "TEXT_CLASSES",
    "TextTester",
    "UPSTREAM",
    "VisionTester",
    "add_test_classes",
    "floats_tensor",
    "ids_tensor",
    "random_attention_mask",
]
