"""ELECTRA's own maths beside the family checks of tests/models/text/test_families.py (every head of a
checkpoint with embedding_size 16 != hidden_size 32 and hidden_act silu): no projection where the widths are
equal, the multiple-choice head's other sequence summaries, inputs_embeds at the embeddings' width, the
decoder's cross-attention, and the discriminator's loss and labels."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F
from transformers import ElectraForCausalLM, ElectraForMultipleChoice, ElectraModel

from hf_efficient import (
    EfficientElectraConfig,
    EfficientElectraForCausalLM,
    EfficientElectraForMultipleChoice,
    EfficientElectraForPreTraining,
    EfficientElectraModel,
)
from hf_efficient.errors import InputError

from ..helpers import CONFIG_ERRORS
from .families import ELECTRA_SIZES, TEXT_FAMILIES
from .helpers import assert_close_real, batch

ELECTRA = TEXT_FAMILIES["electra"]
CLOSE = dict(atol=1e-5, rtol=1e-5)


def run(model, **inputs):
    with torch.no_grad():
        return model.eval()(**inputs)


def test_no_projection_where_embedding_size_is_hidden_size(tmp_path):
    reference = ELECTRA.checkpoint(ElectraModel, tmp_path, embedding_size=32)
    ours, info = EfficientElectraModel.from_pretrained(tmp_path, output_loading_info=True)
    assert ours.embeddings_project is None and not hasattr(reference, "embeddings_project")
    assert not any(info.values()), info
    ids, mask = batch()
    expected = run(reference, input_ids=ids, attention_mask=mask).last_hidden_state
    assert_close_real(
        run(ours, input_ids=ids, attention_mask=mask).last_hidden_state, expected, mask, **CLOSE
    )


@pytest.mark.parametrize(
    "summary",
    [
        {"summary_type": "last"},
        {"summary_type": "mean", "summary_first_dropout": 0.3, "summary_activation": "tanh"},
        {"summary_type": "cls_index", "summary_use_proj": False, "summary_activation": ""},
    ],
    ids=lambda summary: summary["summary_type"],
)
def test_multiple_choice_summaries_equal_transformers(summary, tmp_path):
    """On unpadded inputs (the summaries other than "first" read padded positions, which transformers fills
    otherwise: the sequence summary's docstring)."""
    reference = ELECTRA.checkpoint(ElectraForMultipleChoice, tmp_path, **summary)
    ours = EfficientElectraForMultipleChoice.from_pretrained(tmp_path)
    ids = batch(b=4, lengths=[20] * 4)[0].reshape(2, 2, 20)
    expected = run(reference, input_ids=ids, labels=torch.tensor([1, 0]))
    got = run(ours, input_ids=ids, labels=torch.tensor([1, 0]))
    torch.testing.assert_close(got.logits, expected.logits, **CLOSE)
    torch.testing.assert_close(got.loss, expected.loss, **CLOSE)


def test_a_summary_transformers_does_not_build_is_refused():
    with pytest.raises(CONFIG_ERRORS, match="summary_type='attn'.*not implemented by transformers"):
        EfficientElectraConfig(summary_type="attn")
    with pytest.raises(CONFIG_ERRORS, match="summary_activation='swish2'"):
        EfficientElectraConfig(summary_activation="swish2")


def test_inputs_embeds_have_the_embeddings_width(tmp_path):
    reference = ELECTRA.checkpoint(ElectraModel, tmp_path)
    ours = EfficientElectraModel.from_pretrained(tmp_path)
    embeds = torch.randn(2, 9, ELECTRA_SIZES["embedding_size"])  # (b, n, E), projected to D inside
    expected = run(reference, inputs_embeds=embeds).last_hidden_state
    torch.testing.assert_close(run(ours, inputs_embeds=embeds).last_hidden_state, expected, **CLOSE)
    with pytest.raises(ValueError, match="inputs_embeds must have embedding_size=16 features"):
        ours(inputs_embeds=torch.randn(2, 9, 32))


def test_decoder_with_cross_attention_equals_transformers(tmp_path):
    fields = {"is_decoder": True, "add_cross_attention": True}
    reference = ELECTRA.checkpoint(ElectraForCausalLM, tmp_path, **fields)
    ours, info = EfficientElectraForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info
    ids, mask = batch()
    states, states_mask = torch.randn(3, 11, 32), batch(n=11, lengths=[11, 8, 5])[1]
    inputs = dict(input_ids=ids, attention_mask=mask, encoder_hidden_states=states)
    inputs["encoder_attention_mask"] = states_mask
    expected, got = run(reference, **inputs, use_cache=False), run(ours, **inputs, use_cache=False)
    assert_close_real(got.logits, expected.logits, mask, **CLOSE)


def discriminator() -> EfficientElectraForPreTraining:
    torch.manual_seed(0)
    config = EfficientElectraConfig(
        **ELECTRA_SIZES, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    return EfficientElectraForPreTraining(config).eval()


def test_discriminator_loss_averages_the_real_tokens_with_a_target():
    model, (ids, mask) = discriminator(), batch()
    labels = torch.randint(0, 2, ids.shape, generator=torch.Generator().manual_seed(1))
    out = model(ids, attention_mask=mask, labels=labels)
    real = mask.bool()
    expected = F.binary_cross_entropy_with_logits(out.logits[real], labels[real].float())
    torch.testing.assert_close(out.loss, expected)
    labels[:, :3] = -100  # no target at the first three tokens
    scored = real.clone()
    scored[:, :3] = False
    expected = F.binary_cross_entropy_with_logits(out.logits[scored], labels[scored].float())
    torch.testing.assert_close(model(ids, attention_mask=mask, labels=labels).loss, expected)
    every = model(ids, labels=labels.clamp(min=0))  # no mask: every token is real, as transformers'
    expected = F.binary_cross_entropy_with_logits(every.logits, labels.clamp(min=0).float())
    torch.testing.assert_close(every.loss, expected)


def test_discriminator_loss_without_any_target_is_zero_not_nan():
    model, (ids, mask) = discriminator(), batch()
    loss = model.train()(ids, attention_mask=mask, labels=torch.full_like(ids, -100)).loss
    assert loss.item() == 0.0
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize(
    "labels, message",
    [
        (
            lambda ids: torch.full_like(ids, 2),
            r"labels hold ids in \[2, 2\].*0 = original token, 1 = replaced",
        ),
        (lambda ids: torch.zeros(ids.shape), "labels must be integer class ids"),
        (lambda ids: torch.zeros_like(ids[:, :5]), r"labels must have shape \(batch, seq\) of the inputs"),
    ],
    ids=["out of range", "floats", "shape"],
)
def test_discriminator_labels_are_checked(labels, message):
    model, (ids, mask) = discriminator(), batch()
    with pytest.raises(InputError, match=message):
        model(ids, attention_mask=mask, labels=labels(ids))
