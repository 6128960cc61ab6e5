"""GLUE's metrics computed offline with scikit-learn and scipy (``evaluate.load("glue")`` needs the hub).

The definitions are GLUE's (and ``evaluate``'s glue module): accuracy; F1 of the positive class (id 1) for
binary tasks, macro F1 otherwise; Matthews correlation (its multi-class form, R3, for the ``ax`` diagnostic);
Pearson and Spearman correlation for regression.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
from transformers import EvalPrediction


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    return float((np.asarray(predictions) == np.asarray(labels)).mean())


def f1(predictions: np.ndarray, labels: np.ndarray) -> float:
    from sklearn.metrics import f1_score

    binary = set(np.unique(labels)) | set(np.unique(predictions)) <= {0, 1}
    return float(f1_score(labels, predictions, average="binary" if binary else "macro"))


def matthews_correlation(predictions: np.ndarray, labels: np.ndarray) -> float:
    from sklearn.metrics import matthews_corrcoef

    return float(matthews_corrcoef(labels, predictions))


def pearson(predictions: np.ndarray, labels: np.ndarray) -> float:
    from scipy.stats import pearsonr

    return float(pearsonr(predictions, labels)[0])


def spearmanr(predictions: np.ndarray, labels: np.ndarray) -> float:
    from scipy.stats import spearmanr as spearman

    return float(spearman(predictions, labels)[0])


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": accuracy,
    "f1": f1,
    "matthews_correlation": matthews_correlation,
    "pearson": pearson,
    "spearmanr": spearmanr,
}


def compute_task_metrics(metric_names: Sequence[str], predictions, labels) -> dict[str, float]:
    """The named metrics of class-id (or regression-value) predictions; ``combined_score`` is their mean
    when there are several (as transformers' ``run_glue.py`` reports)."""
    unknown = sorted(set(metric_names) - set(METRICS))
    if unknown:
        raise ValueError(f"Unknown metric(s) {unknown}; available: {', '.join(METRICS)}.")
    predictions, labels = np.asarray(predictions).reshape(-1), np.asarray(labels).reshape(-1)
    results = {name: METRICS[name](predictions, labels) for name in metric_names}
    if len(results) > 1:
        results["combined_score"] = float(np.mean(list(results.values())))
    return results


class _Task(Protocol):
    metrics: tuple[str, ...]

    @property
    def is_regression(self) -> bool: ...


def predictions_from_logits(logits, is_regression: bool) -> np.ndarray:
    """Class ids (argmax) or regression values from a model's logits (b, num_labels)."""
    logits = logits[0] if isinstance(logits, (tuple, list)) else logits
    logits = np.asarray(logits)
    return logits.reshape(-1) if is_regression else logits.argmax(-1)


def build_compute_metrics(task: _Task) -> Callable[[EvalPrediction], dict[str, float]]:
    """A ``compute_metrics`` for ``Trainer``: the task's metrics from an ``EvalPrediction``.

    Args:
        task: anything with ``metrics`` (names) and ``is_regression``, e.g. a
            :class:`hf_efficient.data.TextClassificationTask`.
    """

    def compute_metrics(prediction: EvalPrediction) -> dict[str, float]:
        predicted = predictions_from_logits(prediction.predictions, task.is_regression)
        return compute_task_metrics(task.metrics, predicted, prediction.label_ids)

    return compute_metrics
