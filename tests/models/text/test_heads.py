"""BERT's multiple-choice, pretraining and next-sentence heads: parity with transformers' heads, their
checkpoints under other attention types, losses, label checks and the Auto classes.

Tiny models only (helpers.py); a few attention types, not all (the encoder under every head is the one
tests/models/text/test_modeling.py checks for every type).
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F
from transformers import (
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForNextSentencePrediction,
    AutoModelForPreTraining,
    BertConfig,
    BertForMultipleChoice,
    BertForNextSentencePrediction,
    BertForPreTraining,
)
from transformers.pipelines import SUPPORTED_TASKS

from hf_efficient import (
    EfficientBertForMaskedLM,
    EfficientBertForMultipleChoice,
    EfficientBertForNextSentencePrediction,
    EfficientBertForPreTraining,
    EfficientBertForSequenceClassification,
)

from ...attention.helpers import small_config
from ..helpers import assert_grads_finite, check_export_matches
from .helpers import TINY_BERT, VOCAB, assert_close_real, batch, tiny_config
from .test_modeling import _randomise_zero_init

NUM_CHOICES = 3
HEADS = {
    BertForMultipleChoice: EfficientBertForMultipleChoice,
    BertForPreTraining: EfficientBertForPreTraining,
    BertForNextSentencePrediction: EfficientBertForNextSentencePrediction,
}


def head_inputs(model_class) -> tuple[dict, torch.Tensor]:
    """The inputs and labels of a head, and the (rows, n) mask of its sequences: 3 sentence pairs with
    padding (segment B from token 10), or 2 examples of 3 choices each for the multiple-choice head."""
    ids, mask = batch(b=6, n=20, lengths=(20, 13, 7, 16, 20, 9))
    token_types = (torch.arange(20) >= 10).long().expand(6, -1)
    if model_class is EfficientBertForMultipleChoice:
        inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": token_types}
        inputs = {name: tensor.reshape(2, NUM_CHOICES, 20) for name, tensor in inputs.items()}
        return {**inputs, "labels": torch.tensor([2, 0])}, mask
    ids, mask, token_types = ids[:3], mask[:3], token_types[:3]
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": token_types}
    if model_class is EfficientBertForNextSentencePrediction:
        return {**inputs, "labels": torch.tensor([0, 1, 1])}, mask
    unmasked = torch.rand(ids.shape, generator=torch.Generator().manual_seed(2)) < 0.6
    mlm_labels = ids.masked_fill(unmasked | (mask == 0), -100)
    mlm_labels[:, 0] = ids[:, 0]  # a target in every row
    return {**inputs, "labels": mlm_labels, "next_sentence_label": torch.tensor([1, 0, 1])}, mask


@pytest.mark.parametrize("ref_class", list(HEADS))
def test_parity_with_transformers_heads(ref_class, tmp_path):
    """A transformers checkpoint of the head loads with no missing or unexpected key; with full attention
    the logits and the loss equal transformers' to 1e-5."""
    our_class = HEADS[ref_class]
    ref = ref_class(BertConfig(**TINY_BERT)).eval()
    _randomise_zero_init(ref)
    ref.save_pretrained(tmp_path)
    ours, info = our_class.from_pretrained(tmp_path, attention_type="full", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    inputs, mask = head_inputs(our_class)
    with torch.no_grad():
        expected, got = ref(**inputs), ours.eval()(**inputs)
    assert set(got.keys()) == set(expected.keys())
    close = dict(atol=1e-5, rtol=1e-5)
    for field in expected.keys():
        if field == "prediction_logits":  # per token: transformers' padded positions are meaningless
            assert_close_real(got[field], expected[field], mask, **close)
        else:
            torch.testing.assert_close(got[field], expected[field], **close, msg=field)
    assert expected.loss is not None


@pytest.mark.parametrize("attention_type", ["linear", "linformer"])
@pytest.mark.parametrize("ref_class", list(HEADS))
def test_head_checkpoint_loads_with_another_attention(ref_class, attention_type, tmp_path):
    """Every weight of transformers' head loads under another attention type: only the attention's own
    parameters are new; the head trains (finite loss, a gradient for every parameter)."""
    ref = ref_class(BertConfig(**TINY_BERT)).eval()
    ref.save_pretrained(tmp_path)
    ours, info = HEADS[ref_class].from_pretrained(
        tmp_path,
        attention_type=attention_type,
        attention_config=small_config(attention_type),
        output_loading_info=True,
    )
    assert ours.config.attention_type == attention_type
    assert all(".attention.self.core." in key for key in info["missing_keys"]), info["missing_keys"]
    assert not info["unexpected_keys"] and not info["mismatched_keys"], info
    reference = dict(ref.named_parameters())
    for name, param in ours.named_parameters():
        if ".core." not in name:
            torch.testing.assert_close(param, reference[name], atol=0, rtol=0, msg=name)
    inputs, _ = head_inputs(HEADS[ref_class])
    out = ours.train()(**inputs)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert_grads_finite(ours)


@pytest.mark.parametrize("attention_type", ["full", "longformer", "performer"])
def test_multiple_choice_scores_each_choice_alone(attention_type):
    """Each logit is the score of its choice encoded as a sequence of its own (choices do not see each
    other, padding of one choice leaves the others alone), by ids or by (b, c, n, D) embeddings; the loss is
    the cross-entropy over the choices."""
    model = EfficientBertForMultipleChoice(tiny_config(attention_type)).eval()
    inputs, mask = head_inputs(EfficientBertForMultipleChoice)
    out = model(**inputs)
    assert out.logits.shape == (2, NUM_CHOICES)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, inputs["labels"]))
    with torch.no_grad():
        for example in range(2):
            for choice in range(NUM_CHOICES):
                length = int(mask.reshape(2, NUM_CHOICES, 20)[example, choice].sum())
                alone = {
                    name: inputs[name][example, choice, :length][None]
                    for name in ("input_ids", "token_type_ids")
                }
                pooled = model.bert(**alone).pooler_output
                score = model.classifier(pooled)[0, 0]
                torch.testing.assert_close(out.logits[example, choice], score, atol=1e-5, rtol=1e-5)
    flipped = {name: inputs[name].flip(1) for name in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        torch.testing.assert_close(model(**flipped).logits, out.logits.flip(1), atol=1e-5, rtol=1e-5)
        embeds = model.bert.embeddings.word_embeddings(inputs["input_ids"])  # (2, 3, 20, D)
        by_embeds = model(**{**inputs, "input_ids": None, "inputs_embeds": embeds})
        torch.testing.assert_close(by_embeds.logits, out.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention_type", ["full", "bigbird"])
def test_pretraining_loss_is_mlm_plus_nsp_and_the_decoder_is_tied(attention_type):
    """loss = masked-LM cross-entropy (over the masked positions) + next-sentence cross-entropy; one label
    alone gives its own loss; the MLM decoder is the word embedding matrix."""
    model = EfficientBertForPreTraining(tiny_config(attention_type)).eval()
    inputs, _ = head_inputs(EfficientBertForPreTraining)
    labels, nsp = inputs.pop("labels"), inputs.pop("next_sentence_label")
    out = model(**inputs, labels=labels, next_sentence_label=nsp)
    assert out.prediction_logits.shape == (3, 20, VOCAB) and out.seq_relationship_logits.shape == (3, 2)
    mlm = F.cross_entropy(out.prediction_logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)
    next_sentence = F.cross_entropy(out.seq_relationship_logits, nsp)
    torch.testing.assert_close(out.loss, mlm + next_sentence)
    torch.testing.assert_close(model(**inputs, labels=labels).loss, mlm)
    torch.testing.assert_close(model(**inputs, next_sentence_label=nsp).loss, next_sentence)
    assert model(**inputs).loss is None
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


def test_next_sentence_prediction_loss():
    model = EfficientBertForNextSentencePrediction(tiny_config("nystromformer")).eval()
    inputs, _ = head_inputs(EfficientBertForNextSentencePrediction)
    out = model(**inputs)
    assert out.logits.shape == (3, 2)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, inputs["labels"]))
    assert model(**{**inputs, "labels": torch.full((3,), -100)}).loss.item() == 0.0


