"""transformers' common model tests (ModelTesterMixin, ConfigTester) on the ELECTRA family, with a tester
written as transformers' ``ElectraModelTester`` (tests/models/electra/test_modeling_electra.py, which its
sdist does not ship): its sizes (embedding_size at ELECTRA's default 128 beside hidden_size 32, so the
embeddings are projected), its ``create_and_check_*`` methods and test methods, on every attention type of
tests/upstream/families.py. A decoder on a type without a causal form is refused, and that is checked."""

from __future__ import annotations

import torch

from hf_efficient import (
    EfficientElectraConfig,
    EfficientElectraForCausalLM,
    EfficientElectraForMaskedLM,
    EfficientElectraForMultipleChoice,
    EfficientElectraForPreTraining,
    EfficientElectraForQuestionAnswering,
    EfficientElectraForSequenceClassification,
    EfficientElectraForTokenClassification,
    EfficientElectraModel,
)

from .families import FamilyTester, family_test_classes
from .test_transformers_common import UPSTREAM, floats_tensor, ids_tensor, random_attention_mask


class ElectraTester(FamilyTester):
    """transformers' ElectraModelTester: 13 sequences of 7 tokens, hidden 32, 2 layers, 4 heads."""

    batch_size, seq_length, is_training, vocab_size = 13, 7, True, 99
    hidden_size, num_hidden_layers, num_attention_heads, intermediate_size = 32, 2, 4, 37
    hidden_act, hidden_dropout_prob, attention_probs_dropout_prob = "gelu", 0.1, 0.1
    max_position_embeddings, type_vocab_size, type_sequence_label_size = 512, 16, 2
    initializer_range, num_labels, num_choices = 0.02, 3, 4

    def prepare_config_and_inputs(self):
        shape = [self.batch_size, self.seq_length]
        input_ids = ids_tensor(shape, self.vocab_size)
        input_mask = random_attention_mask(shape)
        token_type_ids = ids_tensor(shape, self.type_vocab_size)
        sequence_labels = ids_tensor([self.batch_size], self.type_sequence_label_size)
        token_labels = ids_tensor(shape, self.num_labels)
        choice_labels = ids_tensor([self.batch_size], self.num_choices)
        fake_token_labels = ids_tensor(shape, 1)
        config = self.get_config()
        return (
            config, input_ids, token_type_ids, input_mask, sequence_labels, token_labels, choice_labels,
            fake_token_labels,
        )  # fmt: skip

    def get_config(self) -> EfficientElectraConfig:
        return EfficientElectraConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            hidden_act=self.hidden_act, hidden_dropout_prob=self.hidden_dropout_prob,
            attention_probs_dropout_prob=self.attention_probs_dropout_prob,
            max_position_embeddings=self.max_position_embeddings, type_vocab_size=self.type_vocab_size,
            is_decoder=False, initializer_range=self.initializer_range, **self.attention_fields(),
        )  # fmt: skip

    def prepare_config_and_inputs_for_decoder(self):
        config, input_ids, token_type_ids, input_mask, *labels, _ = self.prepare_config_and_inputs()
        config.attention_config = self.attention_fields(causal=True)["attention_config"]
        config.is_decoder = True
        encoder_hidden_states = floats_tensor([self.batch_size, self.seq_length, self.hidden_size])
        encoder_attention_mask = ids_tensor([self.batch_size, self.seq_length], vocab_size=2)
        return (
            config, input_ids, token_type_ids, input_mask, *labels, encoder_hidden_states,
            encoder_attention_mask,
        )  # fmt: skip

    def create_and_check_electra_model(self, config, input_ids, token_type_ids, input_mask, *_):
        model = EfficientElectraModel(config).eval()
        model(input_ids, attention_mask=input_mask, token_type_ids=token_type_ids)
        model(input_ids, token_type_ids=token_type_ids)
        result = model(input_ids)
        expected = (self.batch_size, self.seq_length, self.hidden_size)
        self.parent.assertEqual(result.last_hidden_state.shape, expected)

    def create_and_check_electra_model_as_decoder(self, config, input_ids, token_type_ids, input_mask, *rest):
        encoder_hidden_states, encoder_mask = rest[-2:]
        config.add_cross_attention = True
        model = self.build_decoder(EfficientElectraModel, config)
        if model is None:
            return
        inputs = {"attention_mask": input_mask, "token_type_ids": token_type_ids}
        states = {"encoder_hidden_states": encoder_hidden_states}
        model(input_ids, **inputs, **states, encoder_attention_mask=encoder_mask)
        model(input_ids, **inputs, **states)
        result = model(input_ids, **inputs)
        expected = (self.batch_size, self.seq_length, self.hidden_size)
        self.parent.assertEqual(result.last_hidden_state.shape, expected)

    def create_and_check_electra_for_masked_lm(
        self, config, input_ids, token_type_ids, input_mask, sequence_labels, token_labels, *_
    ):
        model = EfficientElectraForMaskedLM(config).eval()
        inputs = {"attention_mask": input_mask, "token_type_ids": token_type_ids, "labels": token_labels}
        result = model(input_ids, **inputs)
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.seq_length, self.vocab_size))

    def create_and_check_electra_for_causal_lm(
        self, config, input_ids, token_type_ids, input_mask, sequence_labels, token_labels, *_
    ):
        model = self.build_decoder(EfficientElectraForCausalLM, config)
        if model is None:
            return
        inputs = {"attention_mask": input_mask, "token_type_ids": token_type_ids, "labels": token_labels}
        result = model(input_ids, **inputs)
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.seq_length, self.vocab_size))

    def create_and_check_electra_for_token_classification(
        self, config, input_ids, token_type_ids, input_mask, sequence_labels, token_labels, *_
    ):
        config.num_labels = self.num_labels
        model = EfficientElectraForTokenClassification(config).eval()
        inputs = {"attention_mask": input_mask, "token_type_ids": token_type_ids, "labels": token_labels}
        result = model(input_ids, **inputs)
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.seq_length, self.num_labels))

    def create_and_check_electra_for_pretraining(self, config, input_ids, token_type_ids, input_mask, *rest):
        fake_token_labels = rest[-1]
        config.num_labels = self.num_labels
        model = EfficientElectraForPreTraining(config).eval()
        inputs = {"attention_mask": input_mask, "token_type_ids": token_type_ids, "labels": fake_token_labels}
        result = model(input_ids, **inputs)
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.seq_length))

    def create_and_check_electra_for_sequence_classification(
        self, config, input_ids, token_type_ids, input_mask, sequence_labels, *_
    ):
        config.num_labels = self.num_labels
        model = EfficientElectraForSequenceClassification(config).eval()
        inputs = {"attention_mask": input_mask, "token_type_ids": token_type_ids, "labels": sequence_labels}
        result = model(input_ids, **inputs)
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.num_labels))

    def create_and_check_electra_for_question_answering(
        self, config, input_ids, token_type_ids, input_mask, sequence_labels, *_
    ):
        model = EfficientElectraForQuestionAnswering(config).eval()
        result = model(
            input_ids, attention_mask=input_mask, token_type_ids=token_type_ids,
            start_positions=sequence_labels, end_positions=sequence_labels,
        )  # fmt: skip
        self.parent.assertEqual(result.start_logits.shape, (self.batch_size, self.seq_length))
        self.parent.assertEqual(result.end_logits.shape, (self.batch_size, self.seq_length))

    def create_and_check_electra_for_multiple_choice(
        self, config, input_ids, token_type_ids, input_mask, sequence_labels, token_labels, choice_labels, _
    ):
        config.num_choices = self.num_choices
        model = EfficientElectraForMultipleChoice(config).eval()

        def per_choice(tensor):
            return tensor.unsqueeze(1).expand(-1, self.num_choices, -1).contiguous()

        result = model(
            per_choice(input_ids), attention_mask=per_choice(input_mask),
            token_type_ids=per_choice(token_type_ids), labels=choice_labels,
        )  # fmt: skip
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.num_choices))

    def prepare_config_and_inputs_for_common(self):
        config, input_ids, token_type_ids, input_mask, *_ = self.prepare_config_and_inputs()
        inputs = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": input_mask}
        return config, inputs


