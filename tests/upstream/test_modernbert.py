"""transformers' own model and config tests (ModelTesterMixin, ConfigTester) on the ModernBERT family.

The tester is written as transformers' ``ModernBertModelTester`` is (its sizes: batch 13, 7 tokens, hidden 32,
2 layers of 4 heads, vocabulary 99, padding id 0; its ``create_and_check_*`` checks of every head), the sdist
shipping the mixins but not tests/models/**. Each test class runs one attention type on the global layers
(:data:`GLOBAL_TYPES`); the window layers run the Longformer window in all of them (the checkpoint's
pattern). Skips and their reasons: tests/upstream/expectations.py (group ``modernbert``).
"""

from __future__ import annotations

import unittest

import pytest

from hf_efficient import (
    EfficientModernBertConfig,
    EfficientModernBertForMaskedLM,
    EfficientModernBertForMultipleChoice,
    EfficientModernBertForQuestionAnswering,
    EfficientModernBertForSequenceClassification,
    EfficientModernBertForTokenClassification,
    EfficientModernBertModel,
)

from ..attention.helpers import small_config
from . import sdist
from .expectations import apply_expectations

UPSTREAM = sdist.load()
if UPSTREAM is None:
    pytest.skip(
        f"transformers' test mixins are not fetched: run `{sdist.MAKE_TARGET}`", allow_module_level=True
    )
ids_tensor = UPSTREAM.modeling.ids_tensor
random_attention_mask = UPSTREAM.modeling.random_attention_mask

GLOBAL_TYPES = ("full", "linear", "bigbird")  # the global layers' type; "full" is the checkpoint's
CLASSES = (
    EfficientModernBertModel,
    EfficientModernBertForMaskedLM,
    EfficientModernBertForSequenceClassification,
    EfficientModernBertForTokenClassification,
    EfficientModernBertForQuestionAnswering,
    EfficientModernBertForMultipleChoice,
)


class ModernBertTester:
    """transformers' ModernBertModelTester: its sizes, inputs and checks, on our classes."""

    batch_size, seq_length, vocab_size, pad_token_id = 13, 7, 99, 0
    hidden_size, num_hidden_layers, num_attention_heads, intermediate_size = 32, 2, 4, 37
    type_sequence_label_size, num_labels, num_choices = 2, 3, 4
    is_training = True

    def __init__(self, parent, attention_type: str):
        self.parent, self.attention_type = parent, attention_type

    def get_config(self) -> EfficientModernBertConfig:
        return EfficientModernBertConfig(
            vocab_size=self.vocab_size, pad_token_id=self.pad_token_id, hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size, hidden_activation="gelu", mlp_dropout=0.0,
            attention_dropout=0.0, embedding_dropout=0.0, classifier_dropout=0.0, max_position_embeddings=512,
            initializer_range=0.02,
            attention_type=self.attention_type, attention_config=small_config(self.attention_type),
        )  # fmt: skip

    def prepare_config_and_inputs(self):
        shape = [self.batch_size, self.seq_length]
        input_ids = ids_tensor(shape, self.vocab_size)
        input_mask = random_attention_mask(shape)
        sequence_labels = ids_tensor([self.batch_size], self.type_sequence_label_size)
        token_labels = ids_tensor(shape, self.num_labels)
        choice_labels = ids_tensor([self.batch_size], self.num_choices)
        return self.get_config(), input_ids, input_mask, sequence_labels, token_labels, choice_labels

    def prepare_config_and_inputs_for_common(self):
        config, input_ids, input_mask, *_ = self.prepare_config_and_inputs()
        return config, {"input_ids": input_ids, "attention_mask": input_mask}

    def create_and_check_model(self, config, input_ids, input_mask, *labels):
        model = EfficientModernBertModel(config).eval()
        model(input_ids, attention_mask=input_mask)
        result = model(input_ids)
        expected = (self.batch_size, self.seq_length, self.hidden_size)
        self.parent.assertEqual(result.last_hidden_state.shape, expected)

    def create_and_check_for_masked_lm(self, config, input_ids, input_mask, sequence_labels, token_labels, _):
        model = EfficientModernBertForMaskedLM(config).eval()
        result = model(input_ids, attention_mask=input_mask, labels=token_labels)
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.seq_length, self.vocab_size))

    def create_and_check_for_sequence_classification(
        self, config, input_ids, input_mask, sequence_labels, *_
    ):
        config.num_labels = self.num_labels
        model = EfficientModernBertForSequenceClassification(config).eval()
        result = model(input_ids, attention_mask=input_mask, labels=sequence_labels)
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.num_labels))

    def create_and_check_for_token_classification(self, config, input_ids, input_mask, _, token_labels, __):
        config.num_labels = self.num_labels
        model = EfficientModernBertForTokenClassification(config).eval()
        result = model(input_ids, attention_mask=input_mask, labels=token_labels)
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.seq_length, self.num_labels))

    def create_and_check_for_question_answering(self, config, input_ids, input_mask, sequence_labels, *_):
        model = EfficientModernBertForQuestionAnswering(config).eval()
        result = model(
            input_ids,
            attention_mask=input_mask,
            start_positions=sequence_labels,
            end_positions=sequence_labels,
        )
        self.parent.assertEqual(result.start_logits.shape, (self.batch_size, self.seq_length))
        self.parent.assertEqual(result.end_logits.shape, (self.batch_size, self.seq_length))

    def create_and_check_for_multiple_choice(self, config, input_ids, input_mask, *labels):
        model = EfficientModernBertForMultipleChoice(config).eval()
        per_choice = [
            t.unsqueeze(1).expand(-1, self.num_choices, -1).contiguous() for t in (input_ids, input_mask)
        ]
        result = model(per_choice[0], attention_mask=per_choice[1], labels=labels[-1])
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.num_choices))


def _model_test_class(attention_type: str) -> type:
    def setUp(self):
        self.model_tester = ModernBertTester(self, attention_type)
        self.config_tester = UPSTREAM.configuration.ConfigTester(
            self, config_class=EfficientModernBertConfig, hidden_size=37
        )

    def check(name: str):
        def test(self):
            getattr(self.model_tester, f"create_and_check_{name}")(
                *self.model_tester.prepare_config_and_inputs()
            )

        test.__name__ = f"test_{name}"
        return test

    checks = ("model", "for_masked_lm", "for_sequence_classification", "for_token_classification")
    checks += ("for_question_answering", "for_multiple_choice")
    body = {
        "all_model_classes": CLASSES,
        "setUp": setUp,
        "test_config": lambda self: self.config_tester.run_common_tests(),
        **{f"test_{name}": check(name) for name in checks},
    }
    if attention_type != "full":  # `make test-fast` keeps the checkpoint's own pattern; `make test` all
        body["pytestmark"] = [pytest.mark.slow]
    cls = type(
        f"TestModernBert_{attention_type}", (UPSTREAM.modeling.ModelTesterMixin, unittest.TestCase), body
    )
    return apply_expectations(cls, "modernbert", attention_type)


for _type in GLOBAL_TYPES:
    _test_class = _model_test_class(_type)
    globals()[_test_class.__name__] = _test_class
del _test_class  # pytest collects every TestCase in the module's namespace, whatever its name
