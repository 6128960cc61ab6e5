"""GLUE metrics computed offline, against values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from transformers import EvalPrediction

from hf_efficient.data import get_task
from hf_efficient.training import build_compute_metrics, compute_task_metrics
from hf_efficient.training.metrics import accuracy, f1, matthews_correlation, pearson, spearmanr

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
    with pytest.raises(ValueError, match="Unknown metric"):
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
