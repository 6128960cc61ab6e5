"""transformers' common model tests (ModelTesterMixin, ConfigTester) on the ModernBERT family, with a tester
written as transformers' ``ModernBertModelTester`` (tests/models/modernbert/test_modeling_modernbert.py, which
its sdist does not ship): its sizes (13 sequences of 7 tokens, hidden 32, 2 layers of 4 heads, vocabulary 99,
padding id 0, no dropout), no token types, its ``create_and_check_*`` methods and test methods, on every
attention type of tests/upstream/families.py on the global layers; the window layers run the Longformer
window in every class (the checkpoint's pattern). Skips and their reasons: tests/upstream/expectations.py,
group ``modernbert``."""

from __future__ import annotations

from hf_efficient import (
    EfficientModernBertConfig,
    EfficientModernBertForMaskedLM,
    EfficientModernBertForMultipleChoice,
    EfficientModernBertForQuestionAnswering,
    EfficientModernBertForSequenceClassification,
    EfficientModernBertForTokenClassification,
    EfficientModernBertModel,
)

from .common import ids_tensor, random_attention_mask
from .families import FamilyTester, family_test_classes


class ModernBertTester(FamilyTester):
    """transformers' ModernBertModelTester: its sizes, inputs and checks, on our classes (the attention type
    under test on the global layers)."""

    batch_size, seq_length, is_training, vocab_size, pad_token_id = 13, 7, True, 99, 0
    hidden_size, num_hidden_layers, num_attention_heads, intermediate_size = 32, 2, 4, 37
    max_position_embeddings, type_sequence_label_size, initializer_range = 512, 2, 0.02
    num_labels, num_choices = 3, 4

    def get_config(self) -> EfficientModernBertConfig:
        return EfficientModernBertConfig(
            vocab_size=self.vocab_size, pad_token_id=self.pad_token_id, hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size, hidden_activation="gelu", mlp_dropout=0.0,
            attention_dropout=0.0, embedding_dropout=0.0, classifier_dropout=0.0,
            max_position_embeddings=self.max_position_embeddings, initializer_range=self.initializer_range,
            **self.attention_fields(),
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

    def create_and_check_model(self, config, input_ids, input_mask, *_):
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

    def create_and_check_for_token_classification(
        self, config, input_ids, input_mask, sequence_labels, token_labels, _
    ):
        config.num_labels = self.num_labels
        model = EfficientModernBertForTokenClassification(config).eval()
        result = model(input_ids, attention_mask=input_mask, labels=token_labels)
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.seq_length, self.num_labels))

    def create_and_check_for_question_answering(self, config, input_ids, input_mask, sequence_labels, *_):
        model = EfficientModernBertForQuestionAnswering(config).eval()
        positions = {"start_positions": sequence_labels, "end_positions": sequence_labels}
        result = model(input_ids, attention_mask=input_mask, **positions)
        self.parent.assertEqual(result.start_logits.shape, (self.batch_size, self.seq_length))
        self.parent.assertEqual(result.end_logits.shape, (self.batch_size, self.seq_length))

    def create_and_check_for_multiple_choice(
        self, config, input_ids, input_mask, sequence_labels, token_labels, choice_labels
    ):
        model = EfficientModernBertForMultipleChoice(config).eval()

        def per_choice(tensor):
            return tensor.unsqueeze(1).expand(-1, self.num_choices, -1).contiguous()

        result = model(per_choice(input_ids), attention_mask=per_choice(input_mask), labels=choice_labels)
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.num_choices))


class ModernBertModelTests:
    """transformers' ModernBertModelTest: its classes and the family's own tests (less
    test_model_from_pretrained, which downloads ModernBERT-base, and the FlashAttention tests)."""

    all_model_classes = (
        EfficientModernBertModel,
        EfficientModernBertForMaskedLM,
        EfficientModernBertForSequenceClassification,
        EfficientModernBertForTokenClassification,
        EfficientModernBertForQuestionAnswering,
        EfficientModernBertForMultipleChoice,
    )

    def test_model(self):
        self.model_tester.create_and_check_model(*self.model_tester.prepare_config_and_inputs())

    def test_for_masked_lm(self):
        self.model_tester.create_and_check_for_masked_lm(*self.model_tester.prepare_config_and_inputs())

    def test_for_sequence_classification(self):
        inputs = self.model_tester.prepare_config_and_inputs()
        self.model_tester.create_and_check_for_sequence_classification(*inputs)

    def test_for_token_classification(self):
        inputs = self.model_tester.prepare_config_and_inputs()
        self.model_tester.create_and_check_for_token_classification(*inputs)

    def test_for_question_answering(self):
        inputs = self.model_tester.prepare_config_and_inputs()
        self.model_tester.create_and_check_for_question_answering(*inputs)

    def test_for_multiple_choice(self):
        inputs = self.model_tester.prepare_config_and_inputs()
        self.model_tester.create_and_check_for_multiple_choice(*inputs)


TEST_CLASSES = family_test_classes(
    "modernbert", ModernBertModelTests, ModernBertTester, EfficientModernBertConfig, hidden_size=37
)
globals().update(TEST_CLASSES)