class ElectraModelTests:
    """transformers' ElectraModelTest: the classes and the family's own tests (less
    test_model_from_pretrained, which downloads google/electra-small-generator)."""

    all_model_classes = (
        EfficientElectraModel,
        EfficientElectraForPreTraining,
        EfficientElectraForMaskedLM,
        EfficientElectraForCausalLM,
        EfficientElectraForMultipleChoice,
        EfficientElectraForTokenClassification,
        EfficientElectraForSequenceClassification,
        EfficientElectraForQuestionAnswering,
    )

    def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
        """The mixin's inputs, and the discriminator's (b, n) labels for the pretraining class, as
        transformers' ELECTRA tests add them."""
        mixin = UPSTREAM.modeling  # its MODEL_FOR_*_MAPPING_NAMES hold our registered classes too
        inputs = mixin.ModelTesterMixin._prepare_for_class(self, inputs_dict, model_class, return_labels)
        pretraining = mixin.get_values(mixin.MODEL_FOR_PRETRAINING_MAPPING_NAMES)
        if return_labels and model_class.__name__ in pretraining:
            tester = self.model_tester
            inputs["labels"] = torch.zeros(tester.batch_size, tester.seq_length, dtype=torch.long)
        return inputs

    def test_electra_model(self):
        self.model_tester.create_and_check_electra_model(*self.model_tester.prepare_config_and_inputs())

    def test_electra_model_as_decoder(self):
        inputs = self.model_tester.prepare_config_and_inputs_for_decoder()
        self.model_tester.create_and_check_electra_model_as_decoder(*inputs)

    def test_for_masked_lm(self):
        self.model_tester.create_and_check_electra_for_masked_lm(
            *self.model_tester.prepare_config_and_inputs()
        )

    def test_for_token_classification(self):
        inputs = self.model_tester.prepare_config_and_inputs()
        self.model_tester.create_and_check_electra_for_token_classification(*inputs)

    def test_for_pre_training(self):
        inputs = self.model_tester.prepare_config_and_inputs()
        self.model_tester.create_and_check_electra_for_pretraining(*inputs)

    def test_for_sequence_classification(self):
        inputs = self.model_tester.prepare_config_and_inputs()
        self.model_tester.create_and_check_electra_for_sequence_classification(*inputs)

    def test_for_question_answering(self):
        inputs = self.model_tester.prepare_config_and_inputs()
        self.model_tester.create_and_check_electra_for_question_answering(*inputs)

    def test_for_multiple_choice(self):
        inputs = self.model_tester.prepare_config_and_inputs()
        self.model_tester.create_and_check_electra_for_multiple_choice(*inputs)

    def test_for_causal_lm(self):
        inputs = self.model_tester.prepare_config_and_inputs_for_decoder()
        self.model_tester.create_and_check_electra_for_causal_lm(*inputs)


globals().update(
    family_test_classes("electra", ElectraModelTests, ElectraTester, EfficientElectraConfig, hidden_size=32)
)
