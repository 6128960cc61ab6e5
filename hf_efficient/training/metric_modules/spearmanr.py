"""Spearman rank correlation of predicted and reference values (STS-B's second metric), computed by SciPy
(tied values share their mean rank)."""

import evaluate
from scipy.stats import spearmanr

from ._inputs import metric_info


class Spearmanr(evaluate.Metric):
    def _info(self):
        return metric_info("Spearman rank correlation of predictions and references.", "float64")

    def _compute(self, predictions, references):
        return {"spearmanr": float(spearmanr(predictions, references)[0])}
