"""Where our models follow transformers' BERT / ViT contract that transformers' own common tests check
(tests/upstream): loss keywords of the causal LM, use_cache on an encoder, a causal LM from an encoder
config, sizes checked when the model is built, and config fields set after construction."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM, BertConfig, BertForMaskedLM
from transformers.loss.loss_utils import ForCausalLMLoss
from transformers.utils import logging as transformers_logging

from hf_efficient import (
    EfficientBertConfig,
    EfficientBertForCausalLM,
    EfficientBertForMaskedLM,
    EfficientBertModel,
    EfficientViTConfig,
    EfficientViTMAEForPreTraining,
    EfficientViTModel,
)
from hf_efficient.errors import InputError

from .text.helpers import TINY_BERT, batch, tiny_causal_config, tiny_config
from .vision.helpers import TINY_DECODER, TINY_VIT


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train (fused loss)"])
def test_causal_lm_hands_loss_keywords_to_the_loss(training):
    """shift_labels, num_items_in_batch and ignore_index mean what transformers' ForCausalLMLoss makes of
    them (BertLMHeadModel hands its **kwargs to it), in eval and in the fused training loss alike."""
    model = EfficientBertForCausalLM(
        tiny_causal_config("full", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ).train(training)
    ids, _ = batch(b=2, n=10)
    shift = torch.randint(1, TINY_BERT["vocab_size"], ids.shape)
    shift[0, :3] = 7  # ignored below with ignore_index=7
    with torch.no_grad():
        logits = model.eval()(ids).logits
        model.train(training)
        for kwargs in (
            {},
            {"shift_labels": shift},
            {"num_items_in_batch": torch.tensor(25)},
            {"shift_labels": shift, "ignore_index": 7, "num_items_in_batch": 11},
        ):
            expected = ForCausalLMLoss(logits, ids, TINY_BERT["vocab_size"], **kwargs)
            torch.testing.assert_close(model(ids, labels=ids, **kwargs).loss, expected)
    with pytest.raises(InputError, match=r"unexpected keyword arguments \['label_smoothing'\]"):
        model(ids, labels=ids, label_smoothing=0.1)
    assert model(ids, num_items_in_batch=3).loss is None  # no labels, no loss (a label smoother took them)
    assert EfficientBertForCausalLM.accepts_loss_kwargs  # Trainer passes num_items_in_batch


def test_encoder_ignores_use_cache():
    """use_cache=True on a bidirectional encoder is ignored, as BertModel does without is_decoder."""
    model = EfficientBertModel(tiny_config("full")).eval()
    ids, mask = batch()
    with torch.no_grad():
        cached = model(ids, attention_mask=mask, use_cache=True)
        plain = model(ids, attention_mask=mask)
    assert cached.cache is None
    torch.testing.assert_close(cached.last_hidden_state, plain.last_hidden_state)


def test_causal_lm_builds_from_an_encoder_config(tmp_path, caplog):
    """As BertLMHeadModel(BertConfig()): without is_decoder the causal LM builds and warns once; an encoder
    checkpoint (ours, or transformers' BERT) opens with AutoModelForCausalLM / from_pretrained."""
    transformers_logging.warning_once.cache_clear()  # an earlier test in this process may have warned
    with caplog.at_level(logging.WARNING):
        EfficientBertForCausalLM(tiny_config("full"))
        EfficientBertForCausalLM(tiny_config("full"))
    warnings = [record for record in caplog.records if "add is_decoder=True" in record.getMessage()]
    assert len(warnings) == 1
    EfficientBertForMaskedLM(tiny_config("full")).save_pretrained(tmp_path / "ours")
    assert isinstance(AutoModelForCausalLM.from_pretrained(tmp_path / "ours"), EfficientBertForCausalLM)
    BertForMaskedLM(BertConfig(**TINY_BERT)).save_pretrained(tmp_path / "bert")
    model = EfficientBertForCausalLM.from_pretrained(tmp_path / "bert")
    ids, _ = batch()
    assert model(ids).logits.shape == (*ids.shape, TINY_BERT["vocab_size"])


@pytest.mark.parametrize(
    "build, fields",
    [
        (
            lambda: EfficientBertModel(EfficientBertConfig(hidden_size=37)),
            "hidden_size=37 .* num_attention_heads=12",
        ),
        (
            lambda: EfficientViTModel(EfficientViTConfig(hidden_size=37)),
            "hidden_size=37 .* num_attention_heads=12",
        ),
        (
            lambda: EfficientViTMAEForPreTraining(
                EfficientViTConfig(**TINY_VIT, **{**TINY_DECODER, "decoder_hidden_size": 15})
            ),
            "decoder_hidden_size=15 .* decoder_num_attention_heads=2",
        ),
    ],
    ids=["bert", "vit", "vit-mae decoder"],
)
def test_sizes_are_checked_when_the_model_is_built(build, fields):
    """BertConfig / ViTConfig accept hidden_size=37 with 12 heads: so do ours; the model build refuses it."""
    with pytest.raises(InputError, match=fields + r".*features\. Set"):
        build()


@pytest.mark.parametrize(
    "field, value, message",
    [
        (
            "position_embedding_type",
            "rotary",
            "position_embedding_type='rotary' is not one of BERT's",
        ),
        ("add_cross_attention", True, "add_cross_attention=True needs is_decoder=True"),
    ],
)
def test_fields_set_after_construction_are_checked_when_the_model_is_built(field, value, message):
    """A field set on a config after construction (which skips the config's validators) is refused when a
    model is built from it, not silently ignored."""
    config = tiny_config("full")
    setattr(config, field, value)
    with pytest.raises(Exception, match=message):
        EfficientBertModel(config)