MC, PT = EfficientBertForMultipleChoice, EfficientBertForPreTraining
NSP = EfficientBertForNextSentencePrediction
BAD_INPUTS = [  # (head, what replaces its inputs, the error's words)
    (MC, {"labels": torch.tensor([3, 0])}, r"labels hold ids in \[0, 3\] but num_choices=3"),
    (MC, {"labels": torch.tensor([[2], [0]])}, r"labels must have shape \(batch,\) = \(2,\)"),
    (MC, {"input_ids": torch.ones(2, 20).long()}, r"input_ids must have shape \(batch, num_choices, seq\)"),
    (MC, {"attention_mask": torch.ones(2, 20)}, r"attention_mask must have shape .* = \(2, 3, 20\)"),
    (MC, {"input_ids": None}, r"pass input_ids \(batch, num_choices, seq\) or inputs_embeds"),
    (PT, {"next_sentence_label": torch.tensor([0, 2, 1])}, r"next_sentence_label hold ids in \[0, 2\] but 2"),
    (PT, {"next_sentence_label": torch.tensor([0.0, 1.0, 1.0])}, r"next_sentence_label must be integer"),
    (PT, {"labels": torch.full((3, 20), VOCAB)}, rf"labels hold ids in .* but vocab_size={VOCAB}"),
    (PT, {"labels": torch.zeros(3, 19).long()}, r"labels must have shape \(batch, seq\) .* = \(3, 20\)"),
    (NSP, {"labels": torch.tensor([0, 1, -1])}, r"labels hold ids in \[-1, 1\] but 2 next-sentence classes"),
]


