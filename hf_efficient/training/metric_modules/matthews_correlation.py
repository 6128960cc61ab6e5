"""Matthews correlation coefficient (CoLA's metric); with more than two classes its multi-class form R3
(Gorodkin 2004), which scores GLUE's diagnostic set. Computed by scikit-learn."""

import evaluate
from sklearn.metrics import matthews_corrcoef

from ._inputs import kept, metric_info


class MatthewsCorrelation(evaluate.Metric):
    def _info(self):
        return metric_info("Matthews correlation (R3 with more than two classes).", "int64")

    def _compute(self, predictions, references, ignore_index=-100):
        predictions, references = kept(predictions, references, ignore_index)
        return {"matthews_correlation": float(matthews_corrcoef(references, predictions))}
