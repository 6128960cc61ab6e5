"""transformers' RoBERTa model tests on EfficientRoberta and EfficientXLMRoberta: upstream's
RobertaModelTester and RobertaModelTest, through ModelTesterMixin (+ GenerationTesterMixin), once per type of
tests/upstream/common.py's FAMILY_ATTENTION_TYPES.

Upstream's RoBERTa tester is its BERT tester with RoBERTa's classes (the same sizes and checks), keeping the
padding id out of a decoder's ids (RoBERTa's positions skip padding ids); its tests are BERT's less the
next-sentence, pre-training, sequence-classification and decoder-LM ones, plus two of RoBERTa's positions.
transformers has no tester of XLM-RoBERTa's (its tests load the Hub's checkpoints): its classes run
RoBERTa's, in `make test` only (the same model classes under another config: the fast loop runs RoBERTa's).
"""

from __future__ import annotations

import torch

from hf_efficient import (
    EfficientRobertaConfig,
    EfficientRobertaForCausalLM,
    EfficientRobertaForMaskedLM,
    EfficientRobertaForMultipleChoice,
    EfficientRobertaForQuestionAnswering,
    EfficientRobertaForSequenceClassification,
    EfficientRobertaForTokenClassification,
    EfficientRobertaModel,
    EfficientXLMRobertaConfig,
    EfficientXLMRobertaForCausalLM,
    EfficientXLMRobertaForMaskedLM,
    EfficientXLMRobertaForMultipleChoice,
    EfficientXLMRobertaForQuestionAnswering,
    EfficientXLMRobertaForSequenceClassification,
    EfficientXLMRobertaForTokenClassification,
    EfficientXLMRobertaModel,
)

from .common import FAMILY_ATTENTION_TYPES, add_test_classes
from .test_bert import BertModelTester, BertModelTests


class RobertaModelTester(BertModelTester):
    """transformers' RobertaModelTester: BERT's, with RoBERTa's classes."""

    config_class = EfficientRobertaConfig
    model_class = EfficientRobertaModel
    causal_lm_class = EfficientRobertaForCausalLM
    masked_lm_class = EfficientRobertaForMaskedLM
    multiple_choice_class = EfficientRobertaForMultipleChoice
    question_answering_class = EfficientRobertaForQuestionAnswering
    sequence_classification_class = EfficientRobertaForSequenceClassification
    token_classification_class = EfficientRobertaForTokenClassification
    next_sentence_class = pretraining_class = None  # RoBERTa has neither head

    def decoder_ids(self, input_ids):
        # make sure that ids don't start with pad token
        return input_ids * input_ids.ne(self.get_config().pad_token_id).long()

    def prepare_config_and_inputs(self):
        """Upstream's inputs, the padding id kept out of the ids (ours) as a tokenizer does: RoBERTa counts
        positions over the ids that are not padding, and inputs_embeds have no ids to tell, so the mixin's
        test_inputs_embeds_matches_input_ids holds only then (upstream's ids hold one by chance)."""
        config, input_ids, *rest = super().prepare_config_and_inputs()
        return config, self.decoder_ids(input_ids), *rest


class XLMRobertaModelTester(RobertaModelTester):
    config_class = EfficientXLMRobertaConfig
    model_class = EfficientXLMRobertaModel
    causal_lm_class = EfficientXLMRobertaForCausalLM
    masked_lm_class = EfficientXLMRobertaForMaskedLM
    multiple_choice_class = EfficientXLMRobertaForMultipleChoice
    question_answering_class = EfficientXLMRobertaForQuestionAnswering
    sequence_classification_class = EfficientXLMRobertaForSequenceClassification
    token_classification_class = EfficientXLMRobertaForTokenClassification


class RobertaModelTests(BertModelTests):
    """The tests of transformers' RobertaModelTest (beside the mixins'): BERT's that RoBERTa's has, and its
    positions' (fairseq's: counted from ``padding_idx + 1``, padding at ``padding_idx``)."""

    # not in upstream's RobertaModelTest: RoBERTa has no next-sentence or pre-training head
    test_for_next_sequence_prediction = test_for_pretraining = None
    test_for_sequence_classification = test_for_causal_lm_decoder = None

    def test_create_position_ids_respects_padding_index(self):
        """The position ids are masked with the embedding's padding index: the first real position is
        padding_idx + 1 (transformers' regression test of its issue 1761)."""
        config = self.model_tester.prepare_config_and_inputs()[0]
        model = self.model_tester.model_class(config).embeddings
        input_ids = torch.as_tensor([[12, 31, 13, model.padding_idx]])
        expected_positions = torch.as_tensor(
            [
                [
                    0 + model.padding_idx + 1,
                    1 + model.padding_idx + 1,
                    2 + model.padding_idx + 1,
                    model.padding_idx,
                ]
            ]
        )
        position_ids = model.default_position_ids(input_ids, 4, 0, input_ids.device)
        self.assertEqual(position_ids.shape, expected_positions.shape)
        self.assertTrue(torch.all(torch.eq(position_ids, expected_positions)))

    def test_create_position_ids_from_inputs_embeds(self):
        """Without ids (inputs_embeds) every position is real: padding_idx + 1 on."""
        config = self.model_tester.prepare_config_and_inputs()[0]
        embeddings = self.model_tester.model_class(config).embeddings
        expected_single_positions = [embeddings.padding_idx + 1 + i for i in range(4)]
        expected_positions = torch.as_tensor([expected_single_positions])
        position_ids = embeddings.default_position_ids(None, 4, 0, "cpu")
        self.assertEqual(position_ids.shape, expected_positions.shape)
        self.assertTrue(torch.all(torch.eq(position_ids, expected_positions)))


def roberta_classes(tester: type[RobertaModelTester]) -> tuple[type, ...]:
    return (
        tester.causal_lm_class,
        tester.masked_lm_class,
        tester.model_class,
        tester.sequence_classification_class,
        tester.token_classification_class,
        tester.multiple_choice_class,
        tester.question_answering_class,
    )


add_test_classes(
    globals(), "roberta", RobertaModelTester, roberta_classes(RobertaModelTester), tests=(RobertaModelTests,),
    types=FAMILY_ATTENTION_TYPES,
)  # fmt: skip
add_test_classes(
    globals(),
    "xlm-roberta",
    XLMRobertaModelTester,
    roberta_classes(XLMRobertaModelTester),
    tests=(RobertaModelTests,),
    fast=False,
    types=FAMILY_ATTENTION_TYPES,
)
