"""Root mean squared error of regression predictions (graph regression: solubility, FreeSolv)."""

import evaluate
import numpy as np

from ._inputs import metric_info


class RMSE(evaluate.Metric):
    def _info(self):
        return metric_info("Root of the mean squared difference of predictions and references.", "float64")

    def _compute(self, predictions, references):
        error = np.asarray(predictions) - np.asarray(references)
        return {"rmse": float(np.sqrt((error**2).mean()))}
