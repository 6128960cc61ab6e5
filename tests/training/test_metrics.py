"""The metrics as ``evaluate`` modules shipped in the package: loaded offline by path, against values worked
out by hand (the numbers the hand-written metrics gave before), combined for GLUE tasks, graph regression
(MAE / RMSE) and masked-LM accuracy."""

from __future__ import annotations

import math

import evaluate
import numpy as np
import pytest
import torch
from transformers import EvalPrediction

from hf_efficient.data import get_task
from hf_efficient.training import build_compute_metrics, compute_task_metrics
from hf_efficient.training.metrics import (
    METRICS,
    combine_metrics,
    load_metric,
    masked_lm_accuracy,
    masked_lm_predictions,
    metric_path,
)

from ..processes import run_python


def metric(name: str):
    """``compute(predictions, references)`` of the shipped module ``name`` -> its single value."""
    return lambda predictions, references: load_metric(name).compute(
        predictions=predictions, references=references
    )[name]


accuracy, f1, matthews_correlation = metric("accuracy"), metric("f1"), metric("matthews_correlation")
pearson, spearmanr, mae, rmse = metric("pearson"), metric("spearmanr"), metric("mae"), metric("rmse")

# Binary case: TP = 2 (positions 0, 3), TN = 1 (position 1), FP = 1 (position 2), FN = 1 (position 4).
PREDS, LABELS = np.array([1, 0, 1, 1, 0]), np.array([1, 0, 0, 1, 1])


def test_binary_metrics_by_hand():
    assert accuracy(PREDS, LABELS) == pytest.approx(3 / 5)
    assert f1(PREDS, LABELS) == pytest.approx(2 / 3)  # precision = recall = 2/3
    # (TP TN - FP FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (2 - 1) / sqrt(3 * 3 * 2 * 2)
    assert matthews_correlation(PREDS, LABELS) == pytest.approx(1 / 6)


def test_multiclass_matthews_is_r3_and_f1_is_macro():
    labels, preds = np.array([0, 0, 1, 1, 2, 2]), np.array([0, 1, 1, 1, 2, 0])
    # R3 (Gorodkin 2004): (c s - sum_k p_k t_k) / sqrt((s^2 - sum p_k^2)(s^2 - sum t_k^2)), c = 4 correct,
    # s = 6, true counts t = (2, 2, 2), predicted counts p = (2, 3, 1): (24 - 12) / sqrt(22 * 24).
    assert matthews_correlation(preds, labels) == pytest.approx(12 / math.sqrt(22 * 24))
    # per-class F1: class 0: P 1/2 R 1/2 -> 1/2; class 1: P 2/3 R 1 -> 4/5; class 2: P 1 R 1/2 -> 2/3.
    assert f1(preds, labels) == pytest.approx((1 / 2 + 4 / 5 + 2 / 3) / 3)


def test_f1_without_a_positive_example_is_zero_and_silent():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scikit-learn's UndefinedMetricWarning would raise here
        assert f1([0, 0, 0], [0, 0, 0]) == 0.0


def test_correlations_by_hand():
    x, y = np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 4.0])
    # cov = 3 (sum of dx dy), |dx| = sqrt(2), |dy| = sqrt(42 / 9): r = 3 / sqrt(2 * 42 / 9) = 9 / sqrt(84)
    assert pearson(x, y) == pytest.approx(9 / math.sqrt(84))
    assert spearmanr(x, y) == pytest.approx(1.0)  # same ranks
    assert spearmanr(x, y[::-1]) == pytest.approx(-1.0)


def test_task_metrics_and_combined_score():
    results = compute_task_metrics(("f1", "accuracy"), PREDS, LABELS)
    assert results == pytest.approx({"f1": 2 / 3, "accuracy": 3 / 5, "combined_score": (2 / 3 + 3 / 5) / 2})
    assert compute_task_metrics(("accuracy",), PREDS, LABELS) == {"accuracy": pytest.approx(0.6)}
    with pytest.raises(
        ValueError, match=r"Unknown metric 'bleu'; the metrics hf_efficient ships: accuracy, f1"
    ):
        compute_task_metrics(("bleu",), PREDS, LABELS)


def test_compute_metrics_for_trainer():
    logits = np.array([[0.1, 0.9], [2.0, -1.0], [0.0, 0.5], [-1.0, 1.0], [3.0, 0.0]])  # argmax = PREDS
    mrpc = build_compute_metrics(get_task("mrpc"))(EvalPrediction(predictions=(logits,), label_ids=LABELS))
    assert mrpc["accuracy"] == pytest.approx(0.6) and mrpc["f1"] == pytest.approx(2 / 3)
    cola = build_compute_metrics(get_task("cola"))(EvalPrediction(predictions=logits, label_ids=LABELS))
    assert cola == {"matthews_correlation": pytest.approx(1 / 6)}
    scores = np.array([[1.0], [2.0], [3.0]])  # regression: (b, 1) logits are the predictions
    stsb = build_compute_metrics(get_task("stsb"))(EvalPrediction(scores, np.array([1.0, 2.0, 4.0])))
    assert stsb["pearson"] == pytest.approx(9 / math.sqrt(84)) and stsb["spearmanr"] == pytest.approx(1.0)


