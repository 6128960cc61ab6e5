"""Task metrics as ``evaluate`` modules shipped in this package, so they load offline.

``evaluate.load("accuracy")`` (or ``"glue"``) fetches its module from the hub; the modules in
``hf_efficient/training/metric_modules/`` (accuracy, f1, matthews_correlation, pearson, spearmanr, mae, rmse)
load from their path with ``evaluate.load`` and combine with ``evaluate.combine`` like any other. Their
definitions are GLUE's (and ``evaluate``'s glue module): accuracy; F1 of the positive class (id 1) for
binary tasks, macro F1 otherwise; Matthews correlation (its multi-class form, R3, for the ``ax``
diagnostic); Pearson and Spearman correlation for regression; MAE and RMSE for graph regression.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import evaluate
import numpy as np
import torch
from transformers import EvalPrediction

from ..errors import InputError

METRIC_MODULES = Path(__file__).resolve().parent / "metric_modules"
METRICS = tuple(sorted(path.stem for path in METRIC_MODULES.glob("[!_]*.py")))
IGNORE_INDEX = -100  # the label of padding / unlabelled positions in Hugging Face collators


def metric_path(name: str) -> str:
    """The path of the ``evaluate`` module of metric ``name``, for ``evaluate.load(metric_path("f1"))``."""
    if name not in METRICS:
        raise InputError(f"Unknown metric {name!r}; the metrics hf_efficient ships: {', '.join(METRICS)}.")
    return str(METRIC_MODULES / f"{name}.py")


@functools.cache
def load_metric(name: str) -> evaluate.EvaluationModule:
    """``evaluate.load`` of a shipped metric, offline; kept in memory (no cache files), loaded once."""
    return evaluate.load(metric_path(name), keep_in_memory=True)


def combine_metrics(metric_names: Sequence[str]) -> evaluate.CombinedEvaluations:
    """``evaluate.combine`` of the named shipped metrics: one ``compute`` returns all their values."""
    return evaluate.combine([load_metric(name) for name in metric_names])


def compute_task_metrics(metric_names: Sequence[str], predictions, references) -> dict[str, float]:
    """The named metrics of class-id (or regression-value) predictions; ``combined_score`` is their mean
    when there are several (as transformers' ``run_glue.py`` reports)."""
    predictions, references = np.asarray(predictions).reshape(-1), np.asarray(references).reshape(-1)
    results = combine_metrics(metric_names).compute(predictions=predictions, references=references)
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


def masked_lm_predictions(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``preprocess_logits_for_metrics`` of masked language models: the predicted token id of every masked
    position, laid out as ``labels`` (b, n) with -100 elsewhere.

    Keeps (b, n) ids instead of (b, n, V) logits in evaluation, and gives predictions the labels' shape
    when the model scores only the masked positions (``sparse_prediction``: logits (M, V)), so that batches
    and processes gather as the labels do.
    """
    logits = logits[0] if isinstance(logits, (tuple, list)) else logits
    predicted = logits.argmax(-1)  # (b, n), or (M,) for the masked positions only
    if predicted.shape == labels.shape:
        return predicted
    layout = torch.full_like(labels, IGNORE_INDEX)
    layout[labels != IGNORE_INDEX] = predicted  # row-major order, as the model selected them
    return layout


def masked_lm_accuracy(prediction: EvalPrediction) -> dict[str, float]:
    """``compute_metrics`` of masked language models: accuracy over the masked positions (labels != -100),
    from the ids of :func:`masked_lm_predictions` (transformers' ``run_mlm.py`` reports the same)."""
    predictions = prediction.predictions
    predictions = predictions[0] if isinstance(predictions, tuple) else predictions
    references = np.asarray(prediction.label_ids).reshape(-1)
    return load_metric("accuracy").compute(
        predictions=np.asarray(predictions).reshape(-1), references=references
    )
