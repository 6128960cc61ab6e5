"""Extractive question answering around EfficientBertForQuestionAnswering: windows over a context, span
decoding, and the ``question-answering`` pipeline.

A question and its context are encoded as ``[CLS] question [SEP] context [SEP]``; a context longer than the
window is cut into windows of ``max_length`` tokens that overlap by ``doc_stride`` tokens
(:func:`encode_windows`). A model scores every token as the answer's start and as its end; an answer is the
best-scoring span of context tokens at most ``max_answer_length`` long (:func:`span_candidates`), and the
``[CLS]`` token's score stands for "no answer" (SQuAD 2.0).

transformers 5 removed its ``question-answering`` pipeline; :class:`QuestionAnsweringPipeline` takes the
name back (``import hf_efficient`` registers it), for our models and for transformers' own extractive QA
models alike. Its windows default to the model's whole position table (as far as the tokenizer's
``model_max_length`` allows), so a long-context model (Longformer or BigBird attention, 4,096 positions)
reads a 3,000-token document in one forward where a 512-token BERT reads it in strided windows.

Shapes: w = windows, n = tokens per window.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import Pipeline, PreTrainedTokenizerBase

from ...errors import InputError


@dataclass(frozen=True)
class Span:
    """A candidate answer: its score (the start and end scores summed) and its characters in the context."""

    score: float
    start: int
    end: int  # exclusive

    def answer(self, context: str, probability: bool = False) -> dict:
        """The pipeline's answer: score (exp of a log-probability score with ``probability``), characters,
        text."""
        score = float(np.exp(self.score)) if probability else self.score
        start, end = self.start, self.end
        return {"score": score, "start": start, "end": end, "answer": context[start:end]}


def encode_windows(
    tokenizer: PreTrainedTokenizerBase,
    questions: list[str],
    contexts: list[str],
    max_length: int,
    doc_stride: int,
    padding: bool | str = False,
):
    """Tokenise (question, context) pairs into windows of at most ``max_length`` tokens that overlap by
    ``doc_stride`` tokens of context; only the context is cut (``truncation="only_second"``). Windows are
    padded on the right even by a tokenizer that pads on the left (a causal LM's), so that the answers'
    token positions and the "no answer" token (the first) are the same in every window.

    Returns:
        The tokenizer's encoding with ``overflow_to_sample_mapping`` (the pair of each window) and
        ``offset_mapping``, in which every token outside the context is None (so it is never an answer).

    Raises:
        InputError: ``doc_stride`` / ``max_length`` that leave no room for the context.
    """
    longest_question = max(
        (len(tokenizer(q, add_special_tokens=False)["input_ids"]) for q in questions), default=0
    )
    room = max_length - longest_question - tokenizer.num_special_tokens_to_add(pair=True)
    if room < 1:
        raise InputError(
            f"max_length={max_length} leaves no room for the context after a question of {longest_question} "
            f"tokens: use max_length >= {max_length - room + 1}, or a shorter question."
        )
    if not 0 <= doc_stride < room:
        raise InputError(
            f"doc_stride={doc_stride} must be below the context tokens a window holds ({room} with "
            f"max_length={max_length}): the windows overlap by doc_stride tokens; use doc_stride < {room} "
            "(run_qa.py's default is 128 for 384-token windows)."
        )
    encoded = tokenizer(
        [q.lstrip() for q in questions],  # SQuAD questions may start with spaces that only waste tokens
        contexts,
        truncation="only_second",
        max_length=max_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding=padding,
        padding_side="right",  # [CLS] ("no answer") at 0 and token positions from 0, whatever the tokenizer's
    )
    for window in range(len(encoded["input_ids"])):
        sequence = encoded.sequence_ids(window)
        encoded["offset_mapping"][window] = [
            tuple(offset) if sequence[i] == 1 else None
            for i, offset in enumerate(encoded["offset_mapping"][window])
        ]
    return encoded


def span_candidates(
    start_scores: np.ndarray, end_scores: np.ndarray, offsets: list, n_best: int, max_answer_length: int
) -> list[Span]:
    """The ``n_best`` best spans of one window, best first: every span of context tokens at most
    ``max_answer_length`` tokens long is scored (start score + end score), not only the pairs of the best
    starts and ends, so the best span is never missed.

    Args:
        start_scores, end_scores: (n,) logits, or log-probabilities (a span's score is then its
            log-probability).
        offsets: (n,) the characters ``(start, end)`` of each token in the context, None outside it.
    """
    if max_answer_length < 1 or n_best < 1:
        raise InputError(
            f"max_answer_length={max_answer_length}, n_best_size={n_best}: both must be at least 1 (tokens, "
            "candidates)."
        )
    n = len(offsets)
    in_context = np.array([offset is not None for offset in offsets], dtype=bool)  # (n,)
    ends = np.arange(n)[:, None] + np.arange(min(max_answer_length, n))[None]  # (n, L): span i..ends[i, k]
    inside = ends < n
    ends = np.minimum(ends, n - 1)
    scores = (
        np.asarray(start_scores[:n], dtype=np.float64)[:, None]
        + np.asarray(end_scores, dtype=np.float64)[ends]
    )
    scores = np.where(inside & in_context[:, None] & in_context[ends], scores, -np.inf)  # (n, L)
    best = np.argsort(scores, axis=None, kind="stable")[::-1][:n_best]
    starts, lengths = np.unravel_index(best, scores.shape)
    return [
        Span(float(scores[s, k]), offsets[s][0], offsets[ends[s, k]][1])
        for s, k in zip(starts.tolist(), lengths.tolist(), strict=True)
        if np.isfinite(scores[s, k])
    ]


class QuestionAnsweringPipeline(Pipeline):
    """``pipeline("question-answering")``: the answer to ``question`` in ``context``, a span of it.

    Call it as transformers' v4 pipeline: ``qa(question=..., context=...)``, or with a dict or a list of
    dicts ``{"question", "context"}``. Returns ``{"score", "start", "end", "answer"}`` (the answer's
    characters in the context; the score is the probability of its start times that of its end, each a
    softmax over the window's context tokens and ``[CLS]``), or a list of ``top_k`` of them.

    Options: ``max_seq_len`` (tokens per window; default: the model's ``max_position_embeddings`` capped by
    the tokenizer's ``model_max_length``), ``doc_stride`` (overlap of consecutive windows; default a quarter
    of the window, at most 128), ``max_answer_len`` (15 tokens), ``top_k`` (1), ``handle_impossible_answer``
    (False: an empty answer competes, scored by ``[CLS]``). Every window of a context runs in one forward.
    """

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def __call__(self, question=None, context: str | None = None, **kwargs):
        if isinstance(question, (dict, list)):
            return super().__call__(question, **kwargs)
        if question is None or context is None:
            raise InputError(
                "question-answering needs a question and a context: qa(question='...', context='...'), or "
                "qa({'question': ..., 'context': ...}) / a list of such dicts."
            )
        return super().__call__({"question": question, "context": context}, **kwargs)

    def _sanitize_parameters(
        self,
        max_seq_len=None,
        doc_stride=None,
        max_answer_len=None,
        top_k=None,
        handle_impossible_answer=None,
    ):
        preprocess = {"max_seq_len": max_seq_len, "doc_stride": doc_stride}
        postprocess = {
            "max_answer_len": max_answer_len,
            "top_k": top_k,
            "handle_impossible_answer": handle_impossible_answer,
        }
        return (
            {k: v for k, v in preprocess.items() if v is not None},
            {},
            {k: v for k, v in postprocess.items() if v is not None},
        )

    def default_max_seq_len(self) -> int:
        """The model's whole position table, as far as the tokenizer's ``model_max_length`` allows."""
        return min(self.model.max_input_tokens, self.tokenizer.model_max_length)

    def preprocess(self, inputs: dict, max_seq_len: int | None = None, doc_stride: int | None = None):
        if not isinstance(inputs, dict) or not {"question", "context"} <= set(inputs):
            raise InputError(
                f"question-answering takes {{'question': ..., 'context': ...}}, got {inputs!r:.80}."
            )
        max_seq_len = max_seq_len or self.default_max_seq_len()
        positions = self.model.max_input_tokens  # RoBERTa's two offset rows hold no token
        if max_seq_len > positions:
            raise InputError(
                f"max_seq_len={max_seq_len} exceeds the {positions} tokens of the model's positions "
                f"(max_position_embeddings={self.model.config.max_position_embeddings}): use max_seq_len <= "
                f"{positions}, or extend the model (model.resize_position_embeddings)."
            )
        doc_stride = min(128, max_seq_len // 4) if doc_stride is None else doc_stride
        encoded = encode_windows(
            self.tokenizer,
            [inputs["question"]],
            [inputs["context"]],
            max_seq_len,
            doc_stride,
            padding="longest",
        )
        names = ("input_ids", "attention_mask", "token_type_ids")
        tensors = {name: torch.tensor(encoded[name]) for name in names if name in encoded}
        return {**tensors, "offsets": encoded["offset_mapping"], "context": inputs["context"]}

    def _forward(self, model_inputs: dict) -> dict:
        names = ("input_ids", "attention_mask", "token_type_ids")
        outputs = self.model(**{name: model_inputs[name] for name in names if name in model_inputs})
        return {
            "start_logits": outputs.start_logits, "end_logits": outputs.end_logits,  # (w, n)
            "attention_mask": model_inputs["attention_mask"], "offsets": model_inputs["offsets"],
            "context": model_inputs["context"],
        }  # fmt: skip

    def postprocess(
        self, outputs: dict, max_answer_len: int = 15, top_k: int = 1, handle_impossible_answer=False
    ):
        context, best, null = outputs["context"], {}, float("inf")
        for window, offsets in enumerate(outputs["offsets"]):
            allowed = torch.tensor([offset is not None for offset in offsets])
            allowed[0] = True  # [CLS]: "no answer"
            allowed &= outputs["attention_mask"][window].bool()
            start, end = (
                torch.log_softmax(
                    outputs[name][window].float().masked_fill(~allowed, float("-inf")), -1
                ).numpy()
                for name in ("start_logits", "end_logits")
            )
            null = min(null, float(start[0] + end[0]))  # the window most sure of an answer speaks for all
            for span in span_candidates(start, end, offsets, max(top_k, 20), max_answer_len):
                key = (span.start, span.end)  # overlapping windows find the same span: keep its best score
                best[key] = max(best.get(key, span), span, key=lambda candidate: candidate.score)
        spans = sorted(best.values(), key=lambda span: span.score, reverse=True)
        if handle_impossible_answer:
            spans = sorted([*spans, Span(null, 0, 0)], key=lambda span: span.score, reverse=True)
        answers = [span.answer(context, probability=True) for span in spans[:top_k]]
        if not answers:
            answers = [Span(float("-inf"), 0, 0).answer(context, probability=True)]
        return answers[0] if top_k == 1 else answers


def register_question_answering_pipeline() -> None:
    """``pipeline("question-answering")`` builds :class:`QuestionAnsweringPipeline` (idempotent)."""
    from transformers import AutoModelForQuestionAnswering

    from ...compat import register_pipeline_task

    register_pipeline_task("question-answering", QuestionAnsweringPipeline, AutoModelForQuestionAnswering)
