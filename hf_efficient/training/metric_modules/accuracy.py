"""Accuracy: the fraction of predicted class ids equal to the reference (GLUE's definition)."""

import evaluate

from ._inputs import kept, metric_info


class Accuracy(evaluate.Metric):
    def _info(self):
        return metric_info("Fraction of predictions equal to their reference.", "int64")

    def _compute(self, predictions, references, ignore_index=-100):
        predictions, references = kept(predictions, references, ignore_index)
        return {"accuracy": float((predictions == references).mean())}
