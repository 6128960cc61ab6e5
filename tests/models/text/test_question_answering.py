"""EfficientBertForQuestionAnswering: parity with transformers' BertForQuestionAnswering (weights, logits,
loss), a long-context type loading the same checkpoint, the Auto classes and remote code, label checks, and
pipeline("question-answering") reading a 3,000-token context in one forward."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import (
    AutoModelForQuestionAnswering,
    AutoTokenizer,
    BertConfig,
    BertForQuestionAnswering,
    pipeline,
)

import hf_efficient
from hf_efficient import EfficientBertForQuestionAnswering
from hf_efficient.data import load_movie_reviews
from hf_efficient.hub import export_remote_code
from hf_efficient.models.text.question_answering import QuestionAnsweringPipeline

from ..helpers import assert_grads_finite
from .helpers import LENGTHS, MINILM, TINY_BERT, assert_close_real, batch, tiny_config

TEXT_TYPES = hf_efficient.list_attention_types("text")


@pytest.fixture(scope="module")
def bert_checkpoint(tmp_path_factory):
    """A tiny transformers BertForQuestionAnswering, saved, with non-zero biases."""
    folder = tmp_path_factory.mktemp("bert_qa")
    ref = BertForQuestionAnswering(BertConfig(**TINY_BERT)).eval()
    with torch.no_grad():
        for name, param in ref.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                param.add_(0.1 * torch.randn_like(param))
    ref.save_pretrained(folder)
    return folder, ref


def test_bert_question_answering_checkpoint_loads_and_matches(bert_checkpoint):
    folder, ref = bert_checkpoint
    ours, info = EfficientBertForQuestionAnswering.from_pretrained(
        folder, attention_type="full", output_loading_info=True
    )
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert ours.qa_outputs.weight.shape == (2, TINY_BERT["hidden_size"]) and ours.bert.pooler is None
    ours.eval()
    ids, mask = batch()
    types = (torch.arange(20) >= 8).long().expand(3, -1)
    with torch.no_grad():
        expected, got = (m(ids, attention_mask=mask, token_type_ids=types) for m in (ref, ours))
    for field in ("start_logits", "end_logits"):
        assert_close_real(got[field], expected[field], mask, atol=1e-5, rtol=1e-5)
    # The loss: without padding (BERT's softmax also covers padded positions, whose logits differ by design),
    # one answer past the input (ignored by both) and positions as (b, 1) columns.
    ids, _ = batch(n=12, lengths=(12, 12, 12))
    labels = dict(
        start_positions=torch.tensor([[3], [40], [0]]), end_positions=torch.tensor([[5], [41], [0]])
    )
    with torch.no_grad():
        expected, got = ref(ids, **labels), ours(ids, **labels)
    torch.testing.assert_close(got.loss, expected.loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.start_logits, expected.start_logits, atol=1e-5, rtol=1e-5)


def test_bert_checkpoint_loads_with_a_long_context_type(bert_checkpoint):
    folder, ref = bert_checkpoint
    config = {"attention_window": 4, "global_token_indices": [0]}
    model, info = EfficientBertForQuestionAnswering.from_pretrained(
        folder, attention_type="longformer", attention_config=config, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    torch.testing.assert_close(model.qa_outputs.weight, ref.qa_outputs.weight)
    ids, mask = batch()
    out = model.eval()(ids, attention_mask=mask)
    assert (
        out.start_logits.shape == out.end_logits.shape == (3, 20) and torch.isfinite(out.start_logits).all()
    )


def test_auto_class_and_remote_code(tmp_path):
    model = EfficientBertForQuestionAnswering(tiny_config("bigbird")).eval()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForQuestionAnswering.from_pretrained(tmp_path).eval()
    assert type(loaded) is EfficientBertForQuestionAnswering
    ids, mask = batch()
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(ids, attention_mask=mask).end_logits, model(ids, attention_mask=mask).end_logits
        )
    export_remote_code(model, tmp_path / "remote")
    auto_map = json.loads((tmp_path / "remote" / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModelForQuestionAnswering"].endswith(".EfficientBertForQuestionAnswering")


def test_loss_ignores_answers_past_the_input_and_checks_the_labels():
    model = EfficientBertForQuestionAnswering(tiny_config()).eval()
    ids, mask = batch()
    out = model(
        ids,
        attention_mask=mask,
        start_positions=torch.tensor([2, 3, 1]),
        end_positions=torch.tensor([4, 3, 2]),
    )
    out.loss.backward()
    assert torch.isfinite(out.loss) and model.qa_outputs.weight.grad.abs().sum() > 0
    past = model(ids, start_positions=torch.tensor([20, 99, 20]), end_positions=torch.tensor([20, 25, 30]))
    assert past.loss.item() == 0.0  # nothing inside the input: no target, 0 rather than NaN
    bad = [
        (
            dict(start_positions=torch.tensor([1.0, 2.0, 3.0]), end_positions=torch.tensor([1, 2, 3])),
            "integer",
        ),
        (dict(start_positions=torch.tensor([1, 2]), end_positions=torch.tensor([1, 2])), r"shape \(batch,\)"),
        (
            dict(start_positions=torch.tensor([1, -100, 3]), end_positions=torch.tensor([1, 2, 3])),
            "holds -100",
        ),
        (dict(start_positions=torch.tensor([1, 2, 3])), "pass both start_positions and end_positions"),
    ]
    for labels, message in bad:
        with pytest.raises(ValueError, match=message):
            model(ids, attention_mask=mask, **labels)


@pytest.mark.parametrize("attention_type", TEXT_TYPES)
def test_every_text_type_padded_rows_and_a_fully_padded_row(attention_type):
    """Each row of a padded batch scores as it does alone; a row of padding only (its answer past the input:
    no target) leaves the loss and every gradient finite."""
    model = EfficientBertForQuestionAnswering(tiny_config(attention_type)).eval()
    ids, mask = batch()
    with torch.no_grad():
        together = model(ids, attention_mask=mask)
        for row, length in enumerate(LENGTHS):
            alone = model(ids[row : row + 1, :length])
            for field in ("start_logits", "end_logits"):
                torch.testing.assert_close(
                    together[field][row, :length], alone[field][0], atol=1e-5, rtol=1e-5
                )
    mask[1] = 0
    out = model(
        ids,
        attention_mask=mask,
        start_positions=torch.tensor([3, 20, 1]),
        end_positions=torch.tensor([5, 20, 1]),
    )
    assert torch.isfinite(out.loss) and torch.isfinite(out.start_logits).all()
    out.loss.backward()
    assert_grads_finite(model)


# ---- the pipeline ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_context() -> str:
    """About 3,000 tokens of IMDB reviews."""
    reviews = load_movie_reviews("imdb").select(range(40))["text"]
    return " ".join(reviews[:10])


def recorded_forwards(model) -> list[tuple[int, int]]:
    """The (windows, tokens) shape of input_ids of every forward of ``model`` from now on."""
    shapes = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    return shapes


def brute_force_answer(
    model, tokenizer, question: str, context: str, max_answer_len: int = 15
) -> tuple[int, int]:
    """The answer's characters by trying every span of context tokens on the full input, in one window."""
    encoded = tokenizer(question, context, return_offsets_mapping=True, return_tensors="pt")
    offsets, sequence = encoded.pop("offset_mapping")[0].tolist(), encoded.sequence_ids(0)
    with torch.no_grad():
        out = model(**encoded)
    allowed = torch.tensor([s == 1 for s in sequence])
    allowed[0] = True
    start, end = (
        torch.log_softmax(x[0].masked_fill(~allowed, -np.inf), -1) for x in (out.start_logits, out.end_logits)
    )
    context_tokens = [i for i, s in enumerate(sequence) if s == 1]
    best = max(
        ((s, e) for s in context_tokens for e in context_tokens if s <= e < s + max_answer_len),
        key=lambda span: float(start[span[0]] + end[span[1]]),
    )
    return offsets[best[0]][0], offsets[best[1]][1]


