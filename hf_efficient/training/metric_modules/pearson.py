"""Pearson correlation of predicted and reference values (STS-B's first metric), computed by SciPy."""

import evaluate
from scipy.stats import pearsonr

from ._inputs import metric_info


class Pearson(evaluate.Metric):
    def _info(self):
        return metric_info("Pearson correlation of predictions and references.", "float64")

    def _compute(self, predictions, references):
        return {"pearson": float(pearsonr(predictions, references)[0])}
