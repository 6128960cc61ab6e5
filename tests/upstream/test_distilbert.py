"""transformers' common model tests (ModelTesterMixin, ConfigTester) on the DistilBERT family, with a tester
written as transformers' ``DistilBertModelTester`` (tests/models/distilbert/test_modeling_distilbert.py, which
its sdist does not ship): its sizes, its config in DistilBERT's field names (``dim``, ``n_layers``,
``n_heads``, ``hidden_dim``, ``dropout``, ``attention_dropout``), no token types, its ``create_and_check_*``
methods and test methods, and its flags (the position table is resized), on every attention type of
tests/upstream/families.py."""

from __future__ import annotations

from hf_efficient import (
    EfficientDistilBertConfig,
    EfficientDistilBertForMaskedLM,
    EfficientDistilBertForMultipleChoice,
    EfficientDistilBertForQuestionAnswering,
    EfficientDistilBertForSequenceClassification,
    EfficientDistilBertForTokenClassification,
    EfficientDistilBertModel,
)

from .families import FamilyTester, family_test_classes
from .test_transformers_common import ids_tensor, random_attention_mask


class DistilBertTester(FamilyTester):
    """transformers' DistilBertModelTester: 13 sequences of 7 tokens, dim 32, 2 layers, 4 heads, no token
    types."""

    batch_size, seq_length, is_training, vocab_size = 13, 7, True, 99
    hidden_size, num_hidden_layers, num_attention_heads, intermediate_size = 32, 2, 4, 37
    hidden_act, hidden_dropout_prob, attention_probs_dropout_prob = "gelu", 0.1, 0.1
    max_position_embeddings, type_sequence_label_size, initializer_range = 512, 2, 0.02
    num_labels, num_choices = 3, 4

    def prepare_config_and_inputs(self):
        shape = [self.batch_size, self.seq_length]
        input_ids = ids_tensor(shape, self.vocab_size)
        input_mask = random_attention_mask(shape)
        sequence_labels = ids_tensor([self.batch_size], self.type_sequence_label_size)
        token_labels = ids_tensor(shape, self.num_labels)
        choice_labels = ids_tensor([self.batch_size], self.num_choices)
        return self.get_config(), input_ids, input_mask, sequence_labels, token_labels, choice_labels

    def get_config(self) -> EfficientDistilBertConfig:
        return EfficientDistilBertConfig(
            vocab_size=self.vocab_size, dim=self.hidden_size, n_layers=self.num_hidden_layers,
            n_heads=self.num_attention_heads, hidden_dim=self.intermediate_size, activation=self.hidden_act,
            dropout=self.hidden_dropout_prob, attention_dropout=self.attention_probs_dropout_prob,
            max_position_embeddings=self.max_position_embeddings, initializer_range=self.initializer_range,
            **self.attention_fields(),
        )  # fmt: skip

    def create_and_check_distilbert_model(self, config, input_ids, input_mask, *_):
        model = EfficientDistilBertModel(config).eval()
        model(input_ids, input_mask)
        result = model(input_ids)
        expected = (self.batch_size, self.seq_length, self.hidden_size)
        self.parent.assertEqual(result.last_hidden_state.shape, expected)

    def create_and_check_distilbert_for_masked_lm(
        self, config, input_ids, input_mask, sequence_labels, token_labels, _
    ):
        model = EfficientDistilBertForMaskedLM(config).eval()
        result = model(input_ids, attention_mask=input_mask, labels=token_labels)
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.seq_length, self.vocab_size))

    def create_and_check_distilbert_for_question_answering(
        self, config, input_ids, input_mask, sequence_labels, *_
    ):
        model = EfficientDistilBertForQuestionAnswering(config).eval()
        positions = {"start_positions": sequence_labels, "end_positions": sequence_labels}
        result = model(input_ids, attention_mask=input_mask, **positions)
        self.parent.assertEqual(result.start_logits.shape, (self.batch_size, self.seq_length))
        self.parent.assertEqual(result.end_logits.shape, (self.batch_size, self.seq_length))

    def create_and_check_distilbert_for_sequence_classification(
        self, config, input_ids, input_mask, sequence_labels, *_
    ):
        config.num_labels = self.num_labels
        model = EfficientDistilBertForSequenceClassification(config).eval()
        result = model(input_ids, attention_mask=input_mask, labels=sequence_labels)
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.num_labels))

    def create_and_check_distilbert_for_token_classification(
        self, config, input_ids, input_mask, sequence_labels, token_labels, _
    ):
        config.num_labels = self.num_labels
        model = EfficientDistilBertForTokenClassification(config).eval()
        result = model(input_ids, attention_mask=input_mask, labels=token_labels)
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.seq_length, self.num_labels))

    def create_and_check_distilbert_for_multiple_choice(
        self, config, input_ids, input_mask, sequence_labels, token_labels, choice_labels
    ):
        config.num_choices = self.num_choices
        model = EfficientDistilBertForMultipleChoice(config).eval()

        def per_choice(tensor):
            return tensor.unsqueeze(1).expand(-1, self.num_choices, -1).contiguous()

        result = model(per_choice(input_ids), attention_mask=per_choice(input_mask), labels=choice_labels)
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.num_choices))

    def prepare_config_and_inputs_for_common(self):
        config, input_ids, input_mask, *_ = self.prepare_config_and_inputs()
        return config, {"input_ids": input_ids, "attention_mask": input_mask}


class DistilBertModelTests:
    """transformers' DistilBertModelTest: the classes, its flags and the family's own tests (less
    test_model_from_pretrained, which downloads distilbert-base-uncased, and the GPU-only TorchScript
    test)."""

    all_model_classes = (
        EfficientDistilBertModel,
        EfficientDistilBertForMaskedLM,
        EfficientDistilBertForMultipleChoice,
        EfficientDistilBertForQuestionAnswering,
        EfficientDistilBertForSequenceClassification,
        EfficientDistilBertForTokenClassification,
    )
    test_resize_embeddings = True
    test_resize_position_embeddings = True

    def test_distilbert_model(self):
        self.model_tester.create_and_check_distilbert_model(*self.model_tester.prepare_config_and_inputs())

    def test_for_masked_lm(self):
        inputs = self.model_tester.prepare_config_and_inputs()
        self.model_tester.create_and_check_distilbert_for_masked_lm(*inputs)

    def test_for_question_answering(self):
        inputs = self.model_tester.prepare_config_and_inputs()
        self.model_tester.create_and_check_distilbert_for_question_answering(*inputs)

    def test_for_sequence_classification(self):
        inputs = self.model_tester.prepare_config_and_inputs()
        self.model_tester.create_and_check_distilbert_for_sequence_classification(*inputs)

    def test_for_token_classification(self):
        inputs = self.model_tester.prepare_config_and_inputs()
        self.model_tester.create_and_check_distilbert_for_token_classification(*inputs)

    def test_for_multiple_choice(self):
        inputs = self.model_tester.prepare_config_and_inputs()
        self.model_tester.create_and_check_distilbert_for_multiple_choice(*inputs)


TEST_CLASSES = family_test_classes(
    "distilbert", DistilBertModelTests, DistilBertTester, EfficientDistilBertConfig, dim=37
)
globals().update(TEST_CLASSES)