def test_pipeline_reads_a_long_context_in_one_forward_with_a_long_context_type(long_context):
    tokenizer = AutoTokenizer.from_pretrained(MINILM, model_max_length=4096)
    config = tiny_config(
        "longformer", vocab_size=len(tokenizer), max_position_embeddings=4096,
        attention_config={"attention_window": 16, "global_token_indices": [0]},
    )  # fmt: skip
    model = EfficientBertForQuestionAnswering(config).eval()
    qa = pipeline("question-answering", model=model, tokenizer=tokenizer)
    assert isinstance(qa, QuestionAnsweringPipeline)
    shapes = recorded_forwards(model)
    question = "What did the last reviewer think of the film?"
    context_tokens = len(tokenizer(long_context, add_special_tokens=False)["input_ids"])
    assert 2500 < context_tokens < 4000
    answer = qa(question=question, context=long_context)
    assert len(shapes) == 1 and shapes[0][0] == 1 and shapes[0][1] > context_tokens  # one window: all of it
    assert answer["answer"] == long_context[answer["start"] : answer["end"]] and 0 < answer["score"] <= 1
    expected = brute_force_answer(model, tokenizer, question, long_context)
    assert (answer["start"], answer["end"]) == expected
    shapes.clear()
    # A 512-token reader needs strided windows: all of them in one batch of one forward.
    strided = qa(question=question, context=long_context, max_seq_len=512, doc_stride=128, top_k=2)
    assert len(shapes) == 1 and shapes[0][0] >= context_tokens // 512 + 1 and shapes[0][1] == 512
    assert len(strided) == 2 and all(a["answer"] == long_context[a["start"] : a["end"]] for a in strided)