def test_every_shipped_module_loads_by_path_with_evaluate():
    assert METRICS == (
        *("accuracy", "f1", "mae", "matthews_correlation", "pearson", "rmse", "spearmanr"),
        *("squad", "squad_v2"),
    )
    for name in METRICS:
        module = evaluate.load(metric_path(name), keep_in_memory=True)
        assert isinstance(module, evaluate.Metric) and module.name == name
    combined = evaluate.combine([evaluate.load(metric_path(n)) for n in ("f1", "accuracy")])
    assert combined.compute(predictions=PREDS, references=LABELS) == pytest.approx(
        {"f1": 2 / 3, "accuracy": 0.6}
    )


def test_regression_errors_by_hand():
    predictions, references = np.array([1.0, 2.0, 4.5]), np.array([1.5, 2.0, 2.5])  # errors -0.5, 0, 2
    assert mae(predictions, references) == pytest.approx(2.5 / 3)
    assert rmse(predictions, references) == pytest.approx(math.sqrt(4.25 / 3))
    assert combine_metrics(("mae", "rmse")).compute(predictions=predictions, references=references) == (
        pytest.approx({"mae": 2.5 / 3, "rmse": math.sqrt(4.25 / 3)})
    )


def test_class_metrics_leave_out_ignored_references():
    padded_preds, padded_labels = np.append(PREDS, [1, 0]), np.append(LABELS, [-100, -100])
    assert accuracy(padded_preds, padded_labels) == pytest.approx(3 / 5)
    assert f1(padded_preds, padded_labels) == pytest.approx(2 / 3)


@pytest.mark.parametrize("sparse", [False, True])
def test_masked_lm_accuracy_counts_masked_positions_only(sparse):
    labels = torch.tensor([[-100, 5, -100, 7], [3, -100, -100, -100]])  # 3 masked positions
    logits = torch.zeros(2, 4, 10)
    logits[0, 1, 5] = logits[0, 3, 2] = logits[1, 0, 3] = 1.0  # right, wrong, right
    logits[0, 0, 9] = 1.0  # an unmasked position: never counted
    if sparse:  # sparse_prediction: logits of the masked positions only, (M, V) in row-major order
        logits = logits[labels != -100]
    predicted = masked_lm_predictions(logits, labels)
    assert predicted.shape == labels.shape
    result = masked_lm_accuracy(EvalPrediction(predictions=predicted.numpy(), label_ids=labels.numpy()))
    assert result == {"accuracy": pytest.approx(2 / 3)}


@pytest.mark.slow  # a fresh interpreter
def test_modules_load_offline_in_a_fresh_cache(tmp_path):
    script = """
import sys
from hf_efficient.training.metrics import combine_metrics
result = combine_metrics(("accuracy", "f1")).compute(predictions=[1, 0, 1], references=[1, 1, 1])
assert result == {"accuracy": 2 / 3, "f1": 0.8}, result
"""
    env = {"HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1", "HF_EVALUATE_OFFLINE": "1"}
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # nothing listens there: any hub request would fail
    run_python(script, env=env, cwd=tmp_path)


def test_squad_exact_match_and_f1_by_hand():
    """Answers normalised as SQuAD's script does (case, punctuation, articles); each question scores its best
    reference; SQuAD 2.0 splits the questions with and without an answer, where only "" is right."""
    references = [
        {"id": "q1", "answers": {"text": ["The Cat"], "answer_start": [0]}},
        {"id": "q2", "answers": {"text": ["a big red dog", "dog"], "answer_start": [3, 11]}},
    ]
    predictions = [{"id": "q1", "prediction_text": "cat!"}, {"id": "q2", "prediction_text": "red dog"}]
    # q1: exact after normalisation; q2: "red dog" vs "big red dog": precision 1, recall 2/3, F1 0.8
    assert load_metric("squad").compute(predictions=predictions, references=references) == pytest.approx(
        {"exact_match": 50.0, "f1": 90.0}
    )
    references.append({"id": "q3", "answers": {"text": [], "answer_start": []}})
    predictions = [{**p, "no_answer_probability": 0.0} for p in predictions]
    wrong = [*predictions, {"id": "q3", "prediction_text": "the dog", "no_answer_probability": 0.0}]
    results = load_metric("squad_v2").compute(predictions=wrong, references=references)
    assert results == pytest.approx(
        {"exact": 100 / 3, "f1": 60.0, "total": 3, "HasAns_exact": 50.0, "HasAns_f1": 90.0, "HasAns_total": 2}
        | {"NoAns_exact": 0.0, "NoAns_f1": 0.0, "NoAns_total": 1}
    )
    right = [*predictions, {"id": "q3", "prediction_text": "", "no_answer_probability": 0.0}]
    assert load_metric("squad_v2").compute(predictions=right, references=references)["NoAns_exact"] == 100.0
    with pytest.raises(ValueError, match=r"No prediction for 1 question\(s\) .*, e.g. \['q3'\]"):
        other = [*predictions, {"id": "q9", "prediction_text": "", "no_answer_probability": 0.0}]
        load_metric("squad_v2").compute(predictions=other, references=references)
