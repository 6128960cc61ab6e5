"""transformers pipelines (fill-mask, text-classification, token-classification) run EfficientBert models.

A tiny WordPiece tokenizer is written offline into tmp_path; models are tiny and randomly initialised, so the
tests check the pipelines' output structure and that every score is a probability taken from the model's own
logits.
"""

from __future__ import annotations

import pytest
import torch
from transformers import BertTokenizer, pipeline

import hf_efficient  # registers efficient_bert with the Auto classes used by pipeline(model=path)
from hf_efficient import (
    EfficientBertConfig,
    EfficientBertForCausalLM,
    EfficientBertForMaskedLM,
    EfficientBertForSequenceClassification,
    EfficientBertForTokenClassification,
)
from hf_efficient.data import causal_lm_tokenizer

from .helpers import SPECIAL_TOKENS, tiny_causal_config, tiny_config, write_vocab

# One efficient type with no parameters of its own, one with random features, and exact attention.
ATTENTION_TYPES = ["full", "longformer", "performer"]
LABELS = {0: "O", 1: "B-ANIMAL", 2: "I-ANIMAL"}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    vocab_file = write_vocab(tmp_path_factory.mktemp("tokenizer"))
    tok = BertTokenizer(vocab=str(vocab_file))
    assert tok.tokenize("The cats sat") == ["the", "cat", "##s", "sat"]
    assert tok.mask_token_id == SPECIAL_TOKENS.index("[MASK]") and tok.pad_token_id == 0
    return tok


def config(tokenizer, attention_type: str, **overrides) -> EfficientBertConfig:
    """The tiny text config (helpers.tiny_config) sized for the tokenizer's vocabulary."""
    return tiny_config(attention_type, vocab_size=len(tokenizer), **overrides)


def check_fill_mask(fill, model, tokenizer, text: str) -> None:
    """Structure, and scores equal to softmax(logits) at the masked position, over the whole vocabulary."""
    results = fill(text, top_k=len(tokenizer))
    assert len(results) == len(tokenizer)
    for result in results:
        assert set(result) == {"score", "token", "token_str", "sequence"}
        assert "[MASK]" not in result["sequence"]
    assert sum(r["score"] for r in results) == pytest.approx(1.0, abs=1e-4)
    assert [r["score"] for r in results] == sorted((r["score"] for r in results), reverse=True)
    encoded = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        logits = model(**encoded).logits[0]
    position = int((encoded["input_ids"][0] == tokenizer.mask_token_id).nonzero())
    probs = logits[position].softmax(-1)
    for result in results[:5]:
        assert result["score"] == pytest.approx(float(probs[result["token"]]), abs=1e-5)
    top = fill(text)  # default top_k = 5
    assert [r["token"] for r in top] == [r["token"] for r in results[:5]]


@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
def test_fill_mask_pipeline(attention_type, tokenizer):
    model = EfficientBertForMaskedLM(config(tokenizer, attention_type)).eval()
    fill = pipeline("fill-mask", model=model, tokenizer=tokenizer)
    check_fill_mask(fill, model, tokenizer, "the cat sat on the [MASK] and the dog ran under the big tree")


@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
def test_text_classification_pipeline(attention_type, tokenizer):
    model = EfficientBertForSequenceClassification(
        config(tokenizer, attention_type, id2label={0: "negative", 1: "positive"})
    ).eval()
    classify = pipeline("text-classification", model=model, tokenizer=tokenizer)
    texts = ["the film was very good", "the plot was boring and the actor was bad but the story was fun"]
    top = classify(texts)
    assert len(top) == 2
    for result in top:
        assert set(result) == {"label", "score"} and result["label"] in {"negative", "positive"}
        assert 0.5 <= result["score"] <= 1.0  # the top label of two
    everything = classify(texts[0], top_k=None)
    assert sorted(r["label"] for r in everything) == ["negative", "positive"]
    assert sum(r["score"] for r in everything) == pytest.approx(1.0, abs=1e-5)
    with torch.no_grad():
        probs = model(**tokenizer(texts[0], return_tensors="pt")).logits[0].softmax(-1)
    by_label = {r["label"]: r["score"] for r in everything}
    assert by_label["positive"] == pytest.approx(float(probs[1]), abs=1e-5)


