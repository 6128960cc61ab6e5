"""SQuAD's answer comparison, shared by the ``squad`` and ``squad_v2`` modules: answers are normalised as the
official evaluation scripts do (lower case, punctuation and the articles a / an / the removed, whitespace
collapsed); exact match is equality of the normalised texts, F1 the overlap of their tokens (as bags); a
question scores the best over its reference answers.
"""

import collections
import re
import string

import datasets
import evaluate

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)

INPUTS = """
Args:
    predictions: one ``{"id", "prediction_text"}`` per question (``squad_v2``: and
        ``no_answer_probability``).
    references: one ``{"id", "answers": {"text": [...], "answer_start": [...]}}`` per question, in any order;
        ``squad_v2``: no answer text means the question has no answer (the right prediction is "").
"""


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces: what SQuAD compares."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def f1(prediction: str, truth: str) -> float:
    """Token F1 of the normalised texts; when either has no token, 1 if both have none, else 0."""
    predicted, true = normalize_answer(prediction).split(), normalize_answer(truth).split()
    if not predicted or not true:
        return float(predicted == true)
    common = sum((collections.Counter(predicted) & collections.Counter(true)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(true)
    return 2 * precision * recall / (precision + recall)


def question_scores(predictions: list[dict], references: list[dict], empty_means_no_answer: bool) -> dict:
    """``{id: (exact, f1, has_answer)}``: each question's best score over its reference answers.

    Raises:
        ValueError: a reference without a prediction, naming the first few ids.
    """
    predicted = {p["id"]: p["prediction_text"] for p in predictions}
    missing = [r["id"] for r in references if r["id"] not in predicted]
    if missing:
        raise ValueError(
            f"No prediction for {len(missing)} question(s) of the references, e.g. {missing[:3]}."
        )
    scores = {}
    for reference in references:
        truths = [t for t in reference["answers"]["text"] if normalize_answer(t)]
        has_answer = bool(truths)
        if not truths:  # SQuAD 2.0: no answer; the right prediction is the empty string
            truths = [""] if empty_means_no_answer else list(reference["answers"]["text"])
        guess = predicted[reference["id"]]
        scores[reference["id"]] = (
            max(exact_match(guess, t) for t in truths),
            max(f1(guess, t) for t in truths),
            has_answer,
        )
    return scores


def squad_info(description: str, with_no_answer_probability: bool) -> evaluate.MetricInfo:
    """The ``MetricInfo`` of both modules: SQuAD-format predictions and references."""
    prediction = {"id": datasets.Value("string"), "prediction_text": datasets.Value("string")}
    if with_no_answer_probability:
        prediction["no_answer_probability"] = datasets.Value("float32")
    answers = {"text": datasets.Value("string"), "answer_start": datasets.Value("int32")}
    reference = {"id": datasets.Value("string"), "answers": datasets.features.Sequence(answers)}
    return evaluate.MetricInfo(
        description=description,
        citation="Rajpurkar et al. 2016 (SQuAD), 2018 (SQuAD 2.0)",
        inputs_description=INPUTS,
        features=datasets.Features({"predictions": prediction, "references": reference}),
    )