def test_pipeline_by_path_options_and_errors(bert_checkpoint, tmp_path):
    """pipeline("question-answering", model=folder) loads through AutoModelForQuestionAnswering, ours or
    transformers' BERT; the null answer competes with handle_impossible_answer; bad options are named."""
    tokenizer = AutoTokenizer.from_pretrained(MINILM)
    model = EfficientBertForQuestionAnswering(
        tiny_config(vocab_size=len(tokenizer), max_position_embeddings=512)
    )
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    qa = pipeline("question-answering", model=str(tmp_path))
    assert type(qa.model) is EfficientBertForQuestionAnswering
    context = "The cat sat on the mat while the dog ran around the garden."
    answers = qa(
        {"question": "Where did the cat sit?", "context": context}, top_k=500, handle_impossible_answer=True
    )
    tokens = len(tokenizer(context, add_special_tokens=False)["input_ids"])  # 13, under max_answer_len
    assert len(answers) == tokens * (tokens + 1) // 2 + 1  # every span of the context, and the null answer
    assert sum(a["answer"] == "" for a in answers) == 1
    assert [a["score"] for a in answers] == sorted((a["score"] for a in answers), reverse=True)
    short = qa(question="Where did the cat sit?", context=context, top_k=500, max_answer_len=2)
    assert len(short) == 2 * tokens - 1 and all(len(a["answer"].split()) <= 2 for a in short)
    several = qa(
        [{"question": "Who sat?", "context": context}, {"question": "Who ran?", "context": "A dog ran."}]
    )
    assert len(several) == 2 and several[1]["answer"] in "A dog ran."
    bert = pipeline(
        "question-answering", model=bert_checkpoint[1], tokenizer=AutoTokenizer.from_pretrained(MINILM)
    )
    assert isinstance(bert, QuestionAnsweringPipeline)
    refused = r"max_seq_len=1024 exceeds the 512 tokens of the model's positions \(max_position_embeddings=51"
    with pytest.raises(ValueError, match=refused):
        qa(question="Where?", context=context, max_seq_len=1024)
    with pytest.raises(ValueError, match="doc_stride=500 must be below"):
        qa(question="Where?", context=context, max_seq_len=64, doc_stride=500)
    with pytest.raises(ValueError, match="needs a question and a context"):
        qa(question="Where?")