@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
def test_token_classification_pipeline(attention_type, tokenizer):
    model = EfficientBertForTokenClassification(config(tokenizer, attention_type, id2label=LABELS)).eval()
    tag = pipeline("token-classification", model=model, tokenizer=tokenizer, ignore_labels=[])
    text = "the big dog ran under the red trees"
    tokens = tokenizer.tokenize(text)
    results = tag(text)
    assert [r["word"] for r in results] == tokens
    assert [r["index"] for r in results] == list(range(1, len(tokens) + 1))  # [CLS] is position 0
    with torch.no_grad():
        probs = model(**tokenizer(text, return_tensors="pt")).logits[0].softmax(-1)  # (n, 3)
    for result in results:
        assert {"entity", "score", "index", "word", "start", "end"} <= set(result)
        assert result["entity"] in LABELS.values()
        best = int(probs[result["index"]].argmax())
        assert result["entity"] == LABELS[best]
        assert result["score"] == pytest.approx(float(probs[result["index"], best]), abs=1e-5)
        assert text[result["start"] : result["end"]] == result["word"].removeprefix("##")
    grouped = tag(text, aggregation_strategy="simple")
    # ignore_labels=[]: every token is in some group, and the groups' spans tile the text's words in order.
    assert "".join(text[g["start"] : g["end"]] for g in grouped).replace(" ", "") == text.replace(" ", "")
    for group in grouped:
        assert {"entity_group", "score", "word", "start", "end"} <= set(group)
        members = [r["score"] for r in results if group["start"] <= r["start"] and r["end"] <= group["end"]]
        assert group["score"] == pytest.approx(sum(members) / len(members), abs=1e-5)  # "simple": the mean


@pytest.mark.parametrize("attention_type", ["full", "performer"])
def test_pipelines_from_saved_folder(attention_type, tokenizer, tmp_path):
    """pipeline(task, model=path) finds our classes through the Auto registration and the saved config."""
    text = "the [MASK] flew over the house"
    mlm = EfficientBertForMaskedLM(config(tokenizer, attention_type)).eval()
    expected = pipeline("fill-mask", model=mlm, tokenizer=tokenizer)(text)
    mlm.save_pretrained(tmp_path / "mlm")
    tokenizer.save_pretrained(tmp_path / "mlm")
    fill = pipeline("fill-mask", model=str(tmp_path / "mlm"))
    assert type(fill.model) is EfficientBertForMaskedLM
    assert fill.model.config.attention_type == attention_type
    check_fill_mask(fill, fill.model, fill.tokenizer, text)
    got = fill(text)
    assert [r["token_str"] for r in got] == [r["token_str"] for r in expected]
    assert [r["score"] for r in got] == pytest.approx([r["score"] for r in expected], abs=1e-6)

    classifier = EfficientBertForSequenceClassification(
        config(tokenizer, attention_type, id2label={0: "negative", 1: "positive"})
    ).eval()
    classifier.save_pretrained(tmp_path / "cls")
    tokenizer.save_pretrained(tmp_path / "cls")
    classify = pipeline("text-classification", model=str(tmp_path / "cls"))
    assert type(classify.model) is EfficientBertForSequenceClassification
    result = classify("a very good movie", top_k=None)
    assert sum(r["score"] for r in result) == pytest.approx(1.0, abs=1e-5)

    tagger = EfficientBertForTokenClassification(config(tokenizer, attention_type, id2label=LABELS)).eval()
    tagger.save_pretrained(tmp_path / "tok")
    tokenizer.save_pretrained(tmp_path / "tok")
    tag = pipeline("token-classification", model=str(tmp_path / "tok"), ignore_labels=[])
    assert type(tag.model) is EfficientBertForTokenClassification
    results = tag("a small bird sat")
    assert [r["word"] for r in results] == ["a", "small", "bird", "sat"]
    assert all(r["entity"] in LABELS.values() for r in results)


@pytest.mark.parametrize("attention_type", hf_efficient.causal_attention_types("text"))
def test_text_generation_pipeline_from_saved_folder(attention_type, tokenizer, tmp_path):
    """pipeline("text-generation", model=path) finds EfficientBertForCausalLM through AutoModelForCausalLM;
    its text is the greedy continuation generate() gives (the prompt tokenised without [CLS] / [SEP], as the
    pipeline does with the causal LM's tokenizer), with and without the prompt, and several prompts at once
    (padded on the left)."""
    model = EfficientBertForCausalLM(tiny_causal_config(attention_type, vocab_size=len(tokenizer))).eval()
    model.save_pretrained(tmp_path)
    tokenizer = causal_lm_tokenizer(tokenizer)  # no [CLS] / [SEP] around prompts (pretrain_clm.py saves this)
    tokenizer.save_pretrained(tmp_path)
    generator = pipeline("text-generation", model=str(tmp_path))
    assert type(generator.model) is EfficientBertForCausalLM
    prompt = "the cat sat on the"
    encoded = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
    tokens = model.generate(**encoded, max_new_tokens=6, do_sample=False, pad_token_id=0)
    continuation = tokenizer.decode(tokens[0, encoded["input_ids"].shape[1] :], skip_special_tokens=True)
    full = generator(prompt, max_new_tokens=6, do_sample=False)
    assert len(full) == 1 and full[0]["generated_text"].startswith(prompt)
    assert full[0]["generated_text"][len(prompt) :].strip() == continuation
    new = generator(prompt, max_new_tokens=6, do_sample=False, return_full_text=False)
    assert new[0]["generated_text"].strip() == continuation
    several = generator([prompt, "a dog"], max_new_tokens=4, do_sample=False, batch_size=2)
    assert len(several) == 2 and all(len(result) == 1 for result in several)
    assert several[0][0]["generated_text"].startswith(prompt)
