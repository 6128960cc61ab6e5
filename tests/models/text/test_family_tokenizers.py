"""Each text family with its own tokenizer as users have it (RoBERTa's byte-level BPE, XLM-R's Unigram,
ModernBERT's BPE without token_type_ids, ELECTRA's and DistilBERT's WordPiece), trained here and saved beside
a tiny checkpoint: our model loaded from it with an efficient type, saved, and read by transformers'
pipelines; question answering's windows and answers with RoBERTa's ``</s></s>`` pairs, no token types and a
tokenizer that pads on the left."""

from __future__ import annotations

import pytest
import torch
from transformers import pipeline

from hf_efficient.models.families import task_of
from hf_efficient.models.text.question_answering import encode_windows

from .families import TEXT_FAMILIES, train_family_tokenizer

SENTENCES = [
    "a gripping , funny film with a great cast",
    "two hours i will not get back , and a story that goes nowhere",
    "the director knows how to move a camera and how to hold a scene",
    "an honest , warm and very funny look at a family",
    "the plot is thin but the actors give it their all",
    "it is too long , too loud and not funny at all",
] * 4
CONTEXT = "the film was shot in paris . the director is french and the cast is great ."
TASKS = {  # pipeline task -> the Auto class of its head
    "fill-mask": "AutoModelForMaskedLM",
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "feature-extraction": "AutoModel",
}
CASES = [(name, task) for name in TEXT_FAMILIES for task in TASKS]


def saved_efficient(family, task: str, folder):
    """transformers' tiny head of ``task`` with the family's tokenizer, loaded into ours with Longformer
    attention (every family's positions allow it) and saved with the tokenizer in ``folder / "ours"``."""
    upstream = next(cls for cls in family.heads if task_of(family.ours(cls)).__name__ == TASKS[task])
    tokenizer = family.saved_with_tokenizer(upstream, folder / "upstream", SENTENCES)
    window = {"attention_window": 8}
    model = family.ours(upstream).from_pretrained(
        folder / "upstream", attention_type="longformer", attention_config=window
    )
    model.save_pretrained(folder / "ours")
    tokenizer.save_pretrained(folder / "ours")
    return tokenizer, model


@pytest.mark.parametrize("name, task", CASES, ids=[f"{name}-{task}" for name, task in CASES])
def test_pipelines_read_each_family_with_its_tokenizer(name, task, tmp_path):
    family = TEXT_FAMILIES[name]
    tokenizer, model = saved_efficient(family, task, tmp_path)
    assert ("token_type_ids" in tokenizer("a film")) == family.token_types
    run = pipeline(task, model=str(tmp_path / "ours"), device="cpu")
    assert type(run.model) is type(model)
    if task == "fill-mask":
        predictions = run(f"a funny {tokenizer.mask_token} with a great cast", top_k=3)
        assert len(predictions) == 3 and all(p["token_str"] for p in predictions)
    elif task == "text-classification":
        assert run("a gripping , funny film")[0]["label"] in model.config.label2id
    elif task == "token-classification":
        entities = run("the cast is great")
        assert entities and all(e["word"] and e["entity"] in model.config.label2id for e in entities)
    elif task == "question-answering":
        answer = run(question="where was it shot ?", context=CONTEXT)
        assert answer["answer"] and answer["answer"] == CONTEXT[answer["start"] : answer["end"]]
        run.tokenizer.padding_side = "left"  # a tokenizer that pads on the left answers the same
        assert run(question="where was it shot ?", context=CONTEXT) == answer
    else:
        features = torch.tensor(run("a gripping , funny film"))
        assert features.shape[0] == 1 and features.shape[2] == model.config.hidden_size


@pytest.mark.parametrize("name", list(TEXT_FAMILIES))
def test_question_answering_windows_cover_only_the_context(name):
    """Every window's offsets are the context's characters and None elsewhere (the question, RoBERTa's
    ``</s></s>``, padding), padded on the right even by a tokenizer that pads on the left; overlapping windows
    cover the whole context."""
    family = TEXT_FAMILIES[name]

    tokenizer = train_family_tokenizer(family.tokenizer, SENTENCES)
    tokenizer.padding_side = "left"
    context = " ".join([CONTEXT] * 3)
    encoded = encode_windows(
        tokenizer, ["where ?"], [context], max_length=32, doc_stride=8, padding="max_length"
    )
    covered, specials = set(), set(tokenizer.all_special_ids) - {tokenizer.unk_token_id}  # unseen words: unk
    for window, offsets in enumerate(encoded["offset_mapping"]):
        ids, mask = encoded["input_ids"][window], encoded["attention_mask"][window]
        assert ids[0] == tokenizer.cls_token_id and mask[0] == 1  # padding after the tokens, [CLS] first
        assert ("token_type_ids" in encoded) == family.token_types
        for token, offset in zip(ids, offsets, strict=True):
            if offset is None:
                continue
            assert token not in specials
            covered.update(range(*offset))
    assert {i for i, char in enumerate(context) if char != " "} <= covered
