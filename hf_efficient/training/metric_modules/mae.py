"""Mean absolute error of regression predictions (graph regression: solubility, FreeSolv)."""

import evaluate
import numpy as np

from ._inputs import metric_info


class MAE(evaluate.Metric):
    def _info(self):
        return metric_info("Mean absolute difference of predictions and references.", "float64")

    def _compute(self, predictions, references):
        return {"mae": float(np.abs(np.asarray(predictions) - np.asarray(references)).mean())}