@pytest.mark.parametrize("model_class, bad, message", BAD_INPUTS)
def test_bad_labels_and_inputs_raise_naming_them(model_class, bad, message):
    model = model_class(tiny_config()).eval()
    inputs, _ = head_inputs(model_class)
    with pytest.raises(ValueError, match=message):
        model(**{**inputs, **bad})


@pytest.mark.parametrize(
    "model_class, auto_class",
    [
        (EfficientBertForMultipleChoice, AutoModelForMultipleChoice),
        (EfficientBertForPreTraining, AutoModelForPreTraining),
        (EfficientBertForNextSentencePrediction, AutoModelForNextSentencePrediction),
    ],
)
def test_save_load_identical_through_auto_classes(model_class, auto_class, tmp_path):
    model = model_class(tiny_config("longformer")).eval()
    inputs, _ = head_inputs(model_class)
    with torch.no_grad():
        expected = model(**inputs)
    model.save_pretrained(tmp_path)
    loaded = auto_class.from_pretrained(tmp_path).eval()
    assert type(loaded) is model_class and loaded.config.attention_type == "longformer"
    with torch.no_grad():
        got = loaded(**inputs)
    for field in expected.keys():  # 1e-9 apart: a loaded weight sits at another memory alignment
        torch.testing.assert_close(got[field], expected[field], atol=1e-6, rtol=1e-6, msg=field)


def test_pretraining_checkpoint_opens_as_masked_lm_and_next_sentence_model(tmp_path):
    """The heads share BERT's names: a pretraining checkpoint fills the MLM model and the NSP model whole."""
    pretraining = EfficientBertForPreTraining(tiny_config("performer")).eval()
    pretraining.save_pretrained(tmp_path)
    inputs, _ = head_inputs(EfficientBertForNextSentencePrediction)
    inputs.pop("labels")
    with torch.no_grad():
        expected = pretraining(**inputs)
    for auto_class, field, expected_field in [
        (AutoModelForMaskedLM, "logits", "prediction_logits"),
        (AutoModelForNextSentencePrediction, "logits", "seq_relationship_logits"),
    ]:
        model, info = auto_class.from_pretrained(tmp_path, output_loading_info=True)
        assert not info["missing_keys"], info
        with torch.no_grad():
            got = getattr(model.eval()(**inputs), field)
        torch.testing.assert_close(got, expected[expected_field], atol=0, rtol=0)
    assert isinstance(model, EfficientBertForNextSentencePrediction)
    assert isinstance(AutoModelForMaskedLM.from_pretrained(tmp_path), EfficientBertForMaskedLM)


def test_no_pipeline_task_serves_these_heads():
    """transformers has no pipeline for multiple choice, BERT pretraining, next-sentence prediction or masked
    image modeling: if one appears, it needs a test here."""
    heads = {
        "BertForMultipleChoice", "BertForPreTraining", "BertForNextSentencePrediction",
        "ViTForMaskedImageModeling", "AutoModelForMultipleChoice", "AutoModelForPreTraining",
        "AutoModelForNextSentencePrediction", "AutoModelForMaskedImageModeling",
    }  # fmt: skip
    served = {model.__name__ for task in SUPPORTED_TASKS.values() for model in task.get("pt", ())}
    assert not heads & served


def test_multiple_choice_does_not_export_and_says_how_to_serve_it(tmp_path):
    """The export's text signature is (batch, seq): exporting the multiple-choice head raises with the fix
    (its checkpoint as a one-label sequence classifier), and that fix scores the choices identically."""
    from hf_efficient.export import NotExportableError, export_program

    model = EfficientBertForMultipleChoice(tiny_config("longformer")).eval()
    with pytest.raises(NotExportableError, match=r"\(batch, num_choices, seq\) .* num_labels=1"):
        export_program(model)
    model.save_pretrained(tmp_path)
    scorer, info = EfficientBertForSequenceClassification.from_pretrained(
        tmp_path, num_labels=1, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    inputs, _ = head_inputs(EfficientBertForMultipleChoice)
    flat = {name: inputs[name].reshape(6, 20) for name in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        scores = scorer.eval()(**flat).logits.view(2, NUM_CHOICES)
        torch.testing.assert_close(scores, model(**inputs).logits, atol=1e-6, rtol=1e-6)


@pytest.mark.slow  # torch.export and ONNX Runtime, twice
@pytest.mark.parametrize("model_class", [EfficientBertForPreTraining, EfficientBertForNextSentencePrediction])
def test_pretraining_and_next_sentence_heads_export(model_class, tmp_path):
    """Both exported outputs of the pretraining head (prediction_logits, seq_relationship_logits) and the
    next-sentence logits match the eager model at sizes the export did not trace. The head is what this
    exports: around full attention and one layer (longformer's export is
    tests/test_export.py::test_every_type_exports_and_matches[text-longformer])."""
    check_export_matches(model_class(tiny_config("full", num_hidden_layers=1)), tmp_path)
